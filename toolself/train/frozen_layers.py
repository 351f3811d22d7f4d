"""Remembering what the frozen bottom of the model computes, so that later epochs skip it.

With `lora_layers=N` only the top N decoder layers carry adapters. The layers below them have
no trainable weight and no dropout, so for a given sequence their output is the same in every
epoch, and the same for the policy and for KTO's reference (the adapter-disabled model). On a
CPU their forward pass is a large part of a training step once the backward pass stops at the
adapters (docs/notes/2026-12-03-frozen-layer-cache.md), and RFT makes two passes over its data.

`cache_frozen_layers(model)` keys each batch by its token ids (and attention mask), keeps the
bottom block's output the first time, and from then on returns it without running those
layers. The cached tensor is the one the layers produced, so losses and gradients are the
same as without the cache. Memory is bounded (`max_bytes`); past the bound, new sequences
are simply computed. The key is the whole micro-batch, so a later epoch finds it only when the
same sequences meet in the same batch again (one sequence per step, or batches in order);
KTO's reference pass, on the policy's batch of the same step, always does.

The bottom block always runs without autograd: nothing in it or below it trains, so its
activations need not be kept nor its backward pass run. That also makes it safe under gradient
checkpointing. A checkpoint saves what a layer's forward saved for its backward pass and, in
the backward pass, recomputes the layer and requires the same again; transformers up to 5.17
checkpointed a layer's whole call, so the recomputation came back through this cache, found the
batch cached and returned it without saving anything ("A different number of tensors was saved
during the original forward and recomputation ... 32 / 0"). Without autograd the bottom block
saves nothing either time, and nothing of it is recomputed.
"""

from __future__ import annotations

import hashlib
import types
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_BYTES = 4 << 30


@dataclass
class FrozenLayerCache:
    """The bottom block's output per batch of token ids, and how often it was reused."""

    frozen: int
    max_bytes: int = DEFAULT_MAX_BYTES
    outputs: dict[bytes, Any] = field(default_factory=dict)
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    key: bytes | None = None
    replaying: bool = False
    counted: bool = False  # the current batch's hit or miss is counted (a recomputation is not another)

    def stats(self, device: Any = None) -> dict[str, Any]:
        """The run's: each process of a launched run caches the batches of its own shard, so
        batches and lookups are summed over the processes, and memory is the most any one holds.
        A collective (`toolself.train.collective`): every process calls it, or none."""
        from toolself.train.collective import most_over_processes, process_count, summed_over_processes

        batches, hits, misses = summed_over_processes([len(self.outputs), self.hits, self.misses], device)
        return {"frozen_layers": self.frozen, "processes": process_count(), "cached_batches": batches,
                "cached_mb": round(most_over_processes(self.bytes, device) / 2**20, 1),
                "hits": hits, "misses": misses}


def frozen_layer_count(layers) -> int:
    """How many layers from the bottom have no trainable weight."""
    count = 0
    for layer in layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        count += 1
    return count


def _batch_key(kwargs: dict[str, Any], args: tuple) -> bytes | None:
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:  # called with inputs_embeds: nothing stable to key by
        return None
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str(tuple(ids.shape)).encode())
    digest.update(ids.detach().cpu().numpy().tobytes())
    for name in ("attention_mask", "position_ids"):  # position ids mark where packed sequences start
        if kwargs.get(name) is not None:
            digest.update(name.encode())
            digest.update(kwargs[name].detach().cpu().numpy().tobytes())
    return digest.digest()


def cache_frozen_layers(model: Any, max_bytes: int = DEFAULT_MAX_BYTES) -> FrozenLayerCache | None:
    """Give the decoder under `model` (a PEFT wrapper or a transformers model) a cache of its
    frozen bottom layers. None when no layer is frozen (or the embeddings train) or the model
    has dropout."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    layers = decoder.layers
    frozen = frozen_layer_count(layers)
    config = base.config
    if frozen == 0 or any(p.requires_grad for p in base.get_input_embeddings().parameters()):
        return None
    if getattr(config, "attention_dropout", 0.0) or getattr(config, "hidden_dropout", 0.0):
        return None
    cache = FrozenLayerCache(frozen, max_bytes)

    def remember_batch(module, args, kwargs):
        # A KV cache, passed or built from the config's default, needs every layer to run; the
        # trainers ask for none.
        use_cache = kwargs.get("use_cache")
        decoding = (config.use_cache if use_cache is None else use_cache) or kwargs.get("cache") is not None \
            or kwargs.get("past_key_values") is not None
        cache.key = None if decoding else _batch_key(kwargs, args)
        cache.replaying = cache.counted = False

    decoder.register_forward_pre_hook(remember_batch, with_kwargs=True)

    bottom = list(layers)[:frozen]  # the objects, not the slots: a wrapper may later take a slot

    def bottom_layer(layer, original):
        first, last = layer is bottom[0], layer is bottom[-1]

        def forward(self, hidden_states, *args, **kwargs):
            carries_grad = hidden_states.requires_grad and torch.is_grad_enabled()
            if cache.replaying:
                return hidden_states
            if first and cache.key is not None:
                cached = cache.outputs.get(cache.key)
                if not cache.counted:
                    cache.hits, cache.misses = cache.hits + (cached is not None), cache.misses + (cached is None)
                    cache.counted = True
                if cached is not None:
                    cache.replaying = True
                    return _as_input(cached.clone(), carries_grad)
            with torch.no_grad():
                output = original(hidden_states, *args, **kwargs)
            if last:
                _keep(cache, output)
            return _as_input(output, carries_grad)
        return forward

    for layer in bottom:
        layer.forward = types.MethodType(bottom_layer(layer, layer.forward), layer)
    return cache


def _as_input(output, carries_grad: bool):
    """The block's output as a leaf that asks for a gradient when its input did. Gradient
    checkpointing makes the embeddings' output require one (`enable_input_require_grads`) so
    that a reentrant checkpoint of an adapted layer passes gradients on; the leaf keeps that
    contract without a graph through layers that have nothing to train."""
    return output.requires_grad_() if carries_grad else output


def _keep(cache: FrozenLayerCache, output) -> None:
    if cache.key is None or cache.key in cache.outputs:
        return
    size = output.numel() * output.element_size()
    if cache.bytes + size > cache.max_bytes:
        return
    cache.outputs[cache.key] = output.detach().clone()
    cache.bytes += size
