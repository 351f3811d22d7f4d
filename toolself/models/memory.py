"""Process-wide memory settings of the embedded model: what a CPU process running it keeps
resident besides the tensors it uses (docs/notes/2026-12-04-embedded-memory.md).

- glibc keeps freed blocks of a few megabytes in holes of its heaps, and a KV cache that grows
  every turn frees blocks a little smaller than the next it needs, so they are rarely reused;
  `release_freed_memory` gives their pages back (`malloc_trim`), after loading and whenever
  the engine's batch drains.
- oneDNN (the bfloat16 products of prefill) and torch's wrapper around it each keep an LRU of
  compiled kernels per product shape, 1024 by default; a prefill's shape is its token count,
  so nearly every prefill adds new ones (~0.75 MB per shape): an eval grew by gigabytes.
  `bound_kernel_caches` caps both.

And how much of the KV caches the engine keeps between turns (`prefix_store_bytes`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

KERNEL_CACHE_CAPACITY = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the pages of freed heap blocks back to the system; a no-op where the C library is
    not glibc. Costs ~15 ms with a loaded model's heaps."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def bound_kernel_caches() -> None:
    """Cap oneDNN's kernel caches (`KERNEL_CACHE_CAPACITY`) unless the environment sets them.
    Both read the variables when they first compile a kernel, so this must run before the
    process's first bfloat16 product; it changes no result, only which kernels are compiled
    again (a prefill's rarely recur)."""
    for name, value in KERNEL_CACHE_CAPACITY.items():
        os.environ.setdefault(name, value)


CPU_PREFIX_STORE_BYTES = 512 << 20


def kv_head_shape(config: Any) -> tuple[int, int]:
    """(key/value heads, head dimension) of a layer's cache: the engine lays its buffers out by
    it, and the prefix store's bound is counted by it."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_bytes_per_token(model: Any, kv_dtype: Any) -> int:
    """The bytes one token's keys and values take in the engine's cache, every layer's."""
    heads, head_dim = kv_head_shape(model.config)
    return 2 * model.config.num_hidden_layers * heads * head_dim * kv_dtype.itemsize


def gpu_store_bytes(per_token: int, sessions: int, session_tokens: int, free_bytes: int) -> int:
    """Room for `sessions` whole sessions of `session_tokens`, within half of what `free_bytes`
    leave once the batch holds as much (the sessions decoding, while the store keeps those
    waiting), and never less than on a CPU."""
    sessions_bytes = sessions * session_tokens * per_token
    return max(CPU_PREFIX_STORE_BYTES, min(sessions_bytes, (free_bytes - sessions_bytes) // 2))


def prefix_store_bytes(model: Any, kv_dtype: Any, sessions: int, reply_tokens: int) -> int:
    """How many bytes of KV caches the engine keeps between turns (`engine.PrefixStore`).

    A turn whose session's cache was dropped reads its whole context again. On a CPU, 512 MiB
    hold seven 3k-token episodes of the default model in bfloat16 and three in float32, within
    a laptop's memory. That bound holds 3,641 tokens of a Qwen3-8B student (144 KiB a token in
    bfloat16), whose contexts run to 16,000: every turn of a long episode would read its
    context again. So on a GPU the bound is what `sessions` episodes (the engine's batch)
    hold at the model's context budget and reply, within half of the memory the loaded weights
    and a full batch of such episodes leave free (an eval at a higher concurrency keeps the
    waiting episodes' caches while a batch decodes; chosen by this arithmetic, not yet measured
    on a GPU)."""
    if model.device.type != "cuda":
        return CPU_PREFIX_STORE_BYTES
    import torch

    from toolself.models.scale import LARGE_MODEL, SMALL_MODEL, is_large

    budget = (LARGE_MODEL if is_large(model.config.to_dict()) else SMALL_MODEL).context_budget + reply_tokens
    session_tokens = min(int(getattr(model.config, "max_position_embeddings", budget)), budget)
    free = torch.cuda.mem_get_info(model.device)[0]
    return gpu_store_bytes(kv_bytes_per_token(model, kv_dtype), sessions, session_tokens, free)
