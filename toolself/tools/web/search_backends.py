"""Web search backends: SearxNG and the hosted APIs researchers use, one small class each.

Each backend knows only its request and the documented shape of its answer; retries, error
treatment and keys are `http.request`'s. A body that is JSON but not the documented shape is
a `ServiceError` naming the service and the missing part, never a KeyError in the agent.

    backend = make_backend("serper")          # key from SERPER_API_KEY
    backend.search("who founded Lumen", k=5)  # -> [SearchResult, ...]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import quote

from toolself.tools.collection import SearchResult
from toolself.tools.web.http import RetryPolicy, ServiceError, api_key, json_body, request


def _result(rank: int, url: Any, title: Any, snippet: Any, score: Any = None, date: Any = None) -> SearchResult | None:
    if not isinstance(url, str) or not url:
        return None
    return SearchResult(locator=url, title=(title if isinstance(title, str) and title.strip() else url).strip(),
                        snippet=" ".join(str(snippet or "").split()),
                        score=float(score) if isinstance(score, (int, float)) else 1.0 / (rank + 1),
                        date=date.strip() if isinstance(date, str) else "")


def _rows(service: str, payload: Any, *path: str) -> list[dict[str, Any]]:
    """payload[path...] as a list of objects, or a ServiceError naming what is missing."""
    node = payload
    for part in path:
        if not isinstance(node, dict) or part not in node:
            raise ServiceError(f"{service} answered without the documented `{'.'.join(path)}` field")
        node = node[part]
    if not isinstance(node, list):
        raise ServiceError(f"{service} answered with `{'.'.join(path)}` that is not a list")
    return [row for row in node if isinstance(row, dict)]


@dataclass(frozen=True)
class WebSearchBackend:
    """url: the endpoint (a self-hosted instance, a proxy, or a test server); keys are read from
    the environment variables `key_names` at request time."""

    url: str
    policy: RetryPolicy = field(default_factory=RetryPolicy)

    name: ClassVar[str] = ""
    key_names: ClassVar[tuple[str, ...]] = ()
    key_required: ClassVar[bool] = True
    default_url: ClassVar[str] = ""
    url_variable: ClassVar[str] = ""

    def key(self) -> str | None:
        value = api_key(self.key_names)
        if value is None and self.key_required:
            raise ServiceError(f"{self.name} search needs an API key: set {' or '.join(self.key_names)}")
        return value

    def call(self, method: str, url: str, **kwargs: Any) -> Any:
        response = request(self.name, method, url, policy=self.policy, key_names=self.key_names, **kwargs)
        return json_body(self.name, response)

    def search(self, query: str, k: int) -> list[SearchResult]:
        raise NotImplementedError

    def identity(self) -> list[str]:
        """What names this backend in a cache key: never the key."""
        return [self.name, self.url]


def _take(results: list[SearchResult | None], k: int) -> list[SearchResult]:
    return [r for r in results if r is not None][:k]


@dataclass(frozen=True)
class SearxNG(WebSearchBackend):
    name: ClassVar[str] = "searxng"
    key_required: ClassVar[bool] = False
    url_variable: ClassVar[str] = "SEARX_HOST"

    def search(self, query: str, k: int) -> list[SearchResult]:
        host = self.url.rstrip("/")
        if "://" not in host:
            host = "http://" + host
        response = request(self.name, "GET", f"{host}/search", policy=self.policy,
                           params={"q": query, "format": "json"},
                           forbidden_hint="is the JSON format enabled in the instance's settings (search.formats)?")
        rows = _rows(self.name, json_body(self.name, response), "results")
        return _take([_result(i, r.get("url"), r.get("title"), r.get("content"), r.get("score"),
                              r.get("publishedDate")) for i, r in enumerate(rows)], k)


@dataclass(frozen=True)
class Serper(WebSearchBackend):
    name: ClassVar[str] = "serper"
    key_names: ClassVar[tuple[str, ...]] = ("SERPER_API_KEY",)
    default_url: ClassVar[str] = "https://google.serper.dev/search"
    url_variable: ClassVar[str] = "SERPER_URL"

    def search(self, query: str, k: int) -> list[SearchResult]:
        payload = self.call("POST", self.url, json={"q": query, "num": k},
                            headers={"X-API-KEY": self.key() or "", "Content-Type": "application/json"})
        rows = _rows(self.name, payload, "organic")
        return _take([_result(i, r.get("link"), r.get("title"), r.get("snippet"), date=r.get("date"))
                      for i, r in enumerate(rows)], k)


@dataclass(frozen=True)
class Tavily(WebSearchBackend):
    name: ClassVar[str] = "tavily"
    key_names: ClassVar[tuple[str, ...]] = ("TAVILY_API_KEY",)
    default_url: ClassVar[str] = "https://api.tavily.com/search"
    url_variable: ClassVar[str] = "TAVILY_URL"

    def search(self, query: str, k: int) -> list[SearchResult]:
        payload = self.call("POST", self.url, json={"query": query, "max_results": k, "search_depth": "basic"},
                            headers={"Authorization": f"Bearer {self.key()}"})
        rows = _rows(self.name, payload, "results")
        return _take([_result(i, r.get("url"), r.get("title"), r.get("content"), r.get("score"),
                              r.get("published_date")) for i, r in enumerate(rows)], k)


@dataclass(frozen=True)
class Brave(WebSearchBackend):
    name: ClassVar[str] = "brave"
    key_names: ClassVar[tuple[str, ...]] = ("BRAVE_API_KEY",)
    default_url: ClassVar[str] = "https://api.search.brave.com/res/v1/web/search"
    url_variable: ClassVar[str] = "BRAVE_URL"

    def search(self, query: str, k: int) -> list[SearchResult]:
        payload = self.call("GET", self.url, params={"q": query, "count": k},
                            headers={"X-Subscription-Token": self.key() or "", "Accept": "application/json"})
        if isinstance(payload, dict) and "web" not in payload and "query" in payload:
            return []  # Brave leaves `web` out when nothing matched
        rows = _rows(self.name, payload, "web", "results")
        return _take([_result(i, r.get("url"), r.get("title"), r.get("description"), date=r.get("page_age"))
                      for i, r in enumerate(rows)], k)


@dataclass(frozen=True)
class JinaSearch(WebSearchBackend):
    name: ClassVar[str] = "jina"
    key_names: ClassVar[tuple[str, ...]] = ("JINA_API_KEY", "JINA_KEY")
    default_url: ClassVar[str] = "https://s.jina.ai"
    url_variable: ClassVar[str] = "JINA_SEARCH_URL"

    def search(self, query: str, k: int) -> list[SearchResult]:
        payload = self.call("GET", f"{self.url.rstrip('/')}/{quote(query, safe='')}",
                            headers={"Authorization": f"Bearer {self.key()}", "Accept": "application/json",
                                     "X-Respond-With": "no-content"})
        rows = _rows(self.name, payload, "data")
        return _take([_result(i, r.get("url"), r.get("title"), r.get("description") or r.get("content"))
                      for i, r in enumerate(rows)], k)


BACKENDS: dict[str, type[WebSearchBackend]] = {b.name: b for b in (SearxNG, Serper, Tavily, Brave, JinaSearch)}


def make_backend(name: str, url: str | None = None, policy: RetryPolicy | None = None) -> WebSearchBackend:
    """A backend by name; its endpoint from `url`, else its environment variable, else the
    public service."""
    if name not in BACKENDS:
        raise ValueError(f"unknown search backend {name!r}; choose one of {sorted(BACKENDS)}")
    cls = BACKENDS[name]
    endpoint = url or os.environ.get(cls.url_variable, "").strip() or cls.default_url
    if not endpoint:
        raise ValueError(f"the {name} search backend needs an address: set {cls.url_variable} or --search-url")
    return cls(endpoint, policy or RetryPolicy())
