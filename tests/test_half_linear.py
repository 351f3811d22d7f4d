"""The mixed dtype's linear layers: decoding rows through float16 weights with float32
arithmetic, prefill rows through bfloat16, every layer of a model replaced, and a clear error
where torch lacks the float16 kernel."""

from __future__ import annotations

import pytest
import torch

from toolself.models import half_linear, weights
from toolself.models.half_linear import DECODE_ROWS, HalfLinear, use_half_linears


def _linear(seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    layer = torch.nn.Linear(96, 160)
    layer.weight.data.mul_(0.5)
    return layer


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("rows", [1, 8, DECODE_ROWS])
def test_decode_rows_match_float32_to_float16_rounding(rows):
    layer = _linear()
    x = torch.randn(rows, 1, 96)
    with torch.inference_mode():
        expected = layer(x)
        got = HalfLinear(layer)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert _relative_error(got, expected) < 2e-3


def test_prefill_rows_are_the_bfloat16_product():
    layer = _linear(1)
    x = torch.randn(1, DECODE_ROWS + 1, 96)
    with torch.inference_mode():
        got = HalfLinear(layer, prefill_bf16=True)(x)
        bf16 = torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()).float()
        expected = layer(x)
    assert torch.equal(got, bf16)
    assert _relative_error(got, expected) < 2e-2


def test_every_linear_layer_of_a_model_is_replaced_and_the_logits_barely_move():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    ids = torch.randint(0, 300, (1, 5))
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        assert use_half_linears(model) == linears
        after = model(input_ids=ids).logits
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)  # the input side stays float32
    assert (after - before).abs().max() < 1e-2


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def _storage_bytes(model: torch.nn.Module) -> dict[torch.dtype, int]:
    """Bytes of the distinct storages behind a model's parameters and buffers, per dtype."""
    seen, total = set(), {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total[tensor.dtype] = total.get(tensor.dtype, 0) + storage.nbytes()
    return total


def test_after_replacing_a_model_holds_its_float32_embedding_once_and_one_bfloat16_copy_of_the_rest(monkeypatch):
    monkeypatch.setattr(half_linear, "has_bfloat16_kernels", lambda: True)
    model = _tiny_llama()
    embedding = model.get_input_embeddings().weight
    untied = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and m.weight is not embedding)
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    rotary = sum(b.numel() for b in model.model.rotary_emb.buffers())
    use_half_linears(model)
    held = _storage_bytes(model)
    assert held[torch.float32] == 4 * (embedding.numel() + norms + rotary), "no float32 linear weight is left"
    assert held[torch.bfloat16] == 2 * untied, "the tied head keeps no bfloat16 copy"
    head = model.get_output_embeddings()
    assert head.weight_bf16 is None and head.tied_weight.data_ptr() == embedding.data_ptr()


def test_a_tied_head_computes_prefill_rows_as_the_bfloat16_product_of_the_weight_it_shares():
    layer = _linear(2)
    x = torch.randn(1, DECODE_ROWS + 1, 96)
    with torch.inference_mode():
        tied = HalfLinear(layer, prefill_bf16=True, tied=True)(x)
        copied = HalfLinear(layer, prefill_bf16=True)(x)
    assert torch.equal(tied, copied)


@pytest.mark.parametrize("workers", [1, 3])
def test_each_float32_layer_is_freed_as_soon_as_it_is_replaced(workers):
    import weakref

    model = _tiny_llama()
    first = weakref.ref(model.model.layers[0].self_attn.q_proj.weight)
    alive_at_replacement = []
    use_half_linears(model, on_replaced=lambda: alive_at_replacement.append(first() is not None), workers=workers)
    assert alive_at_replacement[0] is False, "the first layer's float32 weight outlived its replacement"


def test_layers_converted_in_threads_compute_what_layers_converted_one_at_a_time_compute():
    one_at_a_time, in_threads = _tiny_llama(), _tiny_llama()
    assert use_half_linears(one_at_a_time) == use_half_linears(in_threads, workers=3)
    assert not any(isinstance(m, torch.nn.Linear) for m in in_threads.modules())
    ids = torch.randint(0, 300, (1, DECODE_ROWS + 4))
    with torch.inference_mode():
        for prompt in (ids[:, :3], ids):  # decoding rows, then prefill rows
            assert torch.equal(in_threads(input_ids=prompt).logits, one_at_a_time(input_ids=prompt).logits)


def test_the_mixed_dtype_without_the_float16_kernel_names_the_alternatives(monkeypatch):
    monkeypatch.setattr(half_linear, "_quantized_engines", lambda: ["qnnpack"])
    with pytest.raises(ValueError, match="use float32 or bfloat16"):
        weights.load_weights(dtype="mixed")


def test_without_bfloat16_kernels_prefill_rows_take_the_float16_product_too():
    layer = _linear(2)
    x = torch.randn(DECODE_ROWS + 1, 96)
    with torch.inference_mode():
        got = HalfLinear(layer, prefill_bf16=False)(x)
        expected = layer(x)
    assert _relative_error(got, expected) < 2e-3


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="x86 only")
def test_auto_means_mixed_where_the_float16_kernel_exists_and_an_unknown_dtype_is_refused(monkeypatch):
    assert weights.resolve_dtype("auto") == "mixed"
    monkeypatch.setattr(half_linear, "_quantized_engines", lambda: ["qnnpack"])
    assert weights.resolve_dtype("auto") in ("bfloat16", "float32")
    with pytest.raises(ValueError, match="auto, float32, bfloat16 or mixed"):
        weights.resolve_dtype("float8")


def test_the_conversion_benchmark_times_one_thread_against_several(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "mixed_conversion.py"
    done = subprocess.run([sys.executable, str(script), "--shape", "tiny", "--workers", "1,2", "--repeats", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert [len(report["workers"][n]["seconds"]) for n in ("1", "2")] == [2, 2]
    assert report["speedup"]["2 vs 1"] > 0 and report["linear_weights_millions"] > 0
