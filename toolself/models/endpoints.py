"""One model served by several OpenAI-compatible servers, shared round-robin with a limit on
the requests in flight at each.

    openai:Qwen/Qwen3-8B@http://gpu0:8000/v1,http://gpu1:8000/v1
    openai:Qwen/Qwen3-8B@http://gpu0:8000/v1#64,http://gpu1:8000/v1#32

URLs are separated by commas; `#N` after a URL caps the requests in flight at that server
(default `DEFAULT_LIMIT`; a fragment is never part of a base URL, so it cannot clash). A caller
over the limit waits for a slot rather than piling requests onto a saturated server, whose
latency would grow for every attempt.

Calls of one episode (one `session`, the trajectory id the agent passes) stay on the server
that took the episode's first call: its prefix cache holds the episode's growing prompt, so
moving it would recompute that prefix elsewhere. New episodes go round-robin to the next
server with a free slot. A server that fails a call (after its own retries) is skipped for the
rest of that call, which is tried on the others; the episode then moves to the one that
answered.

Limits hold within one process. Under the Ray backend every worker process builds its own copy
from the spec and runs one attempt at a time, so there the load on each server is bounded by
the runner's concurrency (spread evenly by round-robin from a random first server), not by `#N`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
from dataclasses import dataclass
from typing import Any

from toolself.models.base import Completion, ModelError

DEFAULT_LIMIT = 64


@dataclass(frozen=True)
class Endpoint:
    url: str
    limit: int = DEFAULT_LIMIT


def is_multi_endpoint(spec: str) -> bool:
    """Whether an `openai:` spec names several servers or a per-server limit."""
    _, _, urls = spec.partition("@http")
    return "," in urls or "#" in urls


def parse_endpoints(spec: str) -> tuple[str, list[Endpoint]]:
    """`openai:NAME@URL[#N],URL[#N],...` -> (NAME, endpoints)."""
    if not spec.startswith("openai:") or "@http" not in spec:
        raise ValueError(f"not a multi-endpoint spec: {spec!r}; expected openai:NAME@URL1,URL2 (URL#N caps "
                         "the requests in flight at that server)")
    name, _, rest = spec[len("openai:"):].rpartition("@http")
    rest = "http" + rest
    endpoints = []
    for part in rest.split(","):
        url, _, limit = part.strip().partition("#")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"bad URL {url!r} in model spec {spec!r}: it must start with http:// or https://")
        try:
            n = int(limit) if limit else DEFAULT_LIMIT
        except ValueError:
            raise ValueError(f"bad limit {limit!r} for {url} in {spec!r}: write URL#N with N a whole number") from None
        if n < 1:
            raise ValueError(f"the limit for {url} in {spec!r} must be at least 1")
        endpoints.append(Endpoint(url.rstrip("/"), n))
    if not name.strip():
        raise ValueError(f"model spec {spec!r} has no model name")
    if len({e.url for e in endpoints}) != len(endpoints):
        raise ValueError(f"model spec {spec!r} names a server twice; give it one limit instead")
    return name.strip(), endpoints


class RoundRobinModel:
    """A ChatModel over several ChatModels serving the same weights (see the module docs)."""

    def __init__(self, models: list[Any], limits: list[int]):
        if not models or len(models) != len(limits):
            raise ValueError("give one limit per model, and at least one model")
        self.models = list(models)
        self.limits = list(limits)
        self.in_flight = [0] * len(models)
        self.served = [0] * len(models)
        self.name = getattr(models[0], "name", "round-robin")
        # A random first turn: processes that each build this model from the same spec (Ray
        # workers) would otherwise all send their first episode to the first server.
        self._turn = itertools.count(random.randrange(len(models)))
        self._ready = threading.Condition()
        self._sessions: dict[str, int] = {}

    @classmethod
    def from_spec(cls, spec: str, **options: Any) -> "RoundRobinModel":
        from toolself.models.openai_compat import OpenAIModel, env_api_key

        name, endpoints = parse_endpoints(spec)
        key = env_api_key()
        return cls([OpenAIModel(name, e.url, key, **options) for e in endpoints], [e.limit for e in endpoints])

    def __repr__(self) -> str:
        return f"RoundRobinModel({self.models!r}, limits={self.limits})"

    def _acquire(self, session: str | None, exclude: set[int]) -> int:
        """A slot at the session's server, or at the next server round-robin with one free."""
        with self._ready:
            while True:
                sticky = self._sessions.get(session) if session else None
                if sticky is not None and sticky not in exclude:
                    candidates = [sticky]
                else:
                    start = next(self._turn)
                    candidates = [(start + i) % len(self.models) for i in range(len(self.models))]
                    candidates = [i for i in candidates if i not in exclude]
                for i in candidates:
                    if self.in_flight[i] < self.limits[i]:
                        self.in_flight[i] += 1
                        if session:
                            self._sessions[session] = i
                        return i
                self._ready.wait()

    def _release(self, i: int) -> None:
        with self._ready:
            self.in_flight[i] -= 1
            self.served[i] += 1
            self._ready.notify_all()

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        failed: set[int] = set()
        while True:
            i = self._acquire(session, failed)
            try:
                return self.models[i].complete(messages, tools=tools, response_schema=response_schema,
                                               session=session, max_tokens=max_tokens)
            except ModelError:
                failed.add(i)
                if len(failed) == len(self.models):
                    raise
            finally:
                self._release(i)

    async def acomplete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        # Waiting for a slot blocks; a thread keeps that off the event loop.
        return await asyncio.to_thread(self.complete, messages, tools, response_schema, session, max_tokens)

    def count_tokens(self, text: str) -> int:
        return self.models[0].count_tokens(text)

    def end_session(self, session: str) -> None:
        with self._ready:
            i = self._sessions.pop(session, None)
        if i is not None:
            self.models[i].end_session(session)

    def close(self) -> None:
        for model in self.models:
            if hasattr(model, "close"):
                model.close()
