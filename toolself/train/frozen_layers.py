"""Remembering what the frozen bottom of the model computes, so that later epochs skip it.

With `lora_layers=N` only the top N decoder layers carry adapters. The layers below them have
no trainable weight and no dropout, so for a given sequence their output is the same in every
epoch, and the same for the policy and for KTO's reference (the adapter-disabled model). On a
2-core CPU their forward pass is most of a training step once the backward pass stops at the
adapters (18 of 30 layers: ~35% of a 1.5k-token step), and RFT makes two passes over its data.

`cache_frozen_layers(model)` keys each batch by its token ids (and attention mask), keeps the
bottom block's output the first time, and from then on returns it without running those
layers. The cached tensor is the one the layers produced, so losses and gradients are the
same as without the cache. Memory is bounded (`max_bytes`); past the bound, new sequences
are simply computed.
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

    def stats(self) -> dict[str, Any]:
        return {"frozen_layers": self.frozen, "cached_batches": len(self.outputs), "cached_mb": round(self.bytes / 2**20, 1),
                "hits": self.hits, "misses": self.misses}


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
    mask = kwargs.get("attention_mask")
    if mask is not None:
        digest.update(mask.detach().cpu().numpy().tobytes())
    return digest.digest()


def cache_frozen_layers(model: Any, max_bytes: int = DEFAULT_MAX_BYTES) -> FrozenLayerCache | None:
    """Give the decoder under `model` (a PEFT wrapper or a transformers model) a cache of its
    frozen bottom layers. None when no layer is frozen (or the embeddings train) or the model
    has dropout."""
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
        cache.replaying = False

    decoder.register_forward_pre_hook(remember_batch, with_kwargs=True)

    def bottom_layer(original):
        def forward(self, hidden_states, *args, **kwargs):
            if cache.replaying:
                return hidden_states
            if self is layers[0] and cache.key is not None:
                cached = cache.outputs.get(cache.key)
                if cached is not None:
                    cache.hits += 1
                    cache.replaying = True
                    return cached.clone()
                cache.misses += 1
            output = original(hidden_states, *args, **kwargs)
            if self is layers[frozen - 1]:
                _keep(cache, output)
            return output
        return forward

    for layer in list(layers)[:frozen]:
        layer.forward = types.MethodType(bottom_layer(layer.forward), layer)
    return cache


def _keep(cache: FrozenLayerCache, output) -> None:
    if cache.key is None or cache.key in cache.outputs:
        return
    size = output.numel() * output.element_size()
    if cache.bytes + size > cache.max_bytes:
        return
    cache.outputs[cache.key] = output.detach().clone()
    cache.bytes += size
