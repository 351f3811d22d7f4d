"""The tool options every agent-running command takes, defined once.

`run`, `eval`, `train cat`, `train study` and `serve` (for the agent it serves beside the
model) all take the same `--docs`, `--tools`, `--user-tools`, `--mcp`, `--tools-config`, web
(`--search`, `--search-url`, `--reader`, `--reader-url`, `--visit-model`), `--vision-model`,
`--judge` and `--allow-missing` options. `@tool_options` adds them to a command's signature (so typer shows them in its
help) and hands the command one parsed `ToolOptions` as its `tool_options` argument: the
strings are parsed here, once, and nothing below the command line reads them again.

    @app.command()
    @tool_options
    def run(task: str, ..., tool_options: ToolOptions) -> None:
        pool = tool_options.pool()
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from toolself.tools.options import ToolOptions, default_web_cache

__all__ = ["OPTIONS", "PRESET_HELP", "ToolOptions", "default_web_cache", "preset_option", "request_options",
           "request_options_option", "tool_options"]

PRESET_HELP = ("A whole run setting: paper (the authors' setting point by point, docs/paper.md). It sets the "
               "budgets, sampling, context handling, prompts, tool-call protocol, tools, timeout and scorer, over "
               "the options of the same names.")


def preset_option() -> Any:
    """`--preset NAME` of `run`, `eval` and `train cat` (see `toolself.variants.RunPreset`)."""
    return typer.Option(None, "--preset", help=PRESET_HELP)


def request_options_option() -> Any:
    """`--request-options JSON` of `run` and `eval`: fields every request to a served policy carries."""
    return typer.Option(None, "--request-options", metavar="JSON",
                        help="Fields added to every request to a served policy (openai:), as JSON: a server's "
                             "extensions, e.g. '{\"chat_template_kwargs\": {\"enable_thinking\": false}}' turns "
                             "Qwen3's thinking off in vLLM and SGLang.")


def request_options(spec: Any, options: dict[str, Any], text: str | None) -> dict[str, Any]:
    """`options` (a policy's load options) with the `--request-options` fields added; a field
    the command cannot send is its one error line."""
    from toolself.cli_errors import fail, json_object_option

    if text is None:
        return options
    fields = json_object_option("--request-options", text, '{"top_k": 20}')
    try:
        return spec.with_request_fields(options, fields)
    except ValueError as exc:
        fail(f"--request-options: {exc}")


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
    "vision_model": _Option(Optional[str], None, "Vision model file_analyzer shows images to: openai:NAME@URL "
                                                  "(default: FILE_ANALYZER_VISION_MODEL at "
                                                  "FILE_ANALYZER_API_BASE_URL, else images are refused)."),
    "judge": _Option(Optional[str], None, "LLM judge for free-text answers (FRAMES, xbench): openai:NAME@URL."),
    "allow_missing": _Option(list[str], [], "Run even though tasks need this and it is not configured: "
                                            "search, read, judge, attachments, tests. Repeatable or comma-separated."),
}


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


def preset_pool(options: ToolOptions, run_preset: Any) -> Any:
    """The run's tool pool as its options build it and its preset (if any) reshapes it; a pool
    that cannot be built is the command's one error line."""
    from toolself.cli_errors import fail

    try:
        pool = options.pool(run_preset)
    except Exception as exc:
        fail(f"building the tool pool: {exc}")
    return pool

