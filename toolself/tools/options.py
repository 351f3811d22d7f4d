"""The tools a run uses, as one typed record: the pool's shape (built-ins, user tools, MCP
servers, a tools config, a document collection), the web services behind `search` and
`visit`, the vision model behind `file_analyzer`, the judge, and the needs a user allows to
be missing. Parsed once from the command line (`toolself.cli_options`), stored as a plain
dict where a run must be resumable (a CAT pipeline's state), and turned into a pool here."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolself.tools.web.settings import WebSettings


def _split(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@dataclass(frozen=True)
class ToolOptions:
    docs: Path | None = None
    tools: tuple[str, ...] | None = None
    user_tools: tuple[str, ...] = ()
    mcp: tuple[str, ...] = ()
    tools_config: Path | None = None
    web: WebSettings = WebSettings()
    judge: str | None = None
    allow_missing: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, docs: Path | None = None, tools: str | None = None, user_tools: list[str] = (),
              mcp: list[str] = (), tools_config: Path | None = None, search: str | None = None,
              search_url: str | None = None, reader: str | None = None, reader_url: str | None = None,
              visit_model: str | None = None, vision_model: str | None = None, judge: str | None = None,
              allow_missing: list[str] = ()) -> "ToolOptions":
        """Raises ValueError naming the option at fault (`--allow-missing` values are checked
        where needs are known, `evals.preflight`)."""
        if docs is not None and not Path(docs).exists():
            raise ValueError(f"--docs {docs} does not exist")
        if tools_config is not None and not Path(tools_config).is_file():
            raise ValueError(f"--tools-config {tools_config} is not a file")
        if judge is not None and not judge.startswith("openai:"):
            raise ValueError(f"--judge takes openai:NAME@URL, not {judge!r}")
        allowed = frozenset(_split(list(allow_missing)))
        web = WebSettings.from_env(search=search, search_url=search_url, reader=reader, reader_url=reader_url,
                                   visit_model=visit_model, vision_model=vision_model)
        return cls(docs=Path(docs) if docs else None, tools=tuple(_split([tools])) if tools else None,
                   user_tools=tuple(user_tools), mcp=tuple(mcp), tools_config=tools_config, web=web, judge=judge,
                   allow_missing=allowed)

    def with_cache(self, folder: Path) -> "ToolOptions":
        """The web answers cached under `folder` unless TOOLSELF_WEB_CACHE chose a place."""
        return self if self.web.cache_dir else replace(self, web=replace(self.web, cache_dir=Path(folder)))

    def pool(self, preset: Any = None):
        """The global pool these options name, with `search`, `visit` and `file_analyzer` bound
        to the web settings, and reshaped by a run preset's tool behaviour when one is given."""
        from toolself.tools.files import file_analyzer_tool
        from toolself.tools.registry import default_pool
        from toolself.tools.search import search_tool
        from toolself.tools.visit import visit_tool

        pool = default_pool(include=list(self.tools) if self.tools is not None else None,
                            mcp_servers=list(self.mcp) or None, user_tools=list(self.user_tools) or None,
                            config=self.tools_config)
        for bound in (search_tool(self.web, self.docs), visit_tool(self.web, self.docs), file_analyzer_tool(self.web)):
            if bound.name in pool:
                pool.replace(bound)
        if preset is not None:
            try:
                preset.adapt_pool(pool, self.web, self.docs)
            except BaseException:
                pool.close()
                raise
        return pool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record (names and addresses, never a key), for a run's saved settings."""
        return {"docs": str(self.docs) if self.docs else None, "tools": list(self.tools) if self.tools else None,
                "user_tools": list(self.user_tools), "mcp": list(self.mcp),
                "tools_config": str(self.tools_config) if self.tools_config else None,
                "web": self.web.to_dict(), "judge": self.judge, "allow_missing": sorted(self.allow_missing)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ToolOptions":
        return cls(docs=Path(data["docs"]) if data.get("docs") else None,
                   tools=tuple(data["tools"]) if data.get("tools") else None,
                   user_tools=tuple(data.get("user_tools") or ()), mcp=tuple(data.get("mcp") or ()),
                   tools_config=Path(data["tools_config"]) if data.get("tools_config") else None,
                   web=WebSettings.from_dict(data.get("web") or {}), judge=data.get("judge"),
                   allow_missing=frozenset(data.get("allow_missing") or ()))

    def collection(self):
        if self.docs is None:
            return None
        from toolself.tools.collection import Collection

        return Collection.from_path(self.docs)


def default_web_cache() -> Path:
    """Where `toolself run` keeps web answers (an eval keeps them in its output folder)."""
    base = os.environ.get("TOOLSELF_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "toolself") / "web"
