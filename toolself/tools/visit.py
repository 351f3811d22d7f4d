"""`visit`: read a document of the collection, or a web page when online, one page at a time.

Long documents are cut into pages of a fixed size and the observation says which page this
is, how many there are, and how to ask for the next: nothing is dropped silently, and the
model decides whether reading on is worth its context. With a `goal`, the page is handed to
a summariser with the extraction prompt `prompts/visit_extract.j2` and only the relevant
parts come back (the paper's goal-directed reading): the run's `--visit-model` when one is
set, else the policy model in the context; without either the page is returned as is. A
failed extraction returns the page itself with a note, since the page is still useful.

Web pages are read by the run's page reader (`WebSettings.reader`: directly or through a
reader service); their text is kept in the run's cache, so a rerun does not fetch twice.

`goal_visit_tool` is the authors' form of the tool (the `paper` preset): a list of URLs and a
required goal; each page is read whole up to a bound (150,000 characters there) and the
summariser answers with its rationale, the evidence and a summary, of which the evidence and
the summary come back.

Locators that are not exact get one chance: a unique, close match on title or locator is
accepted; otherwise the error lists the nearest candidates so the next call can be right.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from toolself.tools.base import Tool, ToolContext, ToolError
from toolself.tools.collection import Document
from toolself.tools.lazy_model import LazyModel
from toolself.tools.search import task_collection
from toolself.tools.web.cache import DiskCache
from toolself.tools.web.settings import WebSettings

PAGE_CHARS = 6000
GOAL_READ_CHARS = 150_000
EXTRACT_MAX_TOKENS = 600
SUMMARISER_TIMEOUT_S = 120.0
SUMMARISER_RETRIES = 3


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


def fetch_url(url: str, settings: WebSettings) -> Document:
    """The page as the run's reader gives it, through the run's cache."""
    if not settings.web_allowed:
        raise ToolError(f"cannot open {url}: this run is offline (configure a search backend or a reader, "
                        "or set TOOLSELF_ONLINE=1 to allow the web)")
    reader = settings.page_reader()
    cache = DiskCache(settings.cache_dir) if settings.cache_dir else None
    key = ["page", reader.name, getattr(reader, "url", ""), url]
    hit = cache.get(key) if cache is not None else None
    if isinstance(hit, dict):
        return Document(**hit)
    document = reader.read(url)
    if cache is not None:
        cache.put(key, asdict(document))
    return document


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


def open_document(locator: str, ctx: ToolContext | None, settings: WebSettings, docs: Path | None = None) -> Document:
    collection = task_collection(ctx, docs)
    if collection is not None and locator in collection:
        return collection.get(locator)
    if re.match(r"^https?://", locator, re.IGNORECASE):
        pages = ctx.resources.setdefault("visit_pages", {}) if ctx is not None else {}
        if locator not in pages:
            pages[locator] = fetch_url(locator, settings)
        return pages[locator]
    if collection is None:
        raise ToolError(f"{locator!r} is not a URL and this task has no document collection")
    return resolve_local(collection, locator)


def _template(name: str = "visit_extract.j2") -> jinja2.Template:
    source = resources.files("toolself").joinpath(f"prompts/{name}").read_text(encoding="utf-8")
    return jinja2.Template(source, undefined=jinja2.StrictUndefined, keep_trailing_newline=False)


def extract_for_goal(model, page: Page, goal: str) -> str:
    from toolself.models.base import Message

    prompt = _template().render(goal=goal, title=page.document.title, locator=page.document.locator,
                                number=page.number, count=page.count, text=page.text).strip()
    completion = model.complete(
        [Message("system", "You read documents and extract only what serves a stated goal."),
         Message("user", prompt)],
        max_tokens=EXTRACT_MAX_TOKENS,
    )
    return (completion.text or "").strip()


def extract_evidence(model, goal: str, source: str, text: str) -> str:
    """The authors' goal-directed reading of `text`: the summariser gives its rationale, the
    evidence and a summary as JSON; the evidence and the summary are returned (the whole reply
    when it is not that JSON)."""
    from toolself.models.base import Message

    prompt = _template("paper/visit_extract.j2").render(goal=goal, source=source, text=text).strip()
    return evidence_of(model.complete([Message("user", prompt)]).text)


def evidence_of(reply: str | None) -> str:
    """The evidence and the summary of a summariser's JSON reply (the whole reply when it is
    not that JSON): one shape for every goal-directed reading, of pages, files and images."""
    reply = (reply or "").strip()
    start, end = reply.find("{"), reply.rfind("}")
    try:
        data = json.loads(reply[start:end + 1]) if start != -1 and end > start else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not (data.get("evidence") or data.get("summary")):
        return reply or "Nothing relevant was found."
    return f"Evidence:\n{data.get('evidence') or '(none)'}\n\nSummary:\n{data.get('summary') or '(none)'}"


@dataclass
class Visit:
    """The tool's state: its settings, and the summariser built from them on first use (not
    pickled: a worker builds its own)."""

    settings: WebSettings | None = None
    docs: Path | None = None
    max_chars: int = GOAL_READ_CHARS
    _summariser: LazyModel = field(default_factory=LazyModel, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "docs": self.docs, "max_chars": self.max_chars}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"], state["docs"], state.get("max_chars", GOAL_READ_CHARS))

    def summariser(self, settings: WebSettings, ctx: ToolContext | None) -> Any:
        if settings.visit_model is None:
            return getattr(ctx, "model", None) if ctx is not None else None
        return self._summariser.get(settings.visit_model, timeout=SUMMARISER_TIMEOUT_S, max_retries=SUMMARISER_RETRIES)

    def visit(self, locator: str, ctx: ToolContext, page: int = 1, goal: str | None = None) -> str:
        """Read a document (by the locator a search returned) or a web page, one page at a time.

        Args:
            locator: The document's locator from a search result, or an http(s) URL.
            page: Which page of a long document to read, starting at 1.
            goal: Optional: what you are looking for; only the parts relevant to it are returned.
        """
        if page < 1:
            raise ToolError("page starts at 1")
        settings = self.settings or WebSettings.from_env()
        doc = open_document(locator.strip(), ctx, settings, self.docs)
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
        model = self.summariser(settings, ctx) if goal else None
        if model is not None:
            try:
                extracted = extract_for_goal(model, current, goal)
            except Exception as exc:  # a failed extraction still leaves the page itself useful
                return f"{header}\n(goal-directed extraction failed: {type(exc).__name__}: {exc}; full page follows)\n\n{current.text}{footer}"
            return f"{header}\nparts relevant to the goal {goal!r}:\n\n{extracted or 'Nothing relevant on this page.'}{footer}"
        if not current.text:
            return f"{header}\n\n(the document is empty)"
        return f"{header}\n\n{current.text}{footer}"


    def read_for_goal(self, url: list[str], goal: str, ctx: ToolContext) -> str:
        """Visit one or several web pages (or documents by their locator) and return what serves the goal.

        Args:
            url: The URLs (or document locators) to visit.
            goal: What you want to find in them.
        """
        urls = [url] if isinstance(url, str) else list(url)
        urls = [u.strip() for u in urls if u and u.strip()]
        if not urls or not goal.strip():
            raise ToolError("give at least one url and a goal")
        settings = self.settings or WebSettings.from_env()
        model = self.summariser(settings, ctx)
        parts = []
        for locator in urls:
            try:
                doc = open_document(locator, ctx, settings, self.docs)
            except ToolError as exc:
                parts.append(f"# {locator}\nThe page could not be read: {exc}")
                continue
            text = doc.text[: self.max_chars]
            if model is None:
                body = paginate(text)[0] if text else "(the page is empty)"
            else:
                try:
                    body = extract_evidence(model, goal, doc.locator, text)
                except Exception as exc:  # the page itself is still useful
                    body = f"(extraction failed: {type(exc).__name__}: {exc}; the page begins)\n{paginate(text)[0]}"
            parts.append(f"# {doc.title}\nurl: {doc.locator}\n\n{body}")
        return "\n\n=======\n\n".join(parts)


def goal_visit_tool(settings: WebSettings | None, docs: Path | None = None, max_chars: int = GOAL_READ_CHARS) -> Tool:
    """`visit` in the authors' form (see the module docs), reading up to `max_chars` of each page."""
    return Tool(Visit(settings, docs, max_chars).read_for_goal, name="visit")


def visit_tool(settings: WebSettings | None, docs: Path | None = None) -> Tool:
    """`visit` bound to `settings` (None: read from the environment at each call) and to the
    run's document collection `docs` for tasks that have none of their own."""
    return Tool(Visit(settings, docs).visit)


visit = visit_tool(None)
