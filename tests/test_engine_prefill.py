"""A long prefill reads its tokens in chunks, and a lone sequence decodes in the buffers its
prefill wrote: both bound how much memory a long turn holds at once, and neither may change a
greedy reply."""

from __future__ import annotations

import pytest

from toolself.models import local
from toolself.models.base import Message
from toolself.models.engine import Request, _Batch, _Sequence, new_cache


@pytest.fixture(scope="module", params=["float32", "mixed"])
def loaded(request):
    m = local.EmbeddedModel.load(dtype=request.param)
    yield m
    m.close()


def long_prompt() -> list[Message]:
    facts = " ".join(f"Fact {i}: the lamp in room {i} is {'red' if i % 3 else 'blue'}." for i in range(40))
    return [Message("system", "Answer from the facts."), Message("user", facts + " Which rooms have a blue lamp?")]


def reply_with_chunk(model: local.EmbeddedModel, chunk: int, above: int = 4 * 64) -> tuple[list[int], list[int]]:
    """The greedy reply, and the token count of each forward pass, with prefills of more than
    `above` tokens read `chunk` tokens at a time (0: at once)."""
    engine = local.EmbeddedModel(model.model, model.tokenizer, cache_entries=0, threads=0,
                                 cache_dtype=model.engine.kv_dtype)
    engine.engine.prefill_chunk, engine.engine.chunked_above = chunk, above
    passes: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: passes.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        reply = engine.complete(long_prompt(), max_tokens=24)
    finally:
        hook.remove()
        engine.close()
    return reply.completion_token_ids, passes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_prefill_read_in_chunks_gives_the_greedy_reply_of_one_read_at_once(loaded):
    whole, whole_passes = reply_with_chunk(loaded, 0)
    chunked, chunked_passes = reply_with_chunk(loaded, 64)
    prompt = len(loaded.prompt_ids(long_prompt()))
    assert whole_passes[0] == prompt > 4 * 64
    prefill = chunked_passes[: len(chunked_passes) - (len(whole_passes) - 1)]  # the decode steps are alike
    assert max(prefill) == 64 and sum(prefill) == prompt
    assert chunked == whole


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_prefill_up_to_the_threshold_is_read_at_once(loaded):
    prompt = len(loaded.prompt_ids(long_prompt()))
    _, passes = reply_with_chunk(loaded, 64, above=prompt)
    assert passes[0] == prompt


def _sequence(prompt: int, max_tokens: int, room: int) -> _Sequence:
    import torch

    cache = new_cache(2, None, torch.float32, room=prompt + room, kv_shape=(3, 4))
    for layer in cache.layers:
        layer.update(torch.randn(1, 3, prompt, 4), torch.randn(1, 3, prompt, 4))
    seq = _Sequence(request=Request(prompt_ids=list(range(prompt)), max_tokens=max_tokens), fed=list(range(prompt)),
                    cached_tokens=0, store_key="s", kv=[(layer.keys, layer.values) for layer in cache.layers])
    seq.buffers = [(layer.kbuf, layer.vbuf) for layer in cache.layers]
    return seq


def test_a_lone_sequence_decodes_in_its_prefills_buffers_rather_than_a_copy():
    seq = _sequence(prompt=6, max_tokens=5, room=5 + 16)
    written = seq.buffers[0][0].untyped_storage().data_ptr()
    keys = seq.kv[1][0].clone()
    batch = _Batch(num_layers=2, max_rows=8)
    batch.join(seq)
    assert batch.layers[0].kbuf.untyped_storage().data_ptr() == written
    assert batch.width == 6 and int(batch.mask[0].sum()) == 6 and seq.buffers is None
    cache, mask = batch.cache_for_step()
    assert mask.shape == (1, 7) and bool((cache.layers[1].keys[:, :, :6] == keys).all())


def test_a_sequence_whose_buffers_cannot_hold_its_reply_is_copied_into_a_batch_that_can():
    seq = _sequence(prompt=6, max_tokens=50, room=4)
    written = seq.buffers[0][0].untyped_storage().data_ptr()
    batch = _Batch(num_layers=2, max_rows=8)
    batch.join(seq)
    assert batch.layers[0].kbuf.untyped_storage().data_ptr() != written
    assert batch.capacity >= 6 + 50
