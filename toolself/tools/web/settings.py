"""Which web services a run uses: one typed record, parsed once from options or the
environment, then handed to the `search` and `visit` tools it configures.

The environment variables are those of the official ToolSelf code and of the services'
clients, so a setup written for either works here:

    SEARX_HOST                                  SearxNG (search)
    SERPER_API_KEY, TAVILY_API_KEY,             hosted search APIs (keys are read at request
    BRAVE_API_KEY, JINA_API_KEY (or JINA_KEY)   time, never stored or recorded)
    JINA_READER_URL                             read pages through a Jina-Reader-style service
    VISIT_LLM_MODEL + VISIT_LLM_API_BASE_URL    the summariser model of `visit`
    FILE_ANALYZER_VISION_MODEL +                the vision model `file_analyzer` shows images
      FILE_ANALYZER_API_BASE_URL                to
    TOOLSELF_SEARCH, TOOLSELF_READER,           choose explicitly; TOOLSELF_WEB_CACHE holds
    TOOLSELF_VISIT_MODEL, TOOLSELF_WEB_CACHE,   the answers cache
    TOOLSELF_VISION_MODEL

With no search backend chosen, the first of SEARX_HOST, SERPER_API_KEY, TAVILY_API_KEY,
BRAVE_API_KEY, JINA_API_KEY that is set picks one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from toolself.tools.web.http import RetryPolicy
from toolself.tools.web.reader import READERS, PageReader, make_reader
from toolself.tools.web.search_backends import BACKENDS, WebSearchBackend, make_backend

_DETECT = (("searxng", ("SEARX_HOST",)), ("serper", ("SERPER_API_KEY",)), ("tavily", ("TAVILY_API_KEY",)),
           ("brave", ("BRAVE_API_KEY",)), ("jina", ("JINA_API_KEY", "JINA_KEY")))


def _env(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(name, "").strip() or None


def _model_env(environ: Mapping[str, str], spec: str, name: str, url: str) -> str | None:
    """A model spec from its own variable, else from the official code's name and URL pair."""
    if _env(environ, spec) is None and _env(environ, name) and _env(environ, url):
        return f"openai:{_env(environ, name)}@{_env(environ, url)}"
    return _env(environ, spec)


@dataclass(frozen=True)
class WebSettings:
    """search: a backend name (searxng, serper, tavily, brave, jina) or None for no web search
    (a task's own document collection is always searched first); search_url: its endpoint
    (default: its variable, such as SEARX_HOST or SERPER_URL, then the public service); reader:
    direct | jina; visit_model: the summariser model spec (openai:NAME@URL) or None (pages are
    paginated); vision_model: the model `file_analyzer` sends images to (openai:NAME@URL) or
    None (images are refused, naming the option that provides one); cache_dir: where service
    answers are kept (None: not cached); online: pages may be fetched even without a search
    backend (TOOLSELF_ONLINE=1); retry: attempts, backoff and timeout of every request."""

    search: str | None = None
    search_url: str | None = None
    reader: str = "direct"
    reader_url: str | None = None
    visit_model: str | None = None
    vision_model: str | None = None
    cache_dir: Path | None = None
    online: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.search is not None and self.search not in BACKENDS:
            raise ValueError(f"unknown search backend {self.search!r}; choose one of {sorted(BACKENDS)}")
        if self.reader not in READERS:
            raise ValueError(f"unknown page reader {self.reader!r}; choose one of {list(READERS)}")
        if self.visit_model is not None and not self.visit_model.startswith("openai:"):
            raise ValueError(f"--visit-model takes openai:NAME@URL, not {self.visit_model!r}")
        if self.vision_model is not None and not self.vision_model.startswith("openai:"):
            raise ValueError(f"--vision-model takes openai:NAME@URL, not {self.vision_model!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **chosen: object) -> "WebSettings":
        """Settings from the environment; `chosen` (options given on the command line) win."""
        env = os.environ if environ is None else environ
        search = _env(env, "TOOLSELF_SEARCH")
        if search is None:
            search = next((name for name, keys in _DETECT if any(_env(env, k) for k in keys)), None)
        visit_model = _model_env(env, "TOOLSELF_VISIT_MODEL", "VISIT_LLM_MODEL", "VISIT_LLM_API_BASE_URL")
        vision_model = _model_env(env, "TOOLSELF_VISION_MODEL", "FILE_ANALYZER_VISION_MODEL",
                                  "FILE_ANALYZER_API_BASE_URL")
        cache = _env(env, "TOOLSELF_WEB_CACHE")
        base = cls(search=search,
                   reader=_env(env, "TOOLSELF_READER") or ("jina" if _env(env, "JINA_READER_URL") else "direct"),
                   reader_url=_env(env, "JINA_READER_URL"), visit_model=visit_model, vision_model=vision_model,
                   cache_dir=Path(cache) if cache else None,
                   online=(_env(env, "TOOLSELF_ONLINE") or "").lower() in {"1", "true", "yes"})
        return replace(base, **{k: v for k, v in chosen.items() if v is not None})

    @property
    def web_allowed(self) -> bool:
        """Whether pages may be fetched from the web at all."""
        return self.online or self.search is not None or self.reader != "direct"

    def search_backend(self) -> WebSearchBackend | None:
        return make_backend(self.search, self.search_url, self.retry) if self.search else None

    def page_reader(self) -> PageReader:
        return make_reader(self.reader, self.reader_url, self.retry)

    def to_dict(self) -> dict[str, object]:
        """For run records and saved settings: names and endpoints, never a key."""
        return {"search": self.search, "search_url": self.search_url, "reader": self.reader,
                "reader_url": self.reader_url, "visit_model": self.visit_model, "vision_model": self.vision_model,
                "cache_dir": str(self.cache_dir) if self.cache_dir else None, "online": self.online}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> "WebSettings":
        values = dict(data)
        if values.get("cache_dir"):
            values["cache_dir"] = Path(str(values["cache_dir"]))
        return cls(**values)
