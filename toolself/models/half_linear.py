"""Linear layers with half-precision weights for CPU inference (the "mixed" dtype).

Why: a decode step of a small model on a CPU is bound by streaming its weights from memory
once per step, and prefill is bound by arithmetic. No one precision suits both here:

- decoding (a few rows at a time) goes through fbgemm's float16 product, which keeps the
  weights in float16 and multiplies in float32: half the bytes of float32 and about twice
  the speed, with products within ~3e-4 (relative) of float32's;
- prefill (many rows) goes through a bfloat16 product, which CPUs with avx512_bf16 or AMX
  compute about twice as fast as float32; its inputs are rounded to bfloat16, so prefill is
  as precise as the "bfloat16" dtype's. On CPUs without bfloat16 kernels prefill takes the
  float16 product too (about float32's speed).

Activations and norms stay in float32, and so do attention and the KV cache except on CPUs
with AMX, where the engine keeps the cache in bfloat16 (`local.kv_dtype`). The float32
weights are dropped as each layer is replaced, so the model takes as much memory as in float32
(a float16 and a bfloat16 copy; fbgemm pads the float16 one to blocks of 512 input features).
An output head tied to the input embedding keeps no bfloat16 copy: the engine only ever asks
it for a few rows of logits, and a larger product casts the float32 embedding it shares.
Measurements: docs/notes/2026-12-03-mixed-dtype.md, docs/notes/2026-12-04-embedded-memory.md.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

# Rows at or below which a product counts as decoding: a batch of decode steps has at most
# the engine's max_batch rows, a prefill has a prompt's worth. Lower, a reused cache's greedy
# replies part from recomputed ones (docs/notes/2026-12-04-batch-jump-forward-spans-not-kept.md).
DECODE_ROWS = 16


def _quantized_engines() -> list[str]:
    return list(torch.backends.quantized.supported_engines)


def available() -> bool:
    """fbgemm, and with it the float16 product, is built into torch on x86 only."""
    return "fbgemm" in _quantized_engines()


def require_available() -> None:
    if not available():
        raise ValueError("the mixed dtype needs fbgemm's float16 product, which this torch build lacks "
                         "(x86 CPUs only); use float32 or bfloat16")


def has_bfloat16_kernels() -> bool:
    """Whether oneDNN has bfloat16 kernels for this CPU (avx512_bf16 or AMX); without them a
    bfloat16 product is emulated, slower than float32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def has_amx() -> bool:
    """Whether this CPU has AMX tiles, as torch's own kernels decide it."""
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


class HalfLinear(torch.nn.Module):
    """An inference-only replacement for `nn.Linear` (no gradients, no training).

    `tied`: the float32 weight is another module's parameter too (an output head tied to the
    input embedding), so it is kept and cast to bfloat16 for each prefill product instead of
    stored a second time."""

    def __init__(self, linear: torch.nn.Linear, prefill_bf16: bool = True, tied: bool = False):
        super().__init__()
        weight = linear.weight.detach().float()
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)
        self.prefill_bf16 = prefill_bf16
        keep_bf16 = prefill_bf16 and not tied
        self.register_buffer("weight_bf16", weight.to(torch.bfloat16) if keep_bf16 else None, persistent=False)
        self.register_buffer("tied_weight", weight if prefill_bf16 and tied else None, persistent=False)
        self.register_buffer("bias_bf16", None if bias is None or not prefill_bf16 else bias.to(torch.bfloat16),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] <= DECODE_ROWS or not self.prefill_bf16:
            out = torch.ops.quantized.linear_dynamic_fp16(rows.float(), self.packed)
        else:
            weight = self.weight_bf16 if self.weight_bf16 is not None else self.tied_weight.to(torch.bfloat16)
            out = torch.nn.functional.linear(rows.to(torch.bfloat16), weight, self.bias_bf16).float()
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"prefill={'bfloat16' if self.prefill_bf16 else 'float16'}")


def use_half_linears(model: torch.nn.Module, on_replaced: Callable[[], None] | None = None,
                     workers: int = 1) -> int:
    """Replace every `nn.Linear` of a float32 model in place; returns how many. The output head
    is replaced too, which unties it from the (float32) input embedding. Only names are held
    while replacing, so each float32 weight is freed as soon as its layer is replaced (unless
    it is tied), and the model holds the float32 and the half copies of at most `workers`
    layers at once. `on_replaced` runs after each layer (`memory.release_freed_memory`, so that
    the allocator returns what the layer freed before the next one allocates).

    `workers`: threads that build the replacements. fbgemm packs a layer's float16 weights on
    one core, outside the GIL, at 40-60M weights a second: 2.2 s of loading the default model,
    and minutes of an 8B one, on one core."""
    require_available()
    prefill_bf16 = has_bfloat16_kernels()
    linears = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    others = {p.data_ptr() for m in model.modules() if not isinstance(m, torch.nn.Linear)
              for p in m.parameters(recurse=False)}

    def half(name: str) -> tuple[torch.nn.Module, str, HalfLinear]:
        parent_name, _, child_name = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, child_name)
        return parent, child_name, HalfLinear(linear, prefill_bf16, tied=linear.weight.data_ptr() in others)

    def replace(made: tuple[torch.nn.Module, str, HalfLinear]) -> None:
        parent, child_name, layer = made
        setattr(parent, child_name, layer)
        if on_replaced is not None:
            on_replaced()

    workers = max(1, workers)
    with ThreadPoolExecutor(workers) as pool:
        ahead: deque = deque()
        for name in linears:
            if len(ahead) == workers:
                replace(ahead.popleft().result())
            ahead.append(pool.submit(half, name))
        while ahead:
            replace(ahead.popleft().result())
    return len(linears)
