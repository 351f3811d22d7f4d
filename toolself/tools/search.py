"""`search`: ranked results (title, locator, snippet) for one query or several.

The paper's agent sends several phrasings at once; results are deduplicated by locator
across them so that the model reads each document's entry once. The backend is the task's
local collection when it has one (every offline suite and test), otherwise the run's own
collection (`--docs`: a local corpus standing in for the web), otherwise the web backend
the run's `WebSettings` choose (SearxNG, Serper, Tavily, Brave, Jina), otherwise the call
says that no backend is configured: an error the model can read, never an exception into the
agent. Web answers are kept in the run's cache, so a rerun or a repeat does not pay twice.

The module-level `search` reads its settings from the environment at each call (library use,
`SEARX_HOST=... python ...`); `search_tool(settings, docs)` is the same tool bound to settings
the command line parsed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

from toolself.tools.base import Tool, ToolContext, ToolError
from toolself.tools.collection import Collection, SearchResult
from toolself.tools.web.cache import DiskCache
from toolself.tools.web.search_backends import WebSearchBackend
from toolself.tools.web.settings import WebSettings

RESULTS_PER_QUERY = 5
MAX_QUERIES = 8
NO_BACKEND = ("no search backend: this task has no document collection and no web search is configured "
              "(set SEARX_HOST, SERPER_API_KEY, TAVILY_API_KEY, BRAVE_API_KEY or JINA_API_KEY, or pass --search)")


@dataclass(frozen=True)
class QueryResults:
    query: str
    results: list[SearchResult]


def web_search(backend: WebSearchBackend, query: str, k: int, cache: DiskCache | None) -> list[SearchResult]:
    """The backend's results, from the cache when this query was answered before."""
    key = backend.identity() + [query, k]
    if cache is not None:
        hit = cache.get(key)
        if isinstance(hit, list):
            return [SearchResult(**row) for row in hit]
    results = backend.search(query, k)
    if cache is not None:
        cache.put(key, [asdict(r) for r in results])
    return results


@functools.lru_cache(maxsize=8)
def docs_collection(path: Path) -> Collection:
    """A run's `--docs` collection, loaded (and its index read from the on-disk cache) once
    per process, then shared read-only by every attempt."""
    return Collection.from_path(path)


def task_collection(ctx: ToolContext | None, docs: Path | None) -> Collection | None:
    """The task's own collection, else the run's `--docs` one, else None (the web)."""
    own = getattr(ctx, "collection", None) if ctx is not None else None
    return own if own is not None or docs is None else docs_collection(Path(docs).resolve())


def run_queries(queries: list[str], ctx: ToolContext | None, k: int = RESULTS_PER_QUERY,
                settings: WebSettings | None = None, docs: Path | None = None) -> list[QueryResults]:
    """Each query's results, minus the locators an earlier query already returned."""
    collection = task_collection(ctx, docs)
    backend = cache = None
    if collection is None:
        settings = settings or WebSettings.from_env()
        try:
            backend = settings.search_backend()
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        if backend is None:
            raise ToolError(NO_BACKEND)
        cache = DiskCache(settings.cache_dir) if settings.cache_dir else None
    seen: set[str] = set()
    out = []
    for query in queries:
        found = collection.search(query, k=k) if collection is not None else web_search(backend, query, k, cache)
        fresh = [r for r in found if r.locator not in seen]
        seen.update(r.locator for r in fresh)
        out.append(QueryResults(query, fresh))
    return out


def format_results(batches: list[QueryResults], dates: bool = False) -> str:
    """The results as the model reads them; with `dates`, each result's publication date when
    the service gave one."""
    lines: list[str] = []
    number = 0
    for batch in batches:
        if len(batches) > 1:
            lines.append(f'Results for "{batch.query}":')
        if not batch.results and len(batches) > 1:
            lines.append("  (no new results)")
        for r in batch.results:
            number += 1
            date = f"\n   date: {r.date}" if dates and r.date else ""
            lines.append(f"{number}. {r.title}\n   locator: {r.locator}{date}\n   {r.snippet}")
        if len(batches) > 1:
            lines.append("")
    if number == 0:
        quoted = ", ".join(f'"{b.query}"' for b in batches)
        return (f"No results for {quoted}. Try fewer or different words, a synonym, or a broader query.")
    lines.append("Use visit(locator) to read a result.")
    return "\n".join(lines).strip()


@dataclass(frozen=True)
class _Search:
    settings: WebSettings | None = None
    docs: Path | None = None
    k: int = RESULTS_PER_QUERY
    dates: bool = False

    def search(self, query: str | list[str], ctx: ToolContext) -> str:
        """Search for documents; returns ranked results with title, locator and the best-matching passage.

        Args:
            query: One search query, or a list of queries to run together (results are deduplicated).
        """
        queries = [query] if isinstance(query, str) else list(query)
        queries = [q.strip() for q in queries if q and q.strip()]
        if not queries:
            raise ToolError("the query is empty; give at least one non-empty query")
        note = ""
        if len(queries) > MAX_QUERIES:
            note = f"\n(Only the first {MAX_QUERIES} of {len(queries)} queries were run.)"
            queries = queries[:MAX_QUERIES]
        batches = run_queries(queries, ctx, k=self.k, settings=self.settings, docs=self.docs)
        return format_results(batches, self.dates) + note


def search_tool(settings: WebSettings | None, docs: Path | None = None, k: int = RESULTS_PER_QUERY,
                dates: bool = False) -> Tool:
    """`search` bound to `settings` (None: read from the environment at each call) and to the
    run's document collection `docs` for tasks that have none of their own; `k` results per
    query, with their publication dates when `dates`."""
    return Tool(_Search(settings, docs, k, dates).search)


search = search_tool(None)
