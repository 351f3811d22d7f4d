"""The batched decoding scheduler behind the embedded model.

Why a scheduler: on CPU a 135M model decoding one sequence is bound by reading its weights
once per token, so decoding eight sequences in one forward pass costs little more than one.
The eval runner and the training collection run many episodes at once, from threads or from
asyncio; here two threads own the model and serve them all:

- the prefill thread computes a new request alone, on top of the longest cached prefix of its
  prompt (a KV cache kept per session and, without sessions, matched by common token prefix),
  a long one `PREFILL_CHUNK` new tokens a forward pass, while the decode thread keeps stepping
  the batch (and, when requests queue up, prefills one itself between two steps); the
  prefilled sequence joins the batch between two decode steps, and one that decodes alone does
  so in the buffer its prefill wrote, sized for its reply;
- the batch keeps every sequence's keys and values in one preallocated buffer, right-aligned
  (left padding masked out) and packed into the first rows, so appending a token never copies
  the cache and a sequence that finishes is replaced by moving one row; the buffer has rows
  for the sequences present (a power of two, at most the batch size), not for a full batch;
- each decode step feeds one token per sequence with its true position, masks the logits of
  constrained sequences with their own xgrammar matcher, and picks the next tokens; text the
  grammar forces after a token (the next key of a JSON object, the rest of an enum value) is
  fed a token a step as if written, or all in one step when a sequence decodes alone;
- a finished sequence's cache goes back to the prefix store (an LRU bounded in entries and in
  bytes) for its next turn; while the sequence is computed its entry is out of the store, so
  an episode's cache is held once.

Memory: docs/notes/2026-12-04-embedded-memory.md.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from toolself.models.memory import CPU_PREFIX_STORE_BYTES, kv_head_shape, release_freed_memory

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of shape [1, heads, tokens, dim]

_RUNNING: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _stop_running_engines() -> None:
    """Stop every engine's threads before the interpreter finalizes. A daemon thread still in a
    torch op then is ended by pthread_exit when it next takes the GIL; the unwinding through
    torch's C++ frames calls std::terminate and the process aborts (status -6, "terminate called
    without an active exception"): what Ctrl-C during a reply did to `toolself run`."""
    for engine in list(_RUNNING):
        engine.close()


@dataclass
class Request:
    """One completion to produce."""

    prompt_ids: list[int]
    max_tokens: int
    matcher: Any | None = None  # xgrammar.GrammarMatcher, or None for free text
    session: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    # Reply tokens the grammar forces at the start (`<tool_call>\n{"name":`), already accepted
    # by the matcher: computed with the prompt instead of one decode step each.
    forced_ids: list[int] = field(default_factory=list)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    # Called from the decode thread with the reply's tokens so far, each time some are added,
    # so that a server can stream them; it must return at once and never raise.
    on_tokens: Callable[[list[int]], None] | None = None


@dataclass
class Result:
    prompt_ids: list[int]
    completion_ids: list[int]
    cached_tokens: int
    finish_reason: str  # stop | length


@dataclass
class _Sequence:
    request: Request
    fed: list[int]  # tokens whose keys and values are cached
    cached_tokens: int
    store_key: str
    generated: list[int] = field(default_factory=list)
    kv: KV | None = None  # while not in the batch
    # The prefill's whole buffers per layer (`kv` are views of their first columns), with room
    # for the reply: a batch this sequence starts decodes in them rather than in a copy.
    buffers: KV | None = None
    generator: torch.Generator | None = None
    finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.request.max_tokens - len(self.generated)

    @property
    def unfed(self) -> list[int]:
        """Generated tokens not in the cache yet: the last one picked, and any forced after it."""
        return self.generated[len(self.fed) - len(self.request.prompt_ids):]


