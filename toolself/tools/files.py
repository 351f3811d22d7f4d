"""`file_analyzer`: the text of PDF, DOCX, XLSX, PPTX, CSV, HTML, JSON (and plain text) files,
and what the run's vision model sees in images.

Conversion goes through markitdown, which renders tables as markdown tables, the form small
models read best. Document parsers are large and the files are untrusted (a task's own code
may have written them), so parsing happens in a separate converter process per attempt under
the same sandbox as the code tools (unprivileged uid when the host is root, memory and CPU
limits, a timeout): a decompression bomb or a parser crash costs one observation, not the
agent. The host reads the file (link-safely, regular files only: toolself.tools.workspace)
and sends the bytes; files up to `MAX_BYTES` (50 MB) are read.

Long results are paginated like `visit`, never cut silently, and each converted file is kept
per attempt (by path, size and modification time) so that reading page 2 does not convert
again.

A PNG, JPEG, GIF or WebP file (known by its first bytes, whatever its name) is not converted:
its bytes, up to 20 MB, go to the run's vision model (`--vision-model`) with the goal, or
with a request for a full description when the tool has no goal (`toolself.tools.vision`);
without a vision model the observation says so and names the option.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

from toolself.tools.base import Tool, ToolContext, ToolError
from toolself.tools.sandbox import LIMITS_PRELUDE, SandboxedProcess, SandboxUser, limits_for
from toolself.tools.vision import DESCRIBE_GOAL, MAX_IMAGE_BYTES, SIGNATURE_BYTES, Image, VisionReader, image_type
from toolself.tools.visit import Visit, extract_evidence, paginate
from toolself.tools.web.settings import WebSettings
from toolself.tools.workspace import Location, Workspace, kind_of

MAX_BYTES = 50 * 1024 * 1024
MAX_TEXT_CHARS = 5_000_000
CONVERT_TIMEOUT_S = 120.0
PLAIN = {".txt", ".md", ".markdown", ".rst", ".py", ".log", ".tsv", ".yaml", ".yml", ".toml", ".ini", ".xml"}

CONVERTER = LIMITS_PRELUDE + r'''
import base64, io, site, sys
for _d in json.loads(os.environ.pop("TOOLSELF_SITE_DIRS", "[]")):
    site.addsitedir(_d)
_ctl_in = os.fdopen(int(os.environ.pop("TOOLSELF_CTL_IN")), "rb", buffering=0)
_ctl_out = int(os.environ.pop("TOOLSELF_CTL_OUT"))
_mark = os.environ.pop("TOOLSELF_MARK").encode()
_cap = int(os.environ.pop("TOOLSELF_TEXT_CHARS"))
_md = None


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _convert(request):
    global _md
    if _md is None:
        try:
            from markitdown import MarkItDown
        except ImportError:
            return {"error": "file_analyzer needs markitdown (pip install 'toolself[tools]')"}
        _md = MarkItDown(enable_plugins=False)
    from markitdown import StreamInfo
    data = base64.b64decode(request["data"])
    try:
        result = _md.convert_stream(io.BytesIO(data), stream_info=StreamInfo(extension=request["ext"], filename=request["name"]))
    except Exception as exc:
        kind = type(exc).__name__
        if kind == "UnsupportedFormatException":
            return {"error": f"this file type ({request['ext'] or 'no extension'}) cannot be converted to text"}
        return {"error": f"conversion failed ({kind}: {str(exc)[:300]})"}
    text = result.text_content or ""
    return {"text": text[:_cap], "cut": max(0, len(text) - _cap)}


_buffer = bytearray()
while True:
    while b"\n" not in _buffer:
        _chunk = _ctl_in.read(1 << 20)
        if not _chunk:
            os._exit(0)
        _buffer += _chunk
    _at = _buffer.index(b"\n")
    _request = json.loads(bytes(_buffer[:_at]))
    _id = _request.pop("id").encode()
    del _buffer[: _at + 1]
    try:
        _reply = _convert(_request)
    except MemoryError:
        _reply = {"error": "the conversion ran out of memory"}
    except BaseException as _exc:
        _reply = {"error": f"conversion failed ({type(_exc).__name__}: {str(_exc)[:300]})"}
    sys.stdout.flush()
    sys.stderr.flush()
    _write_all(1, _mark)
    _write_all(2, _mark)
    _write_all(_ctl_out, b"\n" + _id + b" " + (json.dumps(_reply) + "\n").encode())
'''


class Converter:
    """The attempt's converter process (markitdown loaded once, about 2 s)."""

    def __init__(self, user: SandboxUser, limits):
        interpreter = user.interpreter
        self.process = SandboxedProcess(
            "file converter", [interpreter.executable, "-c", CONVERTER], user, limits,
            extra_env={"TOOLSELF_SITE_DIRS": json.dumps(list(interpreter.site_dirs)),
                       "TOOLSELF_TEXT_CHARS": str(MAX_TEXT_CHARS)},
            reply_bytes=6 * MAX_TEXT_CHARS + 4096,  # the text, JSON-escaped at worst
        )

    @classmethod
    def for_context(cls, ctx: ToolContext) -> "Converter":
        converter = ctx.resources.get("file_converter")
        if converter is None:
            converter = cls(SandboxUser.for_context(ctx), limits_for(ctx))
            ctx.resources["file_converter"] = converter
        return converter

    def convert(self, data: bytes, name: str) -> str:
        fields = {"data": base64.b64encode(data).decode(), "ext": Path(name).suffix.lower(), "name": name}
        result = self.process.call(lambda call_id: json.dumps({"id": call_id, **fields}).encode() + b"\n",
                                   CONVERT_TIMEOUT_S)
        if result.status != "ok":
            raise ToolError(f"{name}: the conversion did not finish ({'; '.join(result.notes)})")
        try:
            reply = json.loads(result.reply or "")
        except ValueError:
            raise ToolError(f"{name}: the converter's answer was unreadable") from None
        if "error" in reply:
            raise ToolError(f"{name}: {reply['error']}")
        return _with_cut(reply["text"], reply.get("cut", 0))

    def close(self) -> None:
        self.process.close()


