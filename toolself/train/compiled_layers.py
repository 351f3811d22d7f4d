"""Decoder layers under `torch.compile`, for training on a CPU.

An eager CPU training step of the 135M model spends about a third of its time outside the
matrix products and attention: RMS norms, rotary embeddings, SiLU, residual adds and bf16 casts,
each a separate pass over memory. Inductor fuses them into C++ kernels (what that buys:
docs/notes/2026-12-03-compiled-decoder-layers.md).

Each layer's forward is compiled on its own, not the whole model: the trainer's code around the
layers (the compact head, the frozen-layer cache, TRL's losses, PEFT's adapter switch for KTO's
reference) stays eager and free to branch, and with dynamic shapes one compilation serves every
sequence length. The first step pays for compiling (kept on disk for later runs); later steps
and lengths compile nothing new.
"""

from __future__ import annotations

from typing import Any

# A compiled forward is guarded on what differs between its calls: the layer (its index is a
# constant), grad mode (KTO's reference pass runs without gradients) and the adapter switch.
VARIANTS_PER_LAYER = 4


def compiler_missing() -> str | None:
    """Why inductor cannot build CPU kernels here (no C++ compiler), or None when it can."""
    try:
        import torch._inductor.config as inductor
        from torch._inductor.cpp_builder import cpp_compiler_search
    except ImportError as exc:
        return f"torch's inductor is unavailable ({exc})"
    cxx = inductor.cpp.cxx
    try:
        cpp_compiler_search(tuple(cxx) if isinstance(cxx, (list, tuple)) else (cxx,))
    except Exception:
        return "no C++ compiler found (inductor looks for g++, or $CXX); install one (e.g. `apt install g++`)"
    return None


def should_compile(setting: bool | None, on_gpu: bool) -> tuple[bool, str]:
    """Whether to compile, and why: `setting` True / False decides; None (auto) compiles on a
    CPU with a C++ compiler, where the speed-up was measured, and not on a GPU, where it was not."""
    if setting is False:
        return False, "off"
    if setting is None and on_gpu:
        return False, "auto: off on a GPU (not measured there; pass True to try)"
    missing = compiler_missing()
    if missing:
        if setting:
            raise RuntimeError(f"compile_layers=True, but {missing}")
        return False, f"auto: eager, {missing}"
    return True, "on" if setting else "auto: on (CPU with a C++ compiler)"


def compile_decoder_layers(model: Any) -> int:
    """Replace the forward of every decoder layer under `model` (a PEFT wrapper or a
    transformers model) with its compiled version; returns how many. Call it before
    `cache_frozen_layers`, so that the cache wraps, and skips, the compiled layers."""
    import torch
    import torch._dynamo

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = base.get_decoder().layers
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, VARIANTS_PER_LAYER * len(layers))
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit,
                                             VARIANTS_PER_LAYER * len(layers))
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    return len(layers)
