"""`search`: ranked results (title, locator, snippet) for one query or several.

The paper's agent sends several phrasings at once; results are deduplicated by locator
across them so that the model reads each document's entry once. The backend is the task's
local collection when it has one (every offline suite and test), otherwise a SearxNG
instance named by `SEARX_HOST` (its JSON API), otherwise the call says that no backend is
configured: an error the model can read, never an exception into the agent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx

from toolself.tools.base import ToolContext, ToolError, tool
from toolself.tools.collection import SearchResult

RESULTS_PER_QUERY = 5
MAX_QUERIES = 8
WEB_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class QueryResults:
    query: str
    results: list[SearchResult]


def searx_search(query: str, k: int = RESULTS_PER_QUERY, host: str | None = None) -> list[SearchResult]:
    """Query a SearxNG instance's JSON API (`/search?format=json&q=`)."""
    host = (host or os.environ.get("SEARX_HOST", "")).rstrip("/")
    if not host:
        raise ToolError("web search is not configured (set SEARX_HOST to a SearxNG instance)")
    if "://" not in host:
        host = "http://" + host
    try:
        response = httpx.get(f"{host}/search", params={"q": query, "format": "json"}, timeout=WEB_TIMEOUT_S,
                             follow_redirects=True)
        response.raise_for_status()
        payload = response.json()
    except httpx.HTTPStatusError as exc:
        raise ToolError(f"the search service answered HTTP {exc.response.status_code}") from None
    except httpx.HTTPError as exc:
        raise ToolError(f"the search service could not be reached: {type(exc).__name__}: {exc}") from None
    except ValueError:
        raise ToolError("the search service did not answer JSON (is format=json enabled in its settings?)") from None
    results = []
    for rank, row in enumerate(payload.get("results") or []):
        url = row.get("url")
        if not url:
            continue
        results.append(SearchResult(locator=url, title=(row.get("title") or url).strip(),
                                    snippet=" ".join((row.get("content") or "").split()),
                                    score=float(row.get("score") or 1.0 / (rank + 1))))
        if len(results) >= k:
            break
    return results


def run_queries(queries: list[str], ctx: ToolContext | None, k: int = RESULTS_PER_QUERY) -> list[QueryResults]:
    """Each query's results, minus the locators an earlier query already returned."""
    collection = getattr(ctx, "collection", None) if ctx is not None else None
    if collection is None and not os.environ.get("SEARX_HOST"):
        raise ToolError("no search backend: this task has no document collection and SEARX_HOST is not set")
    seen: set[str] = set()
    out = []
    for query in queries:
        found = collection.search(query, k=k) if collection is not None else searx_search(query, k=k)
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


@tool
def search(query: str | list[str], ctx: ToolContext) -> str:
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
    return format_results(run_queries(queries, ctx)) + note