def _with_cut(text: str, cut: int) -> str:
    if cut > 0:
        text += f"\n\n[... the last {cut:,} characters of the converted text were cut ...]"
    return text


def convert_bytes(data: bytes, name: str, ctx: ToolContext) -> str:
    if Path(name).suffix.lower() in PLAIN:
        text = data.decode("utf-8", errors="replace")
        return _with_cut(text[:MAX_TEXT_CHARS], len(text) - MAX_TEXT_CHARS)
    return Converter.for_context(ctx).convert(data, name)


def _located(path: str, ctx: ToolContext) -> tuple[Workspace, Location]:
    """The regular file `path` names inside the workspace (links followed only inside it)."""
    if ctx is None:
        raise ToolError("file_analyzer needs a task context (a workspace)")
    ws = Workspace.of(ctx)
    loc = ws.locate(path)
    if loc.kind == "missing":
        raise ToolError(f"{loc.shown} does not exist")
    if loc.kind != "file":
        raise ToolError(f"{loc.shown} is {kind_of(loc.st.st_mode)}, not a file")
    return ws, loc


def _read_at_most(handle, cap: int, shown: str) -> bytes:
    """The whole file, which its size said is at most `cap` bytes; one that grew since is refused."""
    data = handle.read(cap + 1)
    if len(data) > cap:
        raise ToolError(f"{shown} grew past {cap >> 20} MB while it was read")
    return data


def _contents(ws: Workspace, loc: Location, ctx: ToolContext) -> Image | list[str]:
    """The file as an image (its signature is an image's) or as its converted text in pages
    (cached per attempt), from one opening: what is judged is what is read. An image over
    `MAX_IMAGE_BYTES`, or another file over `MAX_BYTES`, is refused."""
    with ws.open_file(loc) as (handle, st):
        mime = image_type(handle.read(SIGNATURE_BYTES))
        handle.seek(0)
        if mime is not None:
            if st.st_size > MAX_IMAGE_BYTES:
                raise ToolError(f"{loc.shown} is an image of {st.st_size / 2 ** 20:.1f} MB; file_analyzer sends "
                                f"images up to {MAX_IMAGE_BYTES >> 20} MB to the vision model")
            return Image(_read_at_most(handle, MAX_IMAGE_BYTES, loc.shown), mime)
        if st.st_size > MAX_BYTES:
            raise ToolError(f"{loc.shown} is {st.st_size >> 20} MB; file_analyzer reads files up to "
                            f"{MAX_BYTES >> 20} MB")
        cache: dict = ctx.resources.setdefault("file_analyzer_pages", {})
        key = (loc.parts, st.st_size, st.st_mtime_ns)
        if key not in cache:
            cache[key] = paginate(convert_bytes(_read_at_most(handle, MAX_BYTES, loc.shown), loc.parts[-1], ctx))
    return cache[key]


