"""`file_analyzer`: the text of PDF, DOCX, XLSX, PPTX, CSV, HTML, JSON (and plain text) files.

Conversion goes through markitdown, which renders tables as markdown tables, the form small
models read best. Long results are paginated like `visit`, never cut silently, and each
converted file is kept per attempt (by path, size and modification time) so that reading
page 2 does not convert again. Paths are confined to the workspace exactly as the editor's
are; the file is read through the same link-refusing open.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

from toolself.tools.base import ToolContext, ToolError, tool
from toolself.tools.editor import Workspace
from toolself.tools.visit import paginate

MAX_BYTES = 50 * 1024 * 1024
PLAIN = {".txt", ".md", ".markdown", ".rst", ".py", ".log", ".tsv", ".yaml", ".yml", ".toml", ".ini", ".xml"}

_converter = None
_converter_lock = threading.Lock()


def converter():
    """One MarkItDown per process: building it loads its format detectors (about 2 s)."""
    global _converter
    with _converter_lock:
        if _converter is None:
            try:
                from markitdown import MarkItDown
            except ImportError:
                raise ToolError("file_analyzer needs markitdown (pip install 'toolself[tools]')") from None
            _converter = MarkItDown(enable_plugins=False)
        return _converter


def convert_bytes(data: bytes, name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix in PLAIN:
        return data.decode("utf-8", errors="replace")
    from markitdown import StreamInfo

    try:
        result = converter().convert_stream(io.BytesIO(data), stream_info=StreamInfo(extension=suffix, filename=name))
    except Exception as exc:
        kind = type(exc).__name__
        if kind in {"UnsupportedFormatException"}:
            raise ToolError(f"{name}: this file type ({suffix or 'no extension'}) cannot be converted to text") from None
        raise ToolError(f"{name}: conversion failed ({kind}: {str(exc)[:300]})") from None
    return result.text_content or ""


@tool
def file_analyzer(path: str, ctx: ToolContext, page: int = 1) -> str:
    """Read a document file of the workspace as text: PDF, DOCX, XLSX, PPTX, CSV, HTML, JSON or plain text.

    Tables come out as markdown tables; long documents are split into pages.

    Args:
        path: The file, relative to the workspace root.
        page: Which page of the text to read, starting at 1.
    """
    if ctx is None:
        raise ToolError("file_analyzer needs a task context (a workspace)")
    if page < 1:
        raise ToolError("page starts at 1")
    ws = Workspace(ctx.workspace)
    real = ws.resolve(path)
    shown = ws.display(real)
    if not real.exists():
        raise ToolError(f"{shown} does not exist")
    if not real.is_file():
        raise ToolError(f"{shown} is not a file")
    st = real.stat()
    if st.st_size > MAX_BYTES:
        raise ToolError(f"{shown} is {st.st_size >> 20} MB; file_analyzer reads files up to {MAX_BYTES >> 20} MB")
    cache: dict = ctx.resources.setdefault("file_analyzer_pages", {})
    key = (str(real), st.st_size, st.st_mtime_ns)
    if key not in cache:
        cache[key] = paginate(convert_bytes(ws.read_bytes(real), real.name))
    pages = cache[key]
    if page > len(pages):
        raise ToolError(f"{shown} has {len(pages)} page(s); page {page} does not exist")
    text = pages[page - 1] or "(the file has no text)"
    header = f"{shown}" + (f" (page {page} of {len(pages)})" if len(pages) > 1 else "")
    footer = f"\n\n[page {page} of {len(pages)}; call file_analyzer with page={page + 1} to read on]" if page < len(pages) else ""
    return f"{header}\n\n{text}{footer}"
