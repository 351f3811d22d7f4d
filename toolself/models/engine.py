"""The batched decoding scheduler behind the embedded model.

Why a scheduler: on CPU a 135M model decoding one sequence is bound by reading its weights
once per token, so decoding eight sequences in one forward pass costs little more than one.
The eval runner and the training collection run many episodes at once, from threads or from
asyncio; here one thread owns the model and serves them all:

- a request is prefilled alone, on top of the longest cached prefix of its prompt (a KV cache
  kept per session and, without sessions, matched by common token prefix), then joins the
  running batch between two decode steps;
- the batch keeps every sequence's keys and values in one preallocated buffer, right-aligned
  (left padding masked out) and packed into the first rows, so appending a token never copies
  the cache and a sequence that finishes is replaced by moving one row;
- each decode step feeds one token per sequence with its true position, masks the logits of
  constrained sequences with their own xgrammar matcher, and picks the next tokens;
- a finished sequence's cache goes back to the prefix store (an LRU bounded in entries and in
  tokens) for its next turn.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of shape [1, heads, tokens, dim]


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
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


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
    generator: torch.Generator | None = None
    finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.request.max_tokens - len(self.generated)


@dataclass
class _Entry:
    ids: np.ndarray
    kv: KV


class PrefixStore:
    """Recent KV caches, each with the exact token ids it covers. Entries are never modified
    in place (a request reads slices and builds its own tensors), so readers need no copy."""

    def __init__(self, max_entries: int = 16, max_tokens: int = 65536):
        self.max_entries = max_entries
        self.max_tokens = max_tokens
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

    def lookup(self, prompt_ids: list[int], session: str | None) -> tuple[str | None, int, KV | None]:
        """The entry sharing the longest prefix with the prompt (the session's own on a tie),
        the length usable (at least one prompt token is left to compute the next logits), and
        that prefix of its cache."""
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
            self._entries.move_to_end(best_key)
            kv = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in self._entries[best_key].kv]
        return best_key, best_len, kv

    def put(self, key: str, ids: list[int], kv: KV) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = _Entry(np.asarray(ids, dtype=np.int64), kv)
            total = sum(len(e.ids) for e in self._entries.values())
            while self._entries and (len(self._entries) > self.max_entries or total > self.max_tokens):
                _, dropped = self._entries.popitem(last=False)
                total -= len(dropped.ids)

    def drop(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


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
        self.kbuf[:rows, :, width:end] = key_states
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
        """A copy of row i's cache, detached from the shared buffer."""
        n = len(self.rows[i].fed)
        return [(l.kbuf[i : i + 1, :, self.width - n : self.width].clone(),
                 l.vbuf[i : i + 1, :, self.width - n : self.width].clone()) for l in self.layers]

    def join(self, seq: _Sequence) -> None:
        n = len(seq.fed)
        if not self.rows or n > self.width or self.width + seq.remaining + 1 > self.capacity:
            self._relayout(seq)
            return
        i = len(self.rows)
        for layer, (k, v) in zip(self.layers, seq.kv):
            layer.kbuf[i, :, self.width - n : self.width] = k[0]
            layer.vbuf[i, :, self.width - n : self.width] = v[0]
        self.mask[i].zero_()
        self.mask[i, self.width - n : self.width] = 1
        seq.kv = None
        self.rows.append(seq)

    def leave(self, i: int) -> KV:
        """Remove row i and return its cache; the last row moves into its place."""
        kv = self.row_kv(i)
        last = len(self.rows) - 1
        if i != last:
            start = self.width - len(self.rows[last].fed)
            for layer in self.layers:
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
        """Copy every row (and the joining sequence) into fresh buffers sized for them."""
        sources: list[tuple[_Sequence, KV]] = [(s, self.row_kv(i)) for i, s in enumerate(self.rows)]
        if joining is not None:
            sources.append((joining, joining.kv))
            joining.kv = None
        width = max(len(s.fed) for s, _ in sources)
        capacity = width + max(s.remaining for s, _ in sources) + 16
        k0, v0 = sources[0][1][0]
        heads, dim = k0.shape[1], k0.shape[3]
        self.layers = []
        for li in range(self.num_layers):
            kbuf = torch.empty(self.max_rows, heads, capacity, dim, dtype=k0.dtype)
            vbuf = torch.empty(self.max_rows, heads, capacity, v0.shape[3], dtype=v0.dtype)
            for i, (s, kv) in enumerate(sources):
                n = len(s.fed)
                kbuf[i, :, width - n : width] = kv[li][0][0]
                vbuf[i, :, width - n : width] = kv[li][1][0]
            self.layers.append(_RowLayer(kbuf, vbuf))
        self.mask = torch.zeros(self.max_rows, capacity, dtype=torch.long)
        for i, (s, _) in enumerate(sources):
            self.mask[i, width - len(s.fed) : width] = 1
        self.rows = [s for s, _ in sources]
        self.width, self.capacity = width, capacity

    def cache_for_step(self) -> tuple[Cache, torch.Tensor]:
        n = len(self.rows)
        for layer in self.layers:
            layer.bind(n, self.width)
        self.mask[:n, self.width] = 1
        return Cache(layers=list(self.layers)), self.mask[:n, : self.width + 1]


class Engine:
    """Owns the model; `submit` from any thread, results come back as futures."""

    def __init__(self, model: Any, *, stop_token_ids: list[int], vocab_size: int, max_batch: int = 8,
                 cache_entries: int = 16, cache_tokens: int = 65536):
        self.model = model
        self.stop_token_ids = set(stop_token_ids)
        self.vocab_size = vocab_size
        self.max_batch = max_batch
        self.store = PrefixStore(cache_entries, cache_tokens)
        self.num_layers = model.config.num_hidden_layers
        self._pending: list[Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._bitmask = None
        self.stats = {"steps": 0, "step_rows": 0, "prefill_tokens": 0, "prefill_seconds": 0.0, "step_seconds": 0.0,
                      "max_rows": 0}

    def submit(self, request: Request) -> concurrent.futures.Future:
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._pending.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="toolself-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return request.future

    def end_session(self, session: str) -> None:
        self.store.drop(PrefixStore.session_key(session))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # The scheduler thread.

    def _run(self) -> None:
        batch = _Batch(self.num_layers, self.max_batch)
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._pending and not batch.rows and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        self._fail_all(batch, RuntimeError("the engine was closed"))
                        return
                    room = self.max_batch - len(batch)
                    admitted, self._pending = self._pending[:room], self._pending[room:]
                for request in admitted:
                    self._admit(request, batch)
                if batch.rows:
                    try:
                        self._step(batch)
                    except Exception as exc:  # a failed step fails its sequences, not the engine
                        for seq in batch.rows:
                            if not seq.request.future.done():
                                seq.request.future.set_exception(exc)
                        batch.rows = []
                        batch._release()

    def _fail_all(self, batch: _Batch, exc: Exception) -> None:
        for seq in batch.rows:
            seq.request.future.set_exception(exc)
        with self._cond:
            pending, self._pending = self._pending, []
        for request in pending:
            request.future.set_exception(exc)

    def _admit(self, request: Request, batch: _Batch) -> None:
        if request.future.cancelled():
            return
        try:
            seq = self._prefill(request)
            if seq.finish_reason is not None:
                self._finish(seq, seq.kv)
            else:
                batch.join(seq)
        except Exception as exc:
            if not request.future.done():
                request.future.set_exception(exc)

    def _prefill(self, request: Request) -> _Sequence:
        start = time.perf_counter()
        key, reused, prefix_kv = self.store.lookup(request.prompt_ids, request.session)
        if request.session is not None:
            store_key = PrefixStore.session_key(request.session)
        elif key is not None and key.startswith("auto:") and reused >= len(self.store_ids(key)):
            store_key = key  # this conversation continues that one: replace it
        else:
            store_key = self.store.new_key()
        new_ids = request.prompt_ids[reused:]
        cache = DynamicCache(ddp_cache_data=prefix_kv) if prefix_kv else None
        positions = torch.arange(reused, len(request.prompt_ids)).unsqueeze(0)
        out = self.model(input_ids=torch.tensor([new_ids]), position_ids=positions, cache=cache,
                         use_cache=True, logits_to_keep=1)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        seq = _Sequence(request=request, fed=list(request.prompt_ids), cached_tokens=reused, store_key=store_key,
                        kv=kv)
        if request.temperature > 0:
            seed = zlib.crc32(f"{request.seed}:{request.session}:{len(request.prompt_ids)}".encode())
            seq.generator = torch.Generator().manual_seed(seed)
        self.stats["prefill_tokens"] += len(new_ids)
        self.stats["prefill_seconds"] += time.perf_counter() - start
        self._advance([seq], out.logits[:, -1, :])
        return seq

    def store_ids(self, key: str) -> np.ndarray:
        with self.store._lock:
            entry = self.store._entries.get(key)
            return entry.ids if entry is not None else np.zeros(0)

    def _step(self, batch: _Batch) -> None:
        start = time.perf_counter()
        cache, mask = batch.cache_for_step()
        rows = batch.rows
        tokens = torch.tensor([[s.generated[-1]] for s in rows])
        positions = torch.tensor([[len(s.fed)] for s in rows])
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache,
                         use_cache=True, logits_to_keep=1)
        batch.width += 1
        for s in rows:
            s.fed.append(s.generated[-1])
        self._advance(rows, out.logits[:, -1, :])
        self.stats["steps"] += 1
        self.stats["step_rows"] += len(rows)
        self.stats["max_rows"] = max(self.stats["max_rows"], len(rows))
        for i in reversed(range(len(rows))):
            if rows[i].finish_reason is not None:
                seq = rows[i]
                self._finish(seq, batch.leave(i))
        self.stats["step_seconds"] += time.perf_counter() - start

    def _advance(self, seqs: list[_Sequence], logits: torch.Tensor) -> None:
        """Pick each sequence's next token under its grammar, and mark the finished ones."""
        import xgrammar as xgr

        logits = logits.float()
        constrained = [i for i, s in enumerate(seqs) if s.request.matcher is not None]
        if constrained:
            if self._bitmask is None or self._bitmask.shape[0] < len(seqs):
                self._bitmask = xgr.allocate_token_bitmask(max(self.max_batch, len(seqs)), self.vocab_size)
            for i in constrained:
                seqs[i].request.matcher.fill_next_token_bitmask(self._bitmask, i)
            xgr.apply_token_bitmask_inplace(logits, self._bitmask[: len(seqs)], vocab_size=self.vocab_size,
                                            indices=constrained)
        greedy = logits.argmax(dim=-1).tolist()
        for i, seq in enumerate(seqs):
            token = greedy[i] if seq.request.temperature <= 0 else self._sample(logits[i], seq)
            seq.generated.append(token)
            matcher = seq.request.matcher
            if matcher is not None and not matcher.accept_token(token):
                seq.finish_reason = "stop"  # cannot happen under the mask; end rather than emit garbage
            elif token in self.stop_token_ids or (matcher is not None and matcher.is_terminated()):
                seq.finish_reason = "stop"
            elif seq.remaining <= 0:
                seq.finish_reason = "length"

    def _sample(self, logits: torch.Tensor, seq: _Sequence) -> int:
        probs = torch.softmax(logits / seq.request.temperature, dim=-1)
        top_p = seq.request.top_p
        if top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
            keep[0] = True
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=seq.generator).item())

    def _finish(self, seq: _Sequence, kv: KV) -> None:
        request = seq.request
        self.store.put(seq.store_key, seq.fed, kv)
        if not request.future.done():
            request.future.set_result(Result(prompt_ids=list(request.prompt_ids), completion_ids=list(seq.generated),
                                              cached_tokens=seq.cached_tokens, finish_reason=seq.finish_reason or "stop"))
