"""A local model is sized from its config.json before it loads: one of a billion parameters or
more works under a served model's budgets and an uncapped grammar, not the embedded model's."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from toolself.models.scale import estimated_parameters, is_large  # noqa: E402
from toolself.models.spec import LARGE_MODEL, SMALL_MODEL, ModelSpec  # noqa: E402
from toolself.train.shapes import SHAPES  # noqa: E402

QWEN3_VOCAB = 151_936


def shape_config(shape: str, vocab_size: int = QWEN3_VOCAB, **changed):
    """A config of `shape`; `changed` given to the config class, so that what it derives (the
    per-layer types from the layer count, say) follows."""
    from transformers import AutoConfig

    kind, dims = SHAPES[shape]
    return AutoConfig.for_model(kind, vocab_size=vocab_size, **{**dims, **changed})


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_estimate_is_within_two_percent_of_the_models_own_count(shape):
    from transformers import AutoModelForCausalLM

    config = shape_config(shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    counted = sum(p.numel() for p in model.parameters())
    assert abs(estimated_parameters(config.to_dict()) - counted) / counted < 0.02


def test_a_mixture_of_experts_counts_every_expert():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3_moe", vocab_size=QWEN3_VOCAB, hidden_size=512, num_hidden_layers=4,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, intermediate_size=1536,
                                  num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    counted = sum(p.numel() for p in model.parameters())
    assert abs(estimated_parameters(config.to_dict()) - counted) / counted < 0.02


@pytest.mark.parametrize("shape, large", [("tiny", False), ("smollm2-135m", False), ("qwen3-0.6b", False),
                                          ("qwen3-8b", True)])
def test_a_billion_parameters_makes_a_model_large(shape, large):
    assert is_large(shape_config(shape).to_dict()) is large


def test_a_config_without_sizes_is_not_large():
    assert not is_large({"model_type": "mystery"}) and not is_large(None)


def write_config(folder, shape: str):
    folder.mkdir(parents=True)
    shape_config(shape).save_pretrained(str(folder))
    return folder


def test_a_large_local_model_works_under_a_served_models_budgets_and_a_small_one_under_the_small_ones(tmp_path):
    large, small = write_config(tmp_path / "qwen3-8b", "qwen3-8b"), write_config(tmp_path / "qwen3-0.6b", "qwen3-0.6b")
    assert ModelSpec.parse(f"local:{large}").defaults == LARGE_MODEL
    assert ModelSpec.parse(f"local:{small}").defaults == SMALL_MODEL
    assert ModelSpec.parse(str(large), directories=True).defaults == LARGE_MODEL  # a CAT student given as a folder


def test_an_adapter_is_sized_by_the_base_it_was_trained_on(tmp_path):
    base = write_config(tmp_path / "qwen3-8b", "qwen3-8b")
    adapter = tmp_path / "rft"
    adapter.mkdir()
    config = {"peft_type": "LORA", "base_model_name_or_path": str(base)}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert ModelSpec.parse(f"local:{adapter}").defaults == LARGE_MODEL


def test_a_large_model_writes_long_replies_with_uncapped_strings_unless_told(tiny, monkeypatch):
    from toolself.models import scale
    from toolself.models.local import DEFAULT_MAX_TOKENS, LARGE_MAX_TOKENS, EmbeddedModel

    small = EmbeddedModel.load(str(tiny), threads=0)
    monkeypatch.setattr(scale, "LARGE_PARAMETERS", 1)  # the tiny model's weights, sized as a large model's
    large = EmbeddedModel.load(str(tiny), threads=0)
    told = EmbeddedModel.load(str(tiny), threads=0, max_tokens=64)
    try:
        assert (small.max_tokens, small.grammars.max_string) == (DEFAULT_MAX_TOKENS, 400)
        assert (large.max_tokens, large.grammars.max_string) == (LARGE_MAX_TOKENS, None)
        assert told.max_tokens == 64
        quoted = '<tool_call>\n{"name": "terminate", "arguments": {"answer": "the \\"Lumen\\" kettle"}}\n</tool_call>'
        terminate = [{"type": "function", "function": {"name": "terminate", "parameters": {
            "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}]
        ids = large.tokenizer(quoted, add_special_tokens=False)["input_ids"]
        matcher = large.grammars.matcher(terminate, None)
        assert all(matcher.accept_token(t) for t in ids)  # an answer with quotes in it
        assert not all(small.grammars.matcher(terminate, None).accept_token(t) for t in ids)
    finally:
        for model in (small, large, told):
            model.close()


@pytest.mark.parametrize("shape", ["tiny", "qwen3-0.6b"])  # Qwen3-0.6B: head_dim 128, not hidden / heads
def test_a_tokens_key_and_value_bytes_are_read_from_the_config_as_the_model_caches_them(shape):
    from transformers import AutoModelForCausalLM

    from toolself.models.memory import kv_bytes_per_token

    config = shape_config(shape, vocab_size=256, num_hidden_layers=2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(torch.arange(5)[None], use_cache=True).past_key_values
    cached = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert kv_bytes_per_token(model, torch.bfloat16) * 5 == cached


def eight_b_on_a_gpu():
    from types import SimpleNamespace

    return SimpleNamespace(config=shape_config("qwen3-8b"), device=torch.device("cuda", 0))


GIB = 2**30


def eight_b_plan(monkeypatch, free_gib: float, total_gib: float):
    """The engine's plan for the Qwen3-8B shape's student on a GPU with `free_gib` free after its
    weights, and the bytes of one whole session (context budget and a reply) of it."""
    from toolself.models.local import LARGE_MAX_TOKENS
    from toolself.models.memory import engine_plan, kv_bytes_per_token

    model = eight_b_on_a_gpu()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * GIB), int(total_gib * GIB)))
    session = (LARGE_MODEL.context_budget + LARGE_MAX_TOKENS) * kv_bytes_per_token(model, torch.bfloat16)
    return engine_plan(model, torch.bfloat16, 8, LARGE_MAX_TOKENS), session


def test_a_large_students_engine_on_an_h200_decodes_eight_whole_sessions_and_keeps_eight_more(monkeypatch):
    from toolself.models.memory import CPU_PREFIX_STORE_BYTES, kv_bytes_per_token

    assert kv_bytes_per_token(eight_b_on_a_gpu(), torch.bfloat16) == 144 * 1024
    plan, session = eight_b_plan(monkeypatch, 120, 141)
    assert CPU_PREFIX_STORE_BYTES < session  # the CPU's bound: not one whole context
    assert (plan.rows, plan.store_bytes, plan.note) == (8, 8 * session, "")  # ~22 GiB of 120 free


def test_on_a_48_gb_gpu_an_8b_student_decodes_as_many_episodes_as_a_batch_and_its_relayout_hold(monkeypatch):
    from toolself.models.memory import CPU_PREFIX_STORE_BYTES, GPU_RESERVE

    plan, session = eight_b_plan(monkeypatch, 32, 48)
    usable = 32 * GIB - int(48 * GIB * GPU_RESERVE)
    assert plan.rows == 4  # eight take 22 GiB, twice that while one joins: more than the 32 GiB left
    assert 2 * 4 * session + plan.store_bytes <= usable < 2 * 5 * session + CPU_PREFIX_STORE_BYTES
    assert "decoding 4 episodes at a time, not 8" in plan.note


def test_on_a_24_gb_gpu_an_8b_student_decodes_one_episode_at_a_time_in_its_own_buffers(monkeypatch):
    from toolself.models.memory import GPU_RESERVE

    plan, session = eight_b_plan(monkeypatch, 8, 24)
    assert plan.rows == 1
    assert plan.store_bytes == 8 * GIB - int(24 * GIB * GPU_RESERVE) - session


def test_a_gpu_without_room_for_one_whole_episode_says_so_and_how_to_get_it(monkeypatch):
    from toolself.models.memory import CPU_PREFIX_STORE_BYTES

    plan, _ = eight_b_plan(monkeypatch, 3, 24)
    assert (plan.rows, plan.store_bytes) == (1, CPU_PREFIX_STORE_BYTES)
    assert "no room for one whole episode" in plan.note
    assert "vLLM" in plan.note and "CUDA_VISIBLE_DEVICES=" in plan.note


def test_memory_torchs_allocator_holds_unused_counts_as_free_for_the_plan(monkeypatch):
    from toolself.models.memory import gpu_memory

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * GIB)  # a trainer's, freed
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 16 * GIB)  # the loaded weights
    assert gpu_memory("cuda") == (34 * GIB, 80 * GIB)


def test_the_engine_decodes_as_many_rows_as_its_plan_allows_and_logs_why(tiny, monkeypatch, caplog):
    from toolself.models.base import Message
    from toolself.models.local import EmbeddedModel
    from toolself.models.memory import EnginePlan

    plan = EnginePlan(2, 64 << 20, "decoding 2 episodes at a time, not 8: (the numbers)")
    monkeypatch.setattr("toolself.models.local.engine_plan", lambda *args: plan)
    with caplog.at_level("WARNING", logger="toolself.models.local"):
        model = EmbeddedModel.load(str(tiny), threads=0, max_tokens=8)
    try:
        assert (model.engine.max_batch, model.engine.store.max_bytes) == (2, 64 << 20)
        assert "decoding 2 episodes at a time" in caplog.text
        futures = [model.submit([Message(role="user", content=f"Count to {i}.")]) for i in range(3)]
        assert all(f.result(timeout=120).completion_ids for f in futures)
        assert model.engine.stats["max_rows"] == 2
    finally:
        model.close()


def test_on_a_cpu_the_engine_keeps_its_batch_and_store_bound_whatever_the_model(tiny):
    from toolself.models.local import EmbeddedModel
    from toolself.models.memory import CPU_PREFIX_STORE_BYTES

    model = EmbeddedModel.load(str(tiny), threads=0)
    try:
        assert (model.engine.max_batch, model.engine.store.max_bytes) == (8, CPU_PREFIX_STORE_BYTES)
    finally:
        model.close()
