"""`toolself tools ...`: inspect the global pool (built-ins, user tools, MCP servers' tools)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

tools_app = typer.Typer(help="Inspect the tool pool.", no_args_is_help=True)


@tools_app.callback()
def tools_main() -> None:
    """Inspect the tool pool: built-in tools, user tools and MCP servers' tools."""


@tools_app.command("list")
def list_tools(
    mcp: list[str] = typer.Option([], "--mcp", help="An MCP server: NAME=COMMAND ARGS... or NAME=http://host:port/mcp. Repeatable."),
    mcp_config: Optional[Path] = typer.Option(None, "--mcp-config", hidden=True,
                                              help="Deprecated: give the same file as --tools-config."),
    user_tools: list[str] = typer.Option([], "--user-tools", help="A Python file or module whose @tool functions join the pool. Repeatable."),
    tools_config: Optional[Path] = typer.Option(None, "--tools-config", help="A tools config file (JSON or TOML)."),
    as_json: bool = typer.Option(False, "--json", help="Print the OpenAI function schemas as JSON."),
) -> None:
    """Print every tool of the pool with its arguments schema."""
    from rich.console import Console
    from rich.syntax import Syntax

    from toolself.cli_errors import warn
    from toolself.tools.mcp import MCPError, load_mcp_config
    from toolself.tools.registry import default_pool

    servers: list = list(mcp)
    if mcp_config is not None:
        warn("--mcp-config is deprecated; a file of mcpServers is a tools config: --tools-config, as `run` takes it")
        servers.extend(load_mcp_config(mcp_config))
    try:
        pool = default_pool(mcp_servers=servers, user_tools=user_tools, config=tools_config)
    except (MCPError, ValueError, OSError, ImportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    with pool:
        if as_json:
            typer.echo(json.dumps(pool.schemas(), indent=2))
            return
        console = Console()
        for t in pool:
            console.rule(f"[bold]{t.name}")
            console.print(t.description)
            console.print(Syntax(json.dumps(t.parameters, indent=2), "json", theme="ansi_dark", background_color="default", word_wrap=True))
