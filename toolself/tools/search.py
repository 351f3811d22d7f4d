"""`search`: ranked results (title, locator, snippet) for one query or several.

The paper's agent sends several phrasings at once; results are deduplicated by locator
across them so that the model reads each document's entry once. The backend is the task's
local collection when it has one (every offline suite and test), otherwise the web backend
the run's `WebSettings` choose (SearxNG, Serper, Tavily, Brave, Jina), otherwise the call
says that no backend is configured: an error the model can read, never an exception into the
agent. Web answers are kept in the run's cache, so a rerun or a repeat does not pay twice.

The module-level `search` reads its settings from the environment at each call (library use,
`SEARX_HOST=... python ...`); `search_tool(settings)` is the same tool bound to settings the
command line parsed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from toolself.tools.base import Tool, ToolContext, ToolError
from toolself.tools.collection import SearchResult
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


def run_queries(queries: list[str], ctx: ToolContext | None, k: int = RESULTS_PER_QUERY,
                settings: WebSettings | None = None) -> list[QueryResults]:
    """Each query's results, minus the locators an earlier query already returned."""
    collection = getattr(ctx, "collection", None) if ctx is not None else None
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


def format_results(batches: list[QueryResults]) -> str:
    lines: list[str] = []
    number = 0
    for batch in batches:
        if len(batches) > 1:
            lines.append(f'Results for "{batch.query}":')
        if not batch.results and len(batches) > 1:
            lines.append("  (no new results)")
        for r in batch.results:
            number += 1
            lines.append(f"{number}. {r.title}\n   locator: {r.locator}\n   {r.snippet}")
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
        return format_results(run_queries(queries, ctx, settings=self.settings)) + note


def search_tool(settings: WebSettings | None) -> Tool:
    """`search` bound to `settings` (None: read from the environment at each call)."""
    return Tool(_Search(settings).search)


search = search_tool(None)
