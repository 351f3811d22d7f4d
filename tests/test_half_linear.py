"""The mixed dtype's linear layers: decoding rows through float16 weights with float32
arithmetic, prefill rows through bfloat16, every layer of a model replaced, and a clear error
where torch lacks the float16 kernel."""

from __future__ import annotations

import pytest
import torch

from toolself.models import half_linear, local
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


def test_the_mixed_dtype_without_the_float16_kernel_names_the_alternatives(monkeypatch):
    monkeypatch.setattr(half_linear, "_quantized_engines", lambda: ["qnnpack"])
    with pytest.raises(ValueError, match="use float32 or bfloat16"):
        local.load_weights(dtype="mixed")


def test_without_bfloat16_kernels_prefill_rows_take_the_float16_product_too():
    layer = _linear(2)
    x = torch.randn(DECODE_ROWS + 1, 96)
    with torch.inference_mode():
        got = HalfLinear(layer, prefill_bf16=False)(x)
        expected = layer(x)
    assert _relative_error(got, expected) < 2e-3


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="x86 only")
def test_auto_means_mixed_where_the_float16_kernel_exists_and_an_unknown_dtype_is_refused(monkeypatch):
    assert local.resolve_dtype("auto") == "mixed"
    monkeypatch.setattr(half_linear, "_quantized_engines", lambda: ["qnnpack"])
    assert local.resolve_dtype("auto") in ("bfloat16", "float32")
    with pytest.raises(ValueError, match="auto, float32, bfloat16 or mixed"):
        local.resolve_dtype("float8")
