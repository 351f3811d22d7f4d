"""A forward pass that runs out of memory (on a GPU: another process took some, or the engine's
arithmetic fell short) first takes back the memory of the caches the engine keeps between
turns, then runs again; only with nothing to give back does it fail its episodes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from toolself.models import local  # noqa: E402
from toolself.models.base import Message, ModelError  # noqa: E402

QUESTION = [Message("user", "Name three colours of the rainbow.")]


@pytest.fixture(scope="module")
def model():
    m = local.EmbeddedModel.load(dtype="float32", threads=0, max_tokens=12)
    yield m
    m.close()


def out_of_memory_at(model: local.EmbeddedModel, call: int):
    """Makes the `call`-th forward pass from now raise CUDA's out-of-memory error half-way, once
    the lower half of the layers wrote their keys and values; returns the hook (to remove) and
    the count of passes begun."""
    passes = {"begun": 0}

    def hook(_module, _args):
        passes["begun"] += 1
        if passes["begun"] == call:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    layers = model.model.model.layers
    return layers[len(layers) // 2].register_forward_pre_hook(hook), passes


@pytest.mark.parametrize("call, where", [(1, "prefill"), (2, "decode step")])
def test_a_pass_out_of_memory_drops_the_kept_caches_and_runs_again_to_the_same_reply(model, call, where):
    expected = model.complete(QUESTION).completion_token_ids
    assert len(model.engine.store) > 0  # the reply's cache, kept for a next turn
    dropped = model.engine.stats["store_dropped_for_memory"]
    hook, passes = out_of_memory_at(model, call)
    try:
        reply = model.complete(QUESTION)
    finally:
        hook.remove()
    assert passes["begun"] > call, f"no {where} ran after the failed one"
    assert reply.completion_token_ids == expected
    assert model.engine.stats["store_dropped_for_memory"] == dropped + 1
    if where == "prefill":
        assert reply.usage.cached_tokens == 0  # the prompt read again, whole: its cache went with the others


def test_a_pass_out_of_memory_with_no_cache_to_give_back_fails_its_request_and_the_engine_serves_on(model):
    model.engine.store.clear()
    hook, _ = out_of_memory_at(model, 1)
    try:
        with pytest.raises(ModelError, match="out of memory"):
            model.complete(QUESTION)
    finally:
        hook.remove()
    assert model.complete(QUESTION).completion_token_ids


def test_a_relayout_out_of_memory_as_an_episode_joins_drops_the_kept_caches_and_joins(model, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from toolself.models import engine

    prompts = [[Message("user", f"Tell me about the year {1900 + i}.")] for i in range(2)]

    def reply(i: int) -> list[int]:
        return model.submit(prompts[i], max_tokens=40).result(timeout=120).completion_ids

    alone = [reply(i) for i in range(2)]  # each leaves its cache in the store
    allocate, failed = engine.kv_block, []

    def kv_block(num_layers, rows, *args):
        if rows > 1 and not failed:  # the batch's fresh buffers as the second episode joins
            failed.append(rows)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return allocate(num_layers, rows, *args)

    monkeypatch.setattr(engine, "kv_block", kv_block)
    dropped = model.engine.stats["store_dropped_for_memory"]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(reply, range(2)))
    assert failed, "the two episodes never decoded together"
    assert together == alone
    assert model.engine.stats["store_dropped_for_memory"] == dropped + 1
