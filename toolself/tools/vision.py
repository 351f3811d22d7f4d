"""Images for a vision model: what `file_analyzer` does with a PNG, JPEG, GIF or WebP file.

An image is recognised by its first bytes (its format's signature), not by its name, since a
task's files are named by whoever wrote them. The signatures are compared here rather than by
an image library because a library would parse the bytes, and they are hostile input the host
does not parse (DESIGN.md, "The trust boundary"); the vision model's server decodes them.

The image goes to the run's vision model (`--vision-model openai:NAME@URL`, `WebSettings.
vision_model`) as a base64 `data:` URL in an OpenAI `image_url` content part, with the goal in
the prompt `prompts/vision_extract.j2`, and its reply is read as every goal-directed reading
is (`visit.evidence_of`): the evidence and a summary. Images up to `MAX_IMAGE_BYTES` (20 MB,
the per-image limit of OpenAI's API; about 27 MB once base64-encoded) are sent; a larger one,
and any image in a run without a vision model, is refused with an observation that says why
and what would provide it. Answers are kept in the run's web cache, as page reads are, keyed by
the model, the image's hash, its name and the goal: a rerun, a resumed evaluation or the K
attempts of a collection pay for one reading.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

import jinja2

from toolself.tools.base import ToolError
from toolself.tools.lazy_model import LazyModel
from toolself.tools.web.settings import WebSettings

MAX_IMAGE_BYTES = 20 * 1024 * 1024
SIGNATURE_BYTES = 12
VISION_TIMEOUT_S = 120.0
VISION_MAX_TOKENS = 4096
DESCRIBE_GOAL = ("Describe the image completely, transcribing every piece of text, number, table, chart value "
                 "and label in it.")
NO_VISION = ("{source} is {kind} image and this run has no vision model to show it to, so it could not be "
             "analysed; pass --vision-model openai:NAME@URL (or set TOOLSELF_VISION_MODEL, or "
             "FILE_ANALYZER_VISION_MODEL with FILE_ANALYZER_API_BASE_URL)")

_PROMPTS = jinja2.Environment(loader=jinja2.PackageLoader("toolself", "prompts"), undefined=jinja2.StrictUndefined,
                              autoescape=False)


def image_type(head: bytes) -> str | None:
    """The MIME type of the image whose first bytes are `head`, or None when it is no PNG,
    JPEG, GIF or WebP image."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


@dataclass(frozen=True)
class Image:
    data: bytes
    mime: str

    @property
    def kind(self) -> str:
        """`a PNG`, `a JPEG`, ... for observations."""
        name = self.mime.split("/")[1].upper().replace("WEBP", "WebP")
        return f"a {name}"

    @property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass
class VisionReader:
    """The run's vision model, built on first use from its settings (None: from the
    environment at each call)."""

    settings: WebSettings | None = None
    _model: LazyModel = field(default_factory=LazyModel, repr=False)

    def model(self, settings: WebSettings | None = None) -> Any:
        settings = settings or self.settings or WebSettings.from_env()
        if settings.vision_model is None:
            return None
        return self._model.get(settings.vision_model, tool_protocol="native", temperature=0.0,
                               timeout=VISION_TIMEOUT_S, max_retries=settings.retry.attempts - 1,
                               backoff_base=settings.retry.backoff, backoff_max=settings.retry.max_delay)

    def read(self, image: Image, goal: str, source: str) -> str:
        """What the vision model finds in `image` for `goal`: its evidence and summary.
        Raises ToolError when there is no vision model or its server fails for good."""
        from toolself.tools.web.cache import DiskCache

        settings = self.settings or WebSettings.from_env()
        model = self.model(settings)
        if model is None:
            raise ToolError(NO_VISION.format(source=source, kind=image.kind))
        cache = DiskCache(settings.cache_dir) if settings.cache_dir else None
        key = ["vision", settings.vision_model, hashlib.sha256(image.data).hexdigest(), source, goal]
        hit = cache.get(key) if cache is not None else None
        if isinstance(hit, str):
            return hit
        from toolself.models.base import Message
        from toolself.tools.visit import evidence_of

        prompt = _PROMPTS.get_template("vision_extract.j2").render(goal=goal, source=source).strip()
        try:
            reply = model.complete([Message("user", prompt, images=[image.data_url])], max_tokens=VISION_MAX_TOKENS)
        except Exception as exc:  # the server's failure, after its retries, is the observation
            raise ToolError(f"{source} is {image.kind} image; the vision model could not analyse it: {exc}") from None
        if not (reply.text or "").strip():
            raise ToolError(f"{source} is {image.kind} image; the vision model answered with nothing")
        found = evidence_of(reply.text)
        if cache is not None:
            cache.put(key, found)
        return found