SAMPLE_CANDIDATES = 64  # tokens raced one by one; the rest of the vocabulary races as one


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """A token drawn from softmax(logits / temperature), within the nucleus `top_p`.

    An exponential race (the token with the largest p / E, E ~ Exp(1), wins with probability
    p), as `torch.multinomial` runs it, but among the `SAMPLE_CANDIDATES` likeliest tokens and
    the rest of the vocabulary as one entrant of their total probability (the smallest of
    independent exponentials is exponential at the sum of their rates): exact, without an
    exponential drawn for every token of a 152k vocabulary (benchmarks/sampling.py), and the
    race among the rest runs only when it wins. A race rather than the inverse of the
    cumulative distribution at one uniform draw, because a race's winner changes only where two
    ratios nearly tie: a reply sampled on a reused cache or in a batch, whose logits differ in
    their last bits, stays the one sampled alone. A token of probability zero (masked by a
    grammar) never wins."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    count = min(SAMPLE_CANDIDATES, probs.numel())
    top, index = probs.topk(count)
    total = probs.sum(dtype=torch.float64)
    top, index, total = top.double().cpu(), index.cpu(), total.cpu()  # the race runs by the generator
    rest = (total - top.sum()).clamp_(min=0.0)
    draws = torch.empty(count + 1, dtype=torch.float64).exponential_(generator=generator)
    ratios = torch.cat([top, rest.reshape(1)]) / draws
    winner = int(ratios.argmax())
    if winner == count:
        others = probs.double().cpu().index_fill_(0, index, 0.0)
        if bool(others.any()):
            return int((others / torch.empty_like(others).exponential_(generator=generator)).max(-1).indices)
        winner = int(ratios[:count].argmax())  # the rest's probability was rounding alone
    return int(index[winner])


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], vocab_size: int) -> None:
    """Mask `rows` of `logits` in place to what their grammars allow. The matchers fill
    `bitmask` on the CPU; on a GPU it is copied over (~150 KB for eight rows of Qwen3's
    vocabulary) and applied there by xgrammar's torch implementation, rather than its Triton
    kernel, which compiles at run time, or than copying every row's logits to the CPU."""
    import xgrammar as xgr

    if logits.device.type == "cpu":
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size, indices=rows)
    else:
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=vocab_size, indices=rows,
                                        backend="torch_native")


