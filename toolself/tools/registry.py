"""The global pool T_all: the built-in tools, plus user tools and MCP servers' tools.

User tools are ordinary `@tool` functions in a Python file or module; every `Tool` object
found at the module's top level joins the pool. MCP servers' tools join under
`<server>__<tool>`. Both can be named on the command line or in a tools config file:

    {
      "include": ["search", "visit", "code_interpreter"],
      "userTools": ["my_tools.py", "mypackage.tools"],
      "mcpServers": {
        "files": {"command": "python", "args": ["-m", "my_mcp_server"]},
        "web": {"url": "http://127.0.0.1:8000/mcp"}
      }
    }

(JSON, or the same keys in TOML.) The pool owns its MCP connections: `close()` it when done.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from toolself.tools.base import Tool, ToolPool

BUILTIN_NAMES = ["search", "visit", "code_interpreter", "execute_bash", "str_replace_editor", "file_analyzer"]


def builtin_tools() -> list[Tool]:
    from toolself.tools.code import code_interpreter
    from toolself.tools.editor import str_replace_editor
    from toolself.tools.files import file_analyzer
    from toolself.tools.search import search
    from toolself.tools.shell import execute_bash
    from toolself.tools.visit import visit

    return [search, visit, code_interpreter, execute_bash, str_replace_editor, file_analyzer]


class GlobalPool(ToolPool):
    """A ToolPool that also holds what must be closed with it (MCP connections)."""

    def __init__(self, tools: list[Tool] | None = None, closers: Iterable[Any] = ()):
        super().__init__(tools)
        self._closers = list(closers)

    def close(self) -> None:
        while self._closers:
            try:
                self._closers.pop().close()
            except Exception:
                pass

    def __enter__(self) -> "GlobalPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _import_module(spec: str) -> ModuleType:
    path = Path(spec)
    if spec.endswith(".py") or path.exists():
        if not path.is_file():
            raise ValueError(f"user tools: no file {spec}")
        name = f"toolself_user_tools_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"user tools: cannot load {spec}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def load_user_tools(spec: str) -> list[Tool]:
    """Every top-level `Tool` (made with `@tool`) of a Python file (`my_tools.py`) or module (`pkg.tools`)."""
    module = _import_module(spec)
    tools = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not tools:
        raise ValueError(f"user tools: {spec} defines no @tool function at its top level")
    return tools


CONFIG_KEYS = frozenset({"include", "userTools", "user_tools", "mcpServers", "mcp_servers"})


@dataclass
class ToolsConfig:
    include: list[str] | None = None
    user_tools: list[str] = field(default_factory=list)
    mcp_servers: list[Any] = field(default_factory=list)


def load_tools_config(path: str | Path) -> ToolsConfig:
    from toolself.tools.mcp import mcp_configs

    import tomllib

    path = Path(path)
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not a valid {'TOML' if path.suffix == '.toml' else 'JSON'} tools config: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a tools config is an object with {sorted(CONFIG_KEYS)}")
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} in the tools config; known keys: {sorted(CONFIG_KEYS)}")
    config = ToolsConfig(include=data.get("include"), user_tools=list(data.get("userTools", data.get("user_tools", []))))
    servers = data.get("mcpServers") or data.get("mcp_servers")
    if servers:
        config.mcp_servers = mcp_configs(servers, source=str(path))
    base = path.parent
    config.user_tools = [str(base / u) if u.endswith(".py") and not Path(u).is_absolute() else u for u in config.user_tools]
    return config


def default_pool(*, include: list[str] | None = None, mcp_servers: list[Any] | None = None,
                 user_tools: list[str | Tool] | None = None, config: str | Path | None = None) -> GlobalPool:
    """The built-in tools (or those named in `include`), user tools and MCP servers' tools.

    `mcp_servers` takes `MCPServerConfig`s or specs (`name=command ...`, `name=http://...`);
    `user_tools` takes `Tool`s, file paths or module names; `config` a tools config file.
    A server that cannot be reached raises `MCPError`: a pool silently missing tools would
    make the agent's toolbox requests fail later for a reason it cannot see.
    """
    if config is not None:
        loaded = load_tools_config(config)
        include = include if include is not None else loaded.include
        user_tools = list(user_tools or []) + loaded.user_tools
        mcp_servers = list(mcp_servers or []) + loaded.mcp_servers
    tools = builtin_tools()
    if include is not None:
        unknown = sorted(set(include) - {t.name for t in tools})
        if unknown:
            raise ValueError(f"unknown built-in tools {unknown}; the built-ins are {BUILTIN_NAMES}")
        tools = [t for t in tools if t.name in include]
    for entry in user_tools or []:
        tools.extend([entry] if isinstance(entry, Tool) else load_user_tools(entry))
    closers = []
    if mcp_servers:
        from toolself.tools.mcp import MCPManager, MCPServerConfig

        manager = MCPManager()
        closers.append(manager)
        try:
            for server in mcp_servers:
                tools.extend(manager.connect(server if isinstance(server, MCPServerConfig) else MCPServerConfig.parse(server)))
        except BaseException:
            manager.close()
            raise
    try:
        return GlobalPool(tools, closers)
    except ValueError:
        for closer in closers:
            closer.close()
        raise
