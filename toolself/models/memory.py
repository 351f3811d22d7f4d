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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

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
