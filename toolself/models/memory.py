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

And how the engine spends a GPU's memory: how many episodes it decodes together, and how much
of the KV caches it keeps between turns (`engine_plan`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass
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


GPU_RESERVE = 0.1  # of a GPU's memory, left to activations, logits and the allocator's fragments


@dataclass(frozen=True)
class EnginePlan:
    """How the engine spends the memory of the device its model is on."""

    rows: int  # episodes decoded together (the engine's batch)
    store_bytes: int  # KV caches kept between turns (`engine.PrefixStore`)
    note: str = ""  # what the user should know: fewer rows than asked, or no room for one whole episode


def gpu_memory(device: Any) -> tuple[int, int]:
    """(what a GPU can still give this process, its total memory) in bytes. What it can give is
    its free memory and the blocks torch's caching allocator holds unused (a model or a trainer
    freed earlier in the process leaves them reserved, and the driver counts them as taken)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total


def batch_peak_bytes(rows: int, session_bytes: int) -> int:
    """The most a batch of `rows` whole sessions takes: a joining episode lays the batch out again
    into fresh buffers, the old ones still held while they are copied; a lone episode decodes in
    its prefill's own buffers."""
    return session_bytes if rows == 1 else 2 * rows * session_bytes


def gpu_plan(per_token: int, max_batch: int, session_tokens: int, free_bytes: int, total_bytes: int) -> EnginePlan:
    """As many of `max_batch` rows as fit, with every row a whole session of `session_tokens`
    (the longest an episode's context and reply reach), in what `free_bytes` leave beyond
    `GPU_RESERVE` of the GPU; the prefix store takes the rest, up to `max_batch` whole sessions
    (an eval at a higher concurrency keeps the waiting episodes' caches while a batch decodes),
    and never less than on a CPU. Chosen by this arithmetic, not yet measured on a GPU."""
    gib = 2**30
    session = session_tokens * per_token
    usable = free_bytes - int(total_bytes * GPU_RESERVE)
    fitting = [n for n in range(1, max_batch + 1) if batch_peak_bytes(n, session) + CPU_PREFIX_STORE_BYTES <= usable]
    rows = max(fitting, default=1)
    store = max(CPU_PREFIX_STORE_BYTES, min(max_batch * session, usable - batch_peak_bytes(rows, session)))
    room = (f"{session / gib:.2f} GiB of KV cache each at the full {session_tokens:,} tokens of a session, twice "
            f"a batch's while an episode joins it, and {max(usable, 0) / gib:.1f} GiB of the GPU free beyond a "
            f"{GPU_RESERVE:.0%} reserve")
    if not fitting:
        note = (f"no room for one whole episode on this GPU ({room}): a long episode will run out of GPU memory; "
                "use a GPU with more free memory, serve the model with vLLM, or run it on the CPU "
                "(CUDA_VISIBLE_DEVICES=)")
    elif rows < max_batch:
        note = f"decoding {rows} episode{'s' if rows > 1 else ''} at a time, not {max_batch}: {room}"
    else:
        note = ""
    return EnginePlan(rows, store, note)


def engine_plan(model: Any, kv_dtype: Any, max_batch: int, reply_tokens: int) -> EnginePlan:
    """The engine's batch and prefix store for `model` (`gpu_plan` on a GPU).

    A turn whose session's cache was dropped reads its whole context again. On a CPU, the
    batch is as asked and the store keeps 512 MiB: seven 3k-token episodes of the default model
    in bfloat16 and three in float32, within a laptop's memory. That bound holds 3,641 tokens of
    a Qwen3-8B student (144 KiB a token in bfloat16), whose contexts run to 16,000: every turn
    of a long episode would read its context again. And eight such episodes decoding together
    take 22 GiB, twice that while one joins: more than a 48 GB card has beside the 8B's weights,
    so there the batch is what fits rather than a failed step."""
    if model.device.type != "cuda":
        return EnginePlan(max_batch, CPU_PREFIX_STORE_BYTES)
    from toolself.models.scale import LARGE_MODEL, SMALL_MODEL, is_large

    budget = (LARGE_MODEL if is_large(model.config.to_dict()) else SMALL_MODEL).context_budget + reply_tokens
    session_tokens = min(int(getattr(model.config, "max_position_embeddings", budget)), budget)
    free, total = gpu_memory(model.device)
    return gpu_plan(kv_bytes_per_token(model, kv_dtype), max_batch, session_tokens, free, total)