def kv_bytes(kv: KV) -> int:
    """Bytes a cache keeps allocated: a view holds all of its buffer, counted once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for pair in kv for t in pair}
    return sum(storages.values())


@dataclass
class _Entry:
    ids: np.ndarray
    kv: KV
    nbytes: int


class PrefixStore:
    """Recent KV caches, each with the exact token ids it covers, least recently used dropped
    first beyond `max_entries` or `max_bytes`. Entries are never modified in place (a request
    reads slices and builds its own tensors), so readers need no copy.

    The bound is in bytes because a token's keys and values take 23 KB in bfloat16 and twice
    that in float32 for the default model, and more for a larger one."""

    def __init__(self, max_entries: int = 16, max_bytes: int = CPU_PREFIX_STORE_BYTES):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._counter = 0

    @staticmethod
    def session_key(session: str) -> str:
        return "session:" + session

    def new_key(self) -> str:
        with self._lock:
            self._counter += 1
            return f"auto:{self._counter}"

    def lookup(self, prompt_ids: list[int], session: str | None,
               take: Callable[[str, int, int], bool] | None = None) -> tuple[str | None, int, KV | None]:
        """The entry sharing the longest prefix with the prompt (the session's own on a tie),
        the length usable (at least one prompt token is left to compute the next logits), and
        that prefix of its cache. `take(key, usable, length)` says whether the entry leaves the
        store with the caller, which puts its continuation back under that key when done."""
        if len(prompt_ids) < 2:
            return None, 0, None
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        own = self.session_key(session) if session is not None else None
        best_key, best_len = None, 0
        with self._lock:
            for key, entry in self._entries.items():
                n = min(len(entry.ids), len(prompt) - 1)
                diff = np.flatnonzero(entry.ids[:n] != prompt[:n])
                common = int(diff[0]) if diff.size else n
                if common > best_len or (common == best_len and common > 0 and key == own):
                    best_key, best_len = key, common
            if best_key is None:
                return None, 0, None
            entry = self._entries[best_key]
            if take is not None and take(best_key, best_len, len(entry.ids)):
                del self._entries[best_key]
            else:
                self._entries.move_to_end(best_key)
            kv = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in entry.kv]
        return best_key, best_len, kv

    def put(self, key: str, ids: list[int], kv: KV) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = _Entry(np.asarray(ids, dtype=np.int64), kv, kv_bytes(kv))
            total = self.nbytes
            while self._entries and (len(self._entries) > self.max_entries or total > self.max_bytes):
                _, dropped = self._entries.popitem(last=False)
                total -= dropped.nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held."""
        return sum(e.nbytes for e in self._entries.values())

    def length(self, key: str) -> int:
        with self._lock:
            entry = self._entries.get(key)
            return len(entry.ids) if entry is not None else 0

    def drop(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


ATTENTION = "toolself_sdpa"
# A prefill of more than CHUNKED_ABOVE new tokens reads them PREFILL_CHUNK at a time, on top of
# the cache the earlier ones wrote, as a turn reads its new tokens on top of a reused cache: a
# forward pass's temporaries grow with the tokens it reads (~3k at once held a few hundred
# megabytes). Bfloat16 products round a chunk's rows differently from the whole's, so the
# greedy reply after a chunked prefill can differ (as one after a reused cache can); below the
# threshold, where most turns are, nothing changes (docs/notes/2026-12-04-chunked-prefill.md).
PREFILL_CHUNK = 512
CHUNKED_ABOVE = 2048


def kv_block(num_layers: int, rows: int, heads: int, length: int, dim: int, dtype: torch.dtype,
             device: Any) -> torch.Tensor:
    """Every layer's keys and values for `rows` sequences in one allocation, [layer, key or
    value, row, head, token, dim]. One block rather than a tensor per layer: a block of tens of
    megabytes gets a mapping of its own from glibc and is returned whole when freed, where
    per-layer tensors of a megabyte or two, allocated between a forward pass's temporaries and
    a little larger every turn, left the heap fragmented (docs/notes/2026-12-04-embedded-memory.md)."""
    return torch.empty(num_layers, 2, rows, heads, length, dim, dtype=dtype, device=device)


class _CacheLayer(DynamicLayer):
    """A cache layer that stores keys and values in the engine's cache dtype, whatever the
    weights' (float32 for a bfloat16 model where the CPU has no AMX: see `local.kv_dtype`):
    written into preallocated buffers when it has them, else grown by concatenation."""

    def __init__(self, dtype: torch.dtype, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                 filled: int = 0):
        super().__init__()
        self.kv_dtype = dtype
        self.kbuf, self.vbuf = keys, values
        if keys is not None:
            self.lazy_initialization(keys, values)
            self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]

    def update(self, key_states, value_states, *args, **kwargs):
        key_states, value_states = key_states.to(self.kv_dtype), value_states.to(self.kv_dtype)
        start = self.keys.shape[-2] if self.is_initialized else 0
        end = start + key_states.shape[-2]
        if self.kbuf is None or end > self.kbuf.shape[-2]:
            return super().update(key_states, value_states, *args, **kwargs)
        self.kbuf[:, :, start:end] = key_states
        self.vbuf[:, :, start:end] = value_states
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values


def new_cache(num_layers: int, prefix: KV | None = None, dtype: torch.dtype = torch.float32, room: int = 0,
              kv_shape: tuple[int, int] | None = None, device: Any = None) -> Cache:
    """A cache holding `prefix`. With `room` (and `kv_shape`, the key/value heads and head
    dimension), one `kv_block` holds the prefix and `room` more tokens, so that the prefill
    allocates its cache once, before its temporaries; without, the prefix is held as it is
    (views of a store entry are never written into: the next `update` concatenates)."""
    if room > 0 and kv_shape is not None:
        filled = prefix[0][0].shape[2] if prefix else 0
        block = kv_block(num_layers, 1, kv_shape[0], filled + room, kv_shape[1], dtype, device)
        layers = []
        for li in range(num_layers):
            if prefix:
                block[li, 0, :, :, :filled] = prefix[li][0]
                block[li, 1, :, :, :filled] = prefix[li][1]
            layers.append(_CacheLayer(dtype, block[li, 0], block[li, 1], filled))
        return Cache(layers=layers)
    layers = [_CacheLayer(dtype) for _ in range(num_layers)]
    if prefix:
        for layer, (k, v) in zip(layers, prefix):
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k.to(dtype), v.to(dtype)
    return Cache(layers=layers)


def _attention(module, query, key, value, attention_mask, scaling=None, is_causal=None, **kwargs):
    """Torch's SDPA in the cache's dtype, on the key/value heads (`enable_gqa`).

    Transformers' "sdpa" repeats the keys and values once per query head whenever a mask is
    given, which is every prefill on top of a cached prefix; on the key/value heads each key
    is read once (docs/notes/2026-12-04-bf16-kv-cache.md)."""
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.to(key.dtype), key, value, attn_mask=attention_mask, scale=scaling,
        is_causal=bool(q_length > 1 and attention_mask is None and causal), enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous().to(query.dtype), None


def cache_keyword(model: Any) -> str:
    """The name under which the model's forward takes a KV cache: `cache` from transformers
    5.2x, `past_key_values` before (an unknown keyword is swallowed by `**kwargs`, and the model
    would then build a cache of its own instead of writing into the engine's)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def use_engine_attention(model: Any) -> None:
    """Route the model's attention through `_attention` (same masks as "sdpa")."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)


class _RowLayer(DynamicLayer):
    """One layer of the batch cache: a view over preallocated rows. Appending writes into the
    spare columns instead of concatenating (which would copy the whole cache every step)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.kbuf, self.vbuf = keys, values
        self.device = keys.device
        self.is_initialized = True

    def bind(self, rows: int, width: int) -> None:
        self.keys = self.kbuf[:rows, :, :width]
        self.values = self.vbuf[:rows, :, :width]

    def update(self, key_states, value_states, *args, **kwargs):
        rows, width = self.keys.shape[0], self.keys.shape[-2]
        end = width + key_states.shape[-2]
        self.kbuf[:rows, :, width:end] = key_states  # casts to the buffer's dtype
        self.vbuf[:rows, :, width:end] = value_states
        self.keys = self.kbuf[:rows, :, :end]
        self.values = self.vbuf[:rows, :, :end]
        return self.keys, self.values


class _Batch:
    """The sequences being decoded together. Row i holds its sequence's cache in columns
    [width - len(fed), width); the columns to the left of that are masked out."""

    def __init__(self, num_layers: int, max_rows: int):
        self.num_layers = num_layers
        self.max_rows = max_rows
        self.rows: list[_Sequence] = []
        self.width = 0
        self.capacity = 0
        self.layers: list[_RowLayer] = []
        self.mask = torch.zeros(0, 0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def row_kv(self, i: int) -> KV:
        """A copy of row i's cache, detached from the shared buffer, in one `kv_block`."""
        views = self._row_view(i)
        k0 = views[0][0]
        block = kv_block(len(views), 1, k0.shape[1], k0.shape[2], k0.shape[3], k0.dtype, k0.device)
        for li, (k, v) in enumerate(views):
            block[li, 0], block[li, 1] = k, v
        return [(block[li, 0], block[li, 1]) for li in range(len(views))]

    def _row_view(self, i: int) -> KV:
        n = len(self.rows[i].fed)
        return [(l.kbuf[i : i + 1, :, self.width - n : self.width],
                 l.vbuf[i : i + 1, :, self.width - n : self.width]) for l in self.layers]

    @property
    def allocated_rows(self) -> int:
        return self.layers[0].kbuf.shape[0] if self.layers else 0

    def join(self, seq: _Sequence) -> None:
        n = len(seq.fed)
        if (len(self.rows) == self.allocated_rows or n > self.width
                or self.width + len(seq.unfed) + seq.remaining > self.capacity):
            self._relayout(seq)
            return
        i = len(self.rows)
        for layer, (k, v) in zip(self.layers, seq.kv):
            # Masked columns still meet the values in the attention sum (weight 0): they must
            # hold numbers, never the NaN an uninitialised buffer may contain.
            layer.kbuf[i, :, : self.width - n] = 0
            layer.vbuf[i, :, : self.width - n] = 0
            layer.kbuf[i, :, self.width - n : self.width] = k[0]
            layer.vbuf[i, :, self.width - n : self.width] = v[0]
        self.mask[i].zero_()
        self.mask[i, self.width - n : self.width] = 1
        seq.kv = seq.buffers = None
        self.rows.append(seq)

    def leave(self, i: int) -> KV:
        """Remove row i and return its cache; the last row moves into its place. The last
        sequence of a one-row buffer takes views of it rather than a copy, as nothing writes
        into the buffer again."""
        kv = self._row_view(i) if self.allocated_rows == 1 else self.row_kv(i)
        last = len(self.rows) - 1
        if i != last:
            start = self.width - len(self.rows[last].fed)
            for layer in self.layers:
                layer.kbuf[i, :, :start] = 0
                layer.vbuf[i, :, :start] = 0
                layer.kbuf[i, :, start : self.width] = layer.kbuf[last, :, start : self.width]
                layer.vbuf[i, :, start : self.width] = layer.vbuf[last, :, start : self.width]
            self.mask[i] = self.mask[last]
            self.rows[i] = self.rows[last]
        self.rows.pop()
        if not self.rows:
            self._release()
        elif self.width - max(len(s.fed) for s in self.rows) > max(256, self.width // 4):
            self._relayout(None)  # the longest sequence left: stop attending over its padding
        return kv

    def _release(self) -> None:
        self.layers, self.width, self.capacity = [], 0, 0
        self.mask = torch.zeros(0, 0, dtype=torch.long)

    def _relayout(self, joining: _Sequence | None) -> None:
        """Copy every row (and the joining sequence) into fresh buffers sized for them: as many
        rows as the next power of two holds (so a filling batch is laid out again only log2
        times), and as many columns as the longest sequence can reach. Nothing changes before
        the fresh buffers are allocated, so a relayout that ran out of memory can run again."""
        sources: list[tuple[_Sequence, KV]] = [(s, self._row_view(i)) for i, s in enumerate(self.rows)]
        if joining is not None:
            sources.append((joining, joining.kv))
        width = max(len(s.fed) for s, _ in sources)
        capacity = width + max(len(s.unfed) + s.remaining for s, _ in sources) + 16
        buffers = joining.buffers if joining is not None else None
        if len(sources) == 1 and joining is not None and buffers and buffers[0][0].shape[-2] >= capacity:
            joining.kv = joining.buffers = None
            self._adopt(joining, buffers)
            return
        rows = min(self.max_rows, 1 << (len(sources) - 1).bit_length())
        k0 = sources[0][1][0][0]
        heads, dim = k0.shape[1], k0.shape[3]
        block = kv_block(self.num_layers, rows, heads, capacity, dim, k0.dtype, k0.device)
        if joining is not None:
            joining.kv = joining.buffers = buffers = None  # its cache is freed with `sources`, once copied
        layers = []
        for li in range(self.num_layers):
            kbuf, vbuf = block[li, 0], block[li, 1]
            for i, (s, kv) in enumerate(sources):
                n = len(s.fed)
                kbuf[i, :, : width - n] = 0
                vbuf[i, :, : width - n] = 0
                kbuf[i, :, width - n : width] = kv[li][0][0]
                vbuf[i, :, width - n : width] = kv[li][1][0]
            layers.append(_RowLayer(kbuf, vbuf))
        self.layers = layers  # the old buffers go with the views in `sources`
        self.rows = [s for s, _ in sources]
        self.mask = torch.zeros(rows, capacity, dtype=torch.long, device=k0.device)
        for i, s in enumerate(self.rows):
            self.mask[i, width - len(s.fed) : width] = 1
        self.width, self.capacity = width, capacity

    def _adopt(self, seq: _Sequence, buffers: KV) -> None:
        """Start a one-row batch in the prefill's own buffers: its cache already sits in their
        first columns, as a lone row is laid out, and a copy would hold the episode's cache
        twice for as long as it takes (the peak of a long turn, once the prefill is chunked)."""
        capacity = buffers[0][0].shape[-2]
        self.layers = [_RowLayer(k, v) for k, v in buffers]
        self.rows = [seq]
        self.mask = torch.zeros(1, capacity, dtype=torch.long, device=buffers[0][0].device)
        self.mask[0, : len(seq.fed)] = 1
        self.width, self.capacity = len(seq.fed), capacity

    def cache_for_step(self, span: int = 1) -> tuple[Cache, torch.Tensor]:
        """The cache and mask for a step that feeds every row `span` tokens."""
        n = len(self.rows)
        for layer in self.layers:
            layer.bind(n, self.width)
        self.mask[:n, self.width : self.width + span] = 1
        return Cache(layers=list(self.layers)), self.mask[:n, : self.width + span]


class Engine:
    """Owns the model; `submit` from any thread, results come back as futures.

    Two threads share the model: one prefills new requests, one decodes the batch. Prefill is
    compute-bound and decoding is bound by memory traffic, and with torch on one thread per
    forward (see `local.default_threads`) each keeps its own core busy: while eight episodes
    decode, the next observation of a ninth is already being read. A request alone in the
    engine computes on both threads' cores (`local.lone_threads`)."""

    def __init__(self, model: Any, *, stop_token_ids: list[int], vocab_size: int, max_batch: int = 8,
                 cache_entries: int = 16, cache_bytes: int = CPU_PREFIX_STORE_BYTES, threads: int = 0,
                 lone_threads: int = 0,
                 kv_dtype: torch.dtype = torch.float32,
                 jump_forward: Callable[[Any, int], list[int]] | None = None, prefill_chunk: int = PREFILL_CHUNK):
        self.model = model
        self.prefill_chunk = prefill_chunk  # tokens a long prefill's forward pass reads at most; 0: all at once
        self.chunked_above = CHUNKED_ABOVE
        self.device = model.device  # inputs are made where the model is (a GPU's, or the CPU)
        # (matcher, budget) -> the tokens the grammar forces next, already accepted by the
        # matcher; see `_step` for when they are fed at once.
        self.jump_forward = jump_forward
        self.threads = threads  # torch threads in each engine thread; 0 keeps torch's default
        self.lone_threads = lone_threads  # for a request alone in the engine; 0: `threads`
        self.kv_dtype = kv_dtype
        use_engine_attention(model)
        self.cache_keyword = cache_keyword(model)
        self.stop_token_ids = set(stop_token_ids)
        self.vocab_size = vocab_size
        self.max_batch = max_batch
        self.store = PrefixStore(cache_entries, cache_bytes)
        self.num_layers = model.config.num_hidden_layers
        self.kv_shape = kv_head_shape(model.config)
        self._pending: list[Request] = []
        self._ready: list[_Sequence] = []
        self._prefilling = 0
        self._decoding = 0
        self._cond = threading.Condition()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self.stats = {"steps": 0, "step_rows": 0, "prefill_tokens": 0, "prefill_seconds": 0.0, "step_seconds": 0.0,
                      "max_rows": 0, "prefill_cpu_seconds": 0.0, "step_cpu_seconds": 0.0,
                      "forced_tokens": 0, "step_tokens": 0, "store_dropped_for_memory": 0}

    def submit(self, request: Request) -> concurrent.futures.Future:
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._pending.append(request)
            if not self._threads:
                self._threads = [threading.Thread(target=self._prefill_loop, name="toolself-prefill", daemon=True),
                                 threading.Thread(target=self._decode_loop, name="toolself-decode", daemon=True)]
                for thread in self._threads:
                    thread.start()
                _RUNNING.add(self)
            self._cond.notify_all()
        return request.future

    def end_session(self, session: str) -> None:
        self.store.drop(PrefixStore.session_key(session))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)
        error = RuntimeError("the engine was closed")
        for request in self._pending:
            if not request.future.done():
                request.future.set_exception(error)
        for seq in self._ready:
            if not seq.request.future.done():
                seq.request.future.set_exception(error)
        self._pending, self._ready = [], []

    # The prefill thread.

    def _use_threads(self) -> None:
        """Torch's thread count is per calling thread (an OpenMP setting), so this leaves the
        rest of the process, a trainer for instance, with its own. A request that has the
        engine to itself (one agent's run) also takes the idle engine thread's cores
        (`lone_threads`): no other request waits on them then."""
        wanted = self.lone_threads if self.lone_threads > 0 and self._alone() else self.threads
        if wanted > 0 and torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def _alone(self) -> bool:
        """Whether one request is all the engine holds: waiting, prefilling or decoding."""
        with self._cond:
            return len(self._pending) + len(self._ready) + self._prefilling + self._decoding == 1

    def _can_prefill(self) -> bool:
        return bool(self._pending) and self._decoding + len(self._ready) + self._prefilling < self.max_batch

    def _prefill_one(self, request: Request) -> _Sequence | None:
        """Prefill a request; None when it is already answered (done at once, failed, or
        cancelled)."""
        if request.future.cancelled():
            return None
        try:
            seq = self._prefill(request)
        except Exception as exc:
            if not request.future.done():
                request.future.set_exception(exc)
            return None
        if seq.finish_reason is not None:
            self._finish(seq, seq.kv)
            return None
        return seq

    def _prefill_loop(self) -> None:
        self._use_threads()
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not self._can_prefill():
                        self._cond.wait()
                    if self._closed:
                        return
                    request = self._pending.pop(0)
                    self._prefilling += 1
                self._use_threads()
                seq = self._prefill_one(request)
                with self._cond:
                    self._prefilling -= 1
                    if seq is not None:
                        self._ready.append(seq)
                    self._cond.notify_all()

    # The decode thread.

    def _decode_loop(self) -> None:
        """Steps the batch; while requests wait for the prefill thread it also prefills one
        between two steps. Prefill is then the bottleneck, and a step over a half-empty batch
        costs nearly as much as over a full one, so this trades a short pause of the batch for
        fuller batches afterwards."""
        self._use_threads()
        batch = _Batch(self.num_layers, self.max_batch)
        bitmask = None
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not self._ready and not batch.rows and not self._can_prefill():
                        self._cond.wait()
                    if self._closed:
                        error = RuntimeError("the engine was closed")
                        for seq in batch.rows:
                            if not seq.request.future.done():
                                seq.request.future.set_exception(error)
                        return
                    room = self.max_batch - len(batch.rows)
                    joining, self._ready = self._ready[:room], self._ready[room:]
                    self._decoding = len(batch.rows) + len(joining)
                    stolen = self._pending.pop(0) if self._can_prefill() else None
                    if stolen is not None:
                        self._prefilling += 1
                if stolen is not None:
                    self._use_threads()
                    seq = self._prefill_one(stolen)
                    if seq is not None:
                        joining.append(seq)
                    with self._cond:
                        self._prefilling -= 1
                        self._decoding += 1 if seq is not None else 0
                for seq in joining:
                    try:
                        self._with_memory_retry(functools.partial(batch.join, seq))
                    except Exception as exc:
                        if not seq.request.future.done():
                            seq.request.future.set_exception(exc)
                if batch.rows:
                    try:
                        if bitmask is None:
                            import xgrammar as xgr

                            bitmask = xgr.allocate_token_bitmask(self.max_batch, self.vocab_size)
                        self._use_threads()
                        self._step(batch, bitmask)
                    except Exception as exc:  # a failed step fails its sequences, not the engine
                        for seq in batch.rows:
                            if not seq.request.future.done():
                                seq.request.future.set_exception(exc)
                        batch.rows = []
                        batch._release()
                    if not batch.rows:  # drained: no step waits on the trim
                        release_freed_memory()
                with self._cond:
                    self._decoding = len(batch.rows)
                    self._cond.notify_all()

    def _prefill(self, request: Request) -> _Sequence:
        import xgrammar as xgr

        start, cpu_start = time.perf_counter(), time.thread_time()
        own = PrefixStore.session_key(request.session) if request.session is not None else None

        def replaced(key: str, usable: int, length: int) -> bool:
            """Whether this request's cache will replace that entry when it finishes: then the
            entry leaves the store now, and the episode's cache is not held twice meanwhile."""
            return key == own if own is not None else key.startswith("auto:") and usable >= length

        key, reused, prefix_kv = self.store.lookup(request.prompt_ids, request.session, take=replaced)
        if own is not None:
            store_key = own
        elif key is not None and key.startswith("auto:") and reused >= self.store.length(key):
            store_key = key  # this conversation continues that one (taken out of the store): replace it
        else:
            store_key = self.store.new_key()
        held = [prefix_kv]  # emptied by the pass that copies it, so that a taken entry is freed before it runs
        prefix_kv = None

        def read_prompt():
            start = reused if held else 0  # run again, it reads the whole prompt: the entry went with the store
            return (start, *self._prefill_forward(request, start, held))

        reused, out, cache = self._with_memory_retry(read_prompt)
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        seq = _Sequence(request=request, fed=request.prompt_ids + request.forced_ids, cached_tokens=reused,
                        store_key=store_key, kv=kv, generated=list(request.forced_ids))
        if all(layer.kbuf is not None for layer in cache.layers):
            seq.buffers = [(layer.kbuf, layer.vbuf) for layer in cache.layers]
        if request.temperature > 0:
            seed = zlib.crc32(f"{request.seed}:{request.session}:{len(request.prompt_ids)}".encode())
            seq.generator = torch.Generator().manual_seed(seed)
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size) if request.matcher is not None else None
        self._advance([seq], out.logits[:, -1, :], bitmask)
        self.stats["prefill_tokens"] += len(seq.fed) - reused
        self.stats["prefill_seconds"] += time.perf_counter() - start
        self.stats["prefill_cpu_seconds"] += time.thread_time() - cpu_start
        return seq

    def _prefill_forward(self, request: Request, reused: int, held: list[KV | None]) -> tuple[Any, Cache]:
        """The forward passes that read a prompt's tokens after the first `reused`, on top of
        the cache of those `held` holds (taken from it): the last pass's output and the cache."""
        new_ids = request.prompt_ids[reused:] + request.forced_ids
        # Room for the reply too (what a lone row's batch needs, see `_Batch._relayout`).
        room = len(new_ids) + request.max_tokens - len(request.forced_ids) + 16
        cache = new_cache(self.num_layers, held.pop() if held else None, self.kv_dtype, room=room,
                          kv_shape=self.kv_shape, device=self.device)
        chunked = self.prefill_chunk and len(new_ids) > self.chunked_above
        chunk = self.prefill_chunk if chunked else len(new_ids)
        for at in range(0, len(new_ids), chunk):
            piece = new_ids[at : at + chunk]
            positions = torch.arange(reused + at, reused + at + len(piece), device=self.device).unsqueeze(0)
            out = self.model(input_ids=torch.tensor([piece], device=self.device), position_ids=positions,
                             use_cache=True, logits_to_keep=1, **{self.cache_keyword: cache})
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
        return out, cache

    def _with_memory_retry(self, run: Callable[[], Any]) -> Any:
        """`run()`, and once more if it ran out of memory while the store kept caches: they
        are dropped and their memory handed back to the device first. The store is what the
        engine holds that no episode needs (a session whose cache was dropped reads its context
        again), where a failed pass fails its episodes. The second run is outside the handler,
        so that the failed one's frames, and the tensors they held, are gone by then."""
        try:
            return run()
        except torch.OutOfMemoryError:
            if not len(self.store):
                raise
        self.store.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.stats["store_dropped_for_memory"] += 1
        return run()

    def _step(self, batch: _Batch, bitmask) -> None:
        """One forward over the batch. A sequence decoding alone feeds every token it has not
        fed yet, since on one row a step of several tokens costs far less than as many steps.
        In a batch each row feeds one token a step, and one whose forced text is not all fed
        yet picks nothing: padding the other rows to one row's span would slow them more than
        it speeds that row (docs/notes/2026-12-04-jump-forward.md)."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        rows = batch.rows
        span = len(rows[0].unfed) if len(rows) == 1 else 1
        feeds = [s.unfed[:span] for s in rows]
        tokens = torch.tensor(feeds, device=self.device)
        positions = torch.tensor([list(range(len(s.fed), len(s.fed) + span)) for s in rows], device=self.device)

        def forward():  # run again, binding the cache anew undoes what a failed pass wrote
            cache, mask = batch.cache_for_step(span)
            return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                              logits_to_keep=1, **{self.cache_keyword: cache})

        out = self._with_memory_retry(forward)
        batch.width += span
        for s, fed in zip(rows, feeds):
            s.fed.extend(fed)
        picking = [i for i, s in enumerate(rows) if not s.unfed]
        if picking:
            self._advance([rows[i] for i in picking], out.logits[picking, -1, :], bitmask)
        self.stats["step_tokens"] += span * len(rows)
        self.stats["steps"] += 1
        self.stats["step_rows"] += len(rows)
        self.stats["max_rows"] = max(self.stats["max_rows"], len(rows))
        for i in reversed(range(len(batch.rows))):
            seq = batch.rows[i]
            if seq.finish_reason is None and seq.request.future.cancelled():
                seq.finish_reason = "cancelled"
            if seq.finish_reason is not None:
                self._finish(seq, batch.leave(i))
        self.stats["step_seconds"] += time.perf_counter() - start
        self.stats["step_cpu_seconds"] += time.thread_time() - cpu_start

    def _advance(self, seqs: list[_Sequence], logits: torch.Tensor, bitmask: torch.Tensor | None) -> None:
        """Pick each sequence's next token under its grammar, and mark the finished ones."""
        logits = logits.float()  # masked, picked from and drawn from where the model put them
        constrained = [i for i, s in enumerate(seqs) if s.request.matcher is not None]
        if constrained:
            for i in constrained:
                seqs[i].request.matcher.fill_next_token_bitmask(bitmask, i)
            apply_bitmask(logits, bitmask[: len(seqs)], constrained, self.vocab_size)
        # max's indices are argmax's (the first of tied maxima), in a third of the time over a row
        greedy = logits.max(dim=-1).indices.tolist() if any(s.request.temperature <= 0 for s in seqs) else []
        for i, seq in enumerate(seqs):
            request = seq.request
            token = greedy[i] if request.temperature <= 0 else \
                sample_token(logits[i], request.temperature, request.top_p, seq.generator)
            seq.generated.append(token)
            matcher = seq.request.matcher
            if matcher is not None and not matcher.accept_token(token):
                seq.finish_reason = "stop"  # cannot happen under the mask; end rather than emit garbage
            elif token in self.stop_token_ids or (matcher is not None and matcher.is_terminated()):
                seq.finish_reason = "stop"
            elif seq.remaining <= 0:
                seq.finish_reason = "length"
            elif matcher is not None and self.jump_forward is not None:
                forced = self.jump_forward(matcher, seq.remaining)
                seq.generated += forced
                self.stats["forced_tokens"] += len(forced)
            if seq.request.on_tokens is not None:
                seq.request.on_tokens(list(seq.generated))

    def _finish(self, seq: _Sequence, kv: KV) -> None:
        request = seq.request
        self.store.put(seq.store_key, seq.fed, kv)
        if not request.future.done():
            request.future.set_result(Result(prompt_ids=list(request.prompt_ids), completion_ids=list(seq.generated),
                                              cached_tokens=seq.cached_tokens, finish_reason=seq.finish_reason or "stop"))
