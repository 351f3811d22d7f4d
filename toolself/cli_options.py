"""The tool options every agent-running command takes, defined once.

`run`, `eval`, `train cat`, `train study` and `serve` all take the same `--docs`, `--tools`,
`--user-tools`, `--mcp`, `--tools-config`, web (`--search`, `--search-url`, `--reader`,
`--reader-url`, `--visit-model`), `--judge` and `--allow-missing` options. `@tool_options`
adds them to a command's signature (so typer shows them in its help) and hands the command
one parsed `ToolOptions` as its `tool_options` argument: the strings are parsed here, once,
and nothing below the command line reads them again.

    @app.command()
    @tool_options
    def run(task: str, ..., tool_options: ToolOptions) -> None:
        pool = tool_options.pool()
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from toolself.tools.web.settings import WebSettings


@dataclass(frozen=True)
class _Option:
    annotation: Any
    default: Any
    help: str


OPTIONS: dict[str, _Option] = {
    "docs": _Option(Optional[Path], None, "A folder or JSONL of documents for search and visit."),
    "tools": _Option(Optional[str], None, "Comma-separated built-in tools for the pool (default: all)."),
    "user_tools": _Option(list[str], [], "A Python file or module whose @tool functions join the pool. Repeatable."),
    "mcp": _Option(list[str], [], "An MCP server whose tools join the pool: NAME=COMMAND or NAME=URL. Repeatable."),
    "tools_config": _Option(Optional[Path], None, "A tools config file (include, userTools, mcpServers)."),
    "search": _Option(Optional[str], None, "Web search backend: searxng | serper | tavily | brave | jina "
                                           "(default: from SEARX_HOST or the first API key set)."),
    "search_url": _Option(Optional[str], None, "The search backend's endpoint (default: its variable, e.g. "
                                               "SEARX_HOST, else the public service)."),
    "reader": _Option(Optional[str], None, "How visit reads web pages: direct | jina (a Jina-Reader-style "
                                           "service; default: jina when JINA_READER_URL is set)."),
    "reader_url": _Option(Optional[str], None, "The reader service's address (default: JINA_READER_URL, else "
                                               "r.jina.ai)."),
    "visit_model": _Option(Optional[str], None, "Summariser for goal-directed visits: openai:NAME@URL (default: "
                                                "VISIT_LLM_MODEL at VISIT_LLM_API_BASE_URL, else the policy)."),
    "judge": _Option(Optional[str], None, "LLM judge for free-text answers (FRAMES, xbench): openai:NAME@URL."),
    "allow_missing": _Option(list[str], [], "Run even though tasks need this and it is not configured: "
                                            "search, read, judge, attachments, tests. Repeatable or comma-separated."),
}


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
              visit_model: str | None = None, judge: str | None = None,
              allow_missing: list[str] = ()) -> "ToolOptions":
        """Raises ValueError naming the option at fault."""
        from toolself.evals.preflight import NEEDS

        if docs is not None and not Path(docs).exists():
            raise ValueError(f"--docs {docs} does not exist")
        if tools_config is not None and not Path(tools_config).is_file():
            raise ValueError(f"--tools-config {tools_config} is not a file")
        if judge is not None and not judge.startswith("openai:"):
            raise ValueError(f"--judge takes openai:NAME@URL, not {judge!r}")
        allowed = frozenset(_split(list(allow_missing)))
        if allowed - set(NEEDS):
            raise ValueError(f"--allow-missing {sorted(allowed - set(NEEDS))}: expected some of {list(NEEDS)}")
        web = WebSettings.from_env(search=search, search_url=search_url, reader=reader, reader_url=reader_url,
                                   visit_model=visit_model)
        return cls(docs=Path(docs) if docs else None, tools=tuple(_split([tools])) if tools else None,
                   user_tools=tuple(user_tools), mcp=tuple(mcp), tools_config=tools_config, web=web, judge=judge,
                   allow_missing=allowed)

    def with_cache(self, folder: Path) -> "ToolOptions":
        """The web answers cached under `folder` unless TOOLSELF_WEB_CACHE chose a place."""
        return self if self.web.cache_dir else replace(self, web=replace(self.web, cache_dir=Path(folder)))

    def pool(self):
        """The global pool these options name, with `search` and `visit` bound to the web settings."""
        from toolself.tools.registry import default_pool
        from toolself.tools.search import search_tool
        from toolself.tools.visit import visit_tool

        pool = default_pool(include=list(self.tools) if self.tools is not None else None,
                            mcp_servers=list(self.mcp) or None, user_tools=list(self.user_tools) or None,
                            config=self.tools_config)
        for bound in (search_tool(self.web), visit_tool(self.web)):
            if bound.name in pool:
                pool.replace(bound)
        return pool

    def collection(self):
        if self.docs is None:
            return None
        from toolself.tools.collection import Collection

        return Collection.from_path(self.docs)


def default_web_cache() -> Path:
    base = os.environ.get("TOOLSELF_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "toolself") / "web"


def tool_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared options to `command`, which receives them parsed as `tool_options`.
    Called directly (not through typer), omitted options take their defaults."""
    signature = inspect.signature(command)
    kept = [p for name, p in signature.parameters.items() if name != "tool_options"]
    taken = {p.name for p in kept} & set(OPTIONS)
    if taken:
        raise TypeError(f"{command.__name__} declares {sorted(taken)} itself; the shared definition provides them")
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=spec.annotation,
                               default=typer.Option(spec.default, help=spec.help)) for name, spec in OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name, OPTIONS[name].default) for name in OPTIONS}
        values = {k: (v.default if isinstance(v, typer.models.OptionInfo) else v) for k, v in values.items()}
        try:
            parsed = ToolOptions.parse(**values)
        except ValueError as exc:  # a usage error: one line on stderr, status 2
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        return command(*args, tool_options=parsed, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=kept + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != "tool_options"},
                               **{name: spec.annotation for name, spec in OPTIONS.items()}}
    return wrapper