GOAL_READ_CHARS = 100_000


@dataclass
class Files:
    """The tool's state: the run's settings, the text model of goal readings (`visit`'s
    summariser) and the vision model images go to, both built on first use."""

    settings: WebSettings | None = None
    max_chars: int = GOAL_READ_CHARS
    reader: Visit = field(init=False)
    vision: VisionReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = Visit(self.settings)
        self.vision = VisionReader(self.settings)

    def read(self, path: str, ctx: ToolContext, page: int = 1) -> str:
        """Read a file of the workspace: the text of a PDF, DOCX, XLSX, PPTX, CSV, HTML, JSON or
        text file, or a description of an image (PNG, JPEG, GIF, WebP).

        Tables come out as markdown tables; long documents are split into pages.

        Args:
            path: The file, relative to the workspace root.
            page: Which page of the text to read, starting at 1.
        """
        if page < 1:
            raise ToolError("page starts at 1")
        ws, loc = _located(path, ctx)
        contents = _contents(ws, loc, ctx)
        if isinstance(contents, Image):
            if page > 1:
                raise ToolError(f"{loc.shown} is an image; it has one page")
            return f"{loc.shown}\n\n{self.vision.read(contents, DESCRIBE_GOAL, loc.shown)}"
        pages = contents
        if page > len(pages):
            raise ToolError(f"{loc.shown} has {len(pages)} page(s); page {page} does not exist")
        text = pages[page - 1] or "(the file has no text)"
        header = f"{loc.shown}" + (f" (page {page} of {len(pages)})" if len(pages) > 1 else "")
        footer = (f"\n\n[page {page} of {len(pages)}; call file_analyzer with page={page + 1} to read on]"
                  if page < len(pages) else "")
        return f"{header}\n\n{text}{footer}"

    def analyse(self, path: str, goal: str, ctx: ToolContext) -> str:
        """Analyse a file of the workspace for a goal: a document (PDF, DOCX, XLSX, PPTX, CSV,
        HTML, JSON or text) or an image (PNG, JPEG, GIF, WebP).

        Args:
            path: The file, relative to the workspace root.
            goal: What you want to learn from the file.
        """
        ws, loc = _located(path, ctx)
        contents = _contents(ws, loc, ctx)
        if isinstance(contents, Image):
            return f"{loc.shown}\n\n{self.vision.read(contents, goal, loc.shown)}"
        pages = contents
        text = "".join(pages)[: self.max_chars]
        model = self.reader.summariser(self.settings or WebSettings.from_env(), ctx)
        if model is None or not text:
            return f"{loc.shown}\n\n{pages[0] if pages and pages[0] else '(the file has no text)'}"
        return f"{loc.shown}\n\n{extract_evidence(model, goal, loc.shown, text)}"


def file_analyzer_tool(settings: WebSettings | None) -> Tool:
    """`file_analyzer` bound to the run's settings (None: read from the environment at each
    call): documents as paginated text, images through the run's vision model."""
    return Tool(Files(settings).read, name="file_analyzer")


def goal_file_analyzer(max_chars: int = GOAL_READ_CHARS, settings: WebSettings | None = None) -> Tool:
    """`file_analyzer` in the authors' form (the `paper` preset): a file and a goal; the first
    `max_chars` characters of its text go to the text model `visit` summarises with (the run's
    `--visit-model`, else the attempt's model), which extracts the evidence for the goal as
    `visit` does (`visit.extract_evidence`); without a model, the first page. An image goes
    with the goal to the run's vision model (`toolself.tools.vision`)."""
    return Tool(Files(settings, max_chars).analyse, name="file_analyzer")


file_analyzer = file_analyzer_tool(None)
