"""Reading a web page: directly (httpx, trafilatura for HTML, markitdown for PDF and office
files), or through a reader service that speaks Jina Reader's protocol
(`GET {reader}/{url}`, JSON `{"code", "status", "data": {"title", "url", "content"}}` or the
markdown form with `Title:` / `URL Source:` / `Markdown Content:` headers).

A URL the model wrote is hostile input: the direct reader refuses loopback, private,
link-local and reserved addresses at every redirect hop, and the reader service is not asked
for a URL whose host resolves to one (a self-hosted reader inside a network would otherwise
fetch internal services for the model). TOOLSELF_VISIT_PRIVATE=1 allows them (a local
mirror, the tests).
"""

from __future__ import annotations

import io
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol
from urllib.parse import urlsplit

from toolself.tools.collection import Document, html_to_text
from toolself.tools.errors import ToolError
from toolself.tools.web.http import RetryPolicy, ServiceError, api_key, json_body, request

if TYPE_CHECKING:  # httpx loads with the first page read, not with the CLI
    import httpx

MAX_FETCH_BYTES = 10 * 1024 * 1024
FETCH_TIMEOUT_S = 20.0
_BINARY_TYPES = {"application/pdf": ".pdf", "application/msword": ".doc",
                 "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
                 "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
                 "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx"}


class PageReader(Protocol):
    name: str

    def read(self, url: str) -> Document: ...


def private_allowed() -> bool:
    return os.environ.get("TOOLSELF_VISIT_PRIVATE", "").lower() in {"1", "true", "yes"}


def _is_private(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return not ip.is_global or ip.is_multicast


def refuse_private_host(host: str, port: int | None, unresolvable_ok: bool = False) -> None:
    """ToolError when `host` is, or resolves to, a non-public address."""
    if private_allowed():
        return
    try:
        infos = socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        if unresolvable_ok:
            return
        raise ToolError(f"cannot resolve {host}: {exc}") from None
    for info in infos:
        if _is_private(info[4][0]):
            raise ToolError(f"refused: {host} is a private or local address ({info[4][0]}); "
                            "only public web pages can be visited")


def _refuse_private_hop(hop: httpx.Request) -> None:
    refuse_private_host(hop.url.host, hop.url.port)


@dataclass(frozen=True)
class DirectReader:
    """Fetches the page itself and keeps its main text."""

    name: ClassVar[str] = "direct"
    timeout: float = FETCH_TIMEOUT_S

    def read(self, url: str) -> Document:
        import httpx

        try:
            with httpx.Client(timeout=self.timeout, follow_redirects=True, max_redirects=5,
                              event_hooks={"request": [_refuse_private_hop]},
                              headers={"User-Agent": "toolself/0.1 (+visit)"}) as client, \
                    client.stream("GET", url) as response:
                response.raise_for_status()
                body = bytearray()
                for chunk in response.iter_bytes():
                    body.extend(chunk)
                    if len(body) > MAX_FETCH_BYTES:
                        break
                content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
                encoding = response.encoding or "utf-8"
        except httpx.HTTPStatusError as exc:
            raise ToolError(f"{url} answered HTTP {exc.response.status_code}") from None
        except httpx.HTTPError as exc:
            raise ToolError(f"could not fetch {url}: {type(exc).__name__}: {exc}") from None
        return page_document(url, bytes(body), content_type, encoding)


def page_document(url: str, raw: bytes, content_type: str, encoding: str = "utf-8") -> Document:
    """The readable text of a fetched body: office files and PDFs through markitdown, HTML
    through trafilatura (all visible text when trafilatura keeps too little), text as is."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or url
    extension = _BINARY_TYPES.get(content_type) or (".pdf" if raw.startswith(b"%PDF") else None)
    if extension:
        return Document(url, name, _markitdown_text(raw, extension))
    html = raw.decode(encoding, errors="replace")
    if "html" not in content_type and not re.search(r"<html|<body|<p[ >]", html[:2000], re.IGNORECASE):
        return Document(url, url, html)
    title, fallback = html_to_text(html)
    import trafilatura

    text = trafilatura.extract(html, url=url, include_tables=True, include_comments=False,
                               output_format="markdown", favor_recall=True)
    return Document(url, title or url, text if text and len(text) > len(fallback) // 10 else fallback)


def _markitdown_text(raw: bytes, extension: str) -> str:
    try:
        from markitdown import MarkItDown, StreamInfo
    except ImportError:
        raise ToolError("reading PDF and office pages needs markitdown (pip install 'toolself[tools]')") from None
    try:
        result = MarkItDown(enable_plugins=False).convert_stream(io.BytesIO(raw),
                                                                 stream_info=StreamInfo(extension=extension))
    except Exception as exc:
        raise ToolError(f"the {extension} document could not be converted to text ({type(exc).__name__})") from None
    return result.text_content or ""


_MARKDOWN_FIELD = re.compile(r"^(Title|URL Source):\s*(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class JinaReader:
    """A reader service with Jina Reader's protocol; the key (JINA_API_KEY or JINA_KEY) is
    optional because self-hosted readers take none."""

    url: str = "https://r.jina.ai"
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    name: ClassVar[str] = "jina"
    key_names: ClassVar[tuple[str, ...]] = ("JINA_API_KEY", "JINA_KEY")

    def read(self, url: str) -> Document:
        parts = urlsplit(url)
        if parts.hostname:
            refuse_private_host(parts.hostname, parts.port, unresolvable_ok=True)
        headers = {"Accept": "application/json", "X-Return-Format": "markdown"}
        key = api_key(self.key_names)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        response = request("the reader service", "GET", f"{self.url.rstrip('/')}/{url}", policy=self.policy,
                           key_names=self.key_names, headers=headers)
        if "json" not in response.headers.get("content-type", ""):
            return _markdown_document(url, response.text)
        payload = json_body("the reader service", response)
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, dict) or not isinstance(data.get("content"), str):
            raise ServiceError("the reader service answered without the documented `data.content` field")
        title = data.get("title") if isinstance(data.get("title"), str) and data.get("title") else url
        return Document(url, title, data["content"])


def _markdown_document(url: str, text: str) -> Document:
    fields = dict(_MARKDOWN_FIELD.findall(text[:2000]))
    body = text.split("Markdown Content:", 1)[1] if "Markdown Content:" in text else text
    return Document(url, fields.get("Title", "").strip() or url, body.strip())


READERS = ("direct", "jina")


def make_reader(name: str, url: str | None = None, policy: RetryPolicy | None = None) -> PageReader:
    if name == "direct":
        return DirectReader()
    if name == "jina":
        return JinaReader(url or os.environ.get("JINA_READER_URL", "").strip() or JinaReader.url,
                          policy or RetryPolicy())
    raise ValueError(f"unknown page reader {name!r}; choose one of {list(READERS)}")
