"""`visit`: read a document of the collection, or a web page when online, one page at a time.

Long documents are cut into pages of a fixed size and the observation says which page this
is, how many there are, and how to ask for the next: nothing is dropped silently, and the
model decides whether reading on is worth its context. With a `goal` and a policy model in
the context, the page is handed to the model with a short extraction prompt and only the
relevant parts come back (the paper's goal-directed reading); without a model the page is
returned as is.

Locators that are not exact get one chance: a unique, close match on title or locator is
accepted; otherwise the error lists the nearest candidates so the next call can be right.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass

import httpx

from toolself.tools.base import ToolContext, ToolError, tool
from toolself.tools.collection import Document, html_to_text

PAGE_CHARS = 6000
FETCH_TIMEOUT_S = 20.0
MAX_FETCH_BYTES = 10 * 1024 * 1024
EXTRACT_MAX_TOKENS = 600


@dataclass(frozen=True)
class Page:
    document: Document
    number: int
    count: int
    text: str


def paginate(text: str, page_chars: int = PAGE_CHARS) -> list[str]:
    """Split at the last paragraph, line or word break before each page boundary."""
    pages = []
    rest = text.strip()
    while len(rest) > page_chars:
        cut = -1
        for sep in ("\n\n", "\n", " "):
            cut = rest.rfind(sep, page_chars // 2, page_chars)
            if cut > 0:
                break
        if cut <= 0:
            cut = page_chars
        pages.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    pages.append(rest)
    return pages


def online() -> bool:
    return bool(os.environ.get("SEARX_HOST")) or os.environ.get("TOOLSELF_ONLINE", "").lower() in {"1", "true", "yes"}


def _refuse_private(request: httpx.Request) -> None:
    """Refuse loopback, private, link-local and reserved addresses (every redirect hop too):
    a page the model read must not be able to send it to a cloud metadata endpoint or an
    internal service. TOOLSELF_VISIT_PRIVATE=1 allows them (a local mirror, the tests)."""
    if os.environ.get("TOOLSELF_VISIT_PRIVATE", "").lower() in {"1", "true", "yes"}:
        return
    host = request.url.host
    try:
        infos = socket.getaddrinfo(host, request.url.port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ToolError(f"cannot resolve {host}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global or address.is_multicast:
            raise ToolError(f"refused: {host} is a private or local address ({address}); "
                            "only public web pages can be visited")


def fetch_url(url: str) -> Document:
    """Fetch a page and keep its main text (trafilatura), falling back to all visible text."""
    if not online():
        raise ToolError(f"cannot open {url}: this run is offline (set SEARX_HOST or TOOLSELF_ONLINE=1 to allow the web)")
    try:
        with httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=True, max_redirects=5,
                          event_hooks={"request": [_refuse_private]},
                          headers={"User-Agent": "toolself/0.1 (+visit)"}) as client, \
                client.stream("GET", url) as response:
            response.raise_for_status()
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > MAX_FETCH_BYTES:
                    break
            content_type = response.headers.get("content-type", "")
            encoding = response.encoding or "utf-8"
    except httpx.HTTPStatusError as exc:
        raise ToolError(f"{url} answered HTTP {exc.response.status_code}") from None
    except httpx.HTTPError as exc:
        raise ToolError(f"could not fetch {url}: {type(exc).__name__}: {exc}") from None
    raw = bytes(body)
    if "pdf" in content_type or raw.startswith(b"%PDF"):
        return Document(url, url.rsplit("/", 1)[-1] or url, _pdf_bytes_text(raw))
    html = raw.decode(encoding, errors="replace")
    if "html" not in content_type and not re.search(r"<html|<body|<p[ >]", html[:2000], re.IGNORECASE):
        return Document(url, url, html)
    title, fallback = html_to_text(html)
    text = None
    try:
        import trafilatura

        text = trafilatura.extract(html, url=url, include_tables=True, include_comments=False,
                                   output_format="markdown", favor_recall=True)
    except ImportError:
        pass
    return Document(url, title or url, text if text and len(text) > len(fallback) // 10 else fallback)


def _pdf_bytes_text(raw: bytes) -> str:
    import io

    try:
        from pdfminer.high_level import extract_text
    except ImportError:
        raise ToolError("reading PDF pages needs pdfminer.six (pip install 'toolself[tools]')") from None
    return extract_text(io.BytesIO(raw))


def resolve_local(collection, locator: str) -> Document:
    """Exact locator; else a unique title or near-locator match; else an error naming candidates."""
    doc = collection.get(locator)
    if doc is not None:
        return doc
    wanted = locator.strip().lower()
    by_title = [d for d in collection.documents if d.title.strip().lower() == wanted]
    if len(by_title) == 1:
        return by_title[0]
    keys: dict[str, Document] = {}
    for d in collection.documents:
        keys.setdefault(d.locator.lower(), d)
        keys.setdefault(d.title.strip().lower(), d)
    close = difflib.get_close_matches(wanted, list(keys), n=8, cutoff=0.6)
    candidates = list(dict.fromkeys(keys[c].locator for c in close))
    ratios = sorted(((difflib.SequenceMatcher(None, wanted, c).ratio(), keys[c].locator) for c in close), reverse=True)
    rivals = [r for r, loc in ratios[1:] if loc != ratios[0][1]] if ratios else []
    if ratios and ratios[0][0] >= 0.85 and (not rivals or rivals[0] < ratios[0][0] - 0.1):
        return collection.get(ratios[0][1])
    if len(by_title) > 1:
        candidates = [d.locator for d in by_title]
    if candidates:
        listing = "\n".join(f"- {c} ({collection.get(c).title})" for c in candidates[:5])
        raise ToolError(f"no document with locator {locator!r}. Near matches:\n{listing}\nCall visit with one of these locators.")
    raise ToolError(f"no document with locator {locator!r} in the collection; use search to find locators")


def open_document(locator: str, ctx: ToolContext | None) -> Document:
    collection = getattr(ctx, "collection", None) if ctx is not None else None
    if collection is not None and locator in collection:
        return collection.get(locator)
    if re.match(r"^https?://", locator, re.IGNORECASE):
        cache = ctx.resources.setdefault("visit_pages", {}) if ctx is not None else {}
        if locator not in cache:
            cache[locator] = fetch_url(locator)
        return cache[locator]
    if collection is None:
        raise ToolError(f"{locator!r} is not a URL and this task has no document collection")
    return resolve_local(collection, locator)


def extract_for_goal(model, page: Page, goal: str) -> str:
    from toolself.models.base import Message

    prompt = (
        f"Goal: {goal}\n\n"
        f"Document: {page.document.title} ({page.document.locator}), page {page.number} of {page.count}\n"
        f"-----\n{page.text}\n-----\n\n"
        "Copy out every passage of the document that helps with the goal, quoting facts, names, numbers "
        "and dates exactly. If nothing on this page is relevant, answer exactly: Nothing relevant on this page."
    )
    completion = model.complete(
        [Message("system", "You read documents and extract only what serves a stated goal."),
         Message("user", prompt)],
        max_tokens=EXTRACT_MAX_TOKENS,
    )
    return (completion.text or "").strip()


@tool
def visit(locator: str, ctx: ToolContext, page: int = 1, goal: str | None = None) -> str:
    """Read a document (by the locator a search returned) or a web page, one page at a time.

    Args:
        locator: The document's locator from a search result, or an http(s) URL.
        page: Which page of a long document to read, starting at 1.
        goal: Optional: what you are looking for; only the parts relevant to it are returned.
    """
    if page < 1:
        raise ToolError("page starts at 1")
    doc = open_document(locator.strip(), ctx)
    pages = paginate(doc.text)
    if page > len(pages):
        raise ToolError(f"{doc.locator} has {len(pages)} page(s); page {page} does not exist")
    current = Page(doc, page, len(pages), pages[page - 1])
    header = f"# {doc.title}\nlocator: {doc.locator}"
    if len(pages) > 1:
        header += f"\npage {page} of {len(pages)}"
    footer = ""
    if page < len(pages):
        footer = f"\n\n[page {page} of {len(pages)}; to read on, call visit with locator={doc.locator!r} and page={page + 1}]"
    model = getattr(ctx, "model", None) if ctx is not None else None
    if goal and model is not None:
        try:
            extracted = extract_for_goal(model, current, goal)
        except Exception as exc:  # a failed extraction still leaves the page itself useful
            return f"{header}\n(goal-directed extraction failed: {type(exc).__name__}: {exc}; full page follows)\n\n{current.text}{footer}"
        return f"{header}\nparts relevant to the goal {goal!r}:\n\n{extracted or 'Nothing relevant on this page.'}{footer}"
    if not current.text:
        return f"{header}\n\n(the document is empty)"
    return f"{header}\n\n{current.text}{footer}"
