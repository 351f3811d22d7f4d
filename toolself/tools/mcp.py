"""Tools of MCP servers, joined to the pool as ordinary `Tool`s named `<server>__<tool>`.

The agent loop is synchronous and the MCP SDK is asynchronous, so an `MCPManager` owns one
event loop in a background thread; each server connection lives in its own task on that
loop for as long as the manager does (the SDK's transports must be entered and left by the
same task). A tool call is submitted to the loop and waited for until its timeout, and not a
moment longer, whatever the SDK is still doing: a slow server gives a timeout observation, a
dead one an error observation. After either, the server is asked to list its tools in the
background; one that does not answer is hung or gone, so it is closed (a stdio server's
process tree is killed) and started afresh, and the next call waits for the new one. A server
that answers keeps its connection and its state. Arguments are validated against the
server's own JSON schema before anything is sent.

Servers come from a CLI flag (`name=command args...` or `name=http://host/mcp`) or from a
JSON config file in the common `{"mcpServers": {name: {command, args, env} | {url}}}` shape.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import shlex
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolself.tools.base import Observation, Tool, ToolArgumentError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0
# A live server answers a request within milliseconds; one that takes this long is hung.
PROBE_TIMEOUT_S = 2.0
# The SDK's own read timeout is set this much past ours, so that ours is the one that fires.
SDK_TIMEOUT_MARGIN_S = 1.0
MAX_RESULT_CHARS = 20_000


class MCPError(RuntimeError):
    """A server could not be reached or listed."""


@dataclass
class MCPServerConfig:
    """One server: a stdio command or a streamable-HTTP URL."""

    name: str
    command: list[str] = field(default_factory=list)
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float = CALL_TIMEOUT_S

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", self.name):
            raise ValueError(f"MCP server name {self.name!r}: use 1-32 letters, digits, '_' or '-'")
        if bool(self.command) == bool(self.url):
            raise ValueError(f"MCP server {self.name!r}: give either a command or a url")

    @classmethod
    def parse(cls, spec: str) -> "MCPServerConfig":
        """`name=python server.py --flag` (stdio) or `name=http://127.0.0.1:8000/mcp`."""
        name, sep, target = spec.partition("=")
        if not sep or not target.strip():
            raise ValueError(f"MCP server spec {spec!r}: expected NAME=COMMAND or NAME=URL")
        target = target.strip()
        if re.match(r"^https?://", target):
            return cls(name.strip(), url=target)
        return cls(name.strip(), command=shlex.split(target))


def load_mcp_config(path: str | Path) -> list[MCPServerConfig]:
    """Servers from a JSON file: {"mcpServers": {"name": {"command": ..., "args": [...], "env": {...}} | {"url": ...}}}."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a valid JSON MCP config: {exc}") from None
    servers = data.get("mcpServers", data.get("mcp_servers", data)) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f"{path}: expected an object with 'mcpServers'")
    return mcp_configs(servers, source=str(path))


def mcp_configs(servers: dict[str, Any], source: str = "config") -> list[MCPServerConfig]:
    """Server configs from the `mcpServers` mapping of a config file."""
    out = []
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{source}: server {name!r} must be an object")
        command = entry.get("command")
        argv = (shlex.split(command) if isinstance(command, str) else list(command or [])) + list(entry.get("args", []))
        out.append(MCPServerConfig(name=name, command=argv, url=entry.get("url"), env=dict(entry.get("env", {})),
                                   cwd=entry.get("cwd"), timeout_s=float(entry.get("timeout", CALL_TIMEOUT_S))))
    return out


def _client_target(config: MCPServerConfig):
    try:
        from mcp import Client, StdioServerParameters
    except ImportError:
        raise MCPError("MCP support needs the mcp SDK 2.x (pip install 'toolself[tools]')") from None
    if config.url:
        return Client, config.url
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=config.command[0], args=config.command[1:], env=config.env or None, cwd=config.cwd)
    return Client, stdio_client(params, errlog=_errlog())


def _errlog():
    """Where a stdio server's stderr goes: ours, unless ours is not a real file (captured output)."""
    import os
    import sys

    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
            return stream
        except (AttributeError, OSError, ValueError):
            continue
    return open(os.devnull, "w")


def render_result(result: Any) -> Observation:
    """MCP content blocks as text: text verbatim, other blocks described."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}, {len(getattr(block, 'data', '') or '') * 3 // 4} bytes]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {getattr(resource, 'uri', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {getattr(block, 'uri', '')}]")
        else:
            parts.append(str(block))
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts) or "(no content)"
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... {len(text) - MAX_RESULT_CHARS:,} characters cut ...]"
    return Observation(text, is_error=bool(getattr(result, "is_error", False)))


class _Connection:
    """One server session, held open by a task on the manager's loop."""

    def __init__(self, config: MCPServerConfig):
        self.config = config
        self.client = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()

    async def open(self) -> list[Any]:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold(ready))
        return await ready

    async def _hold(self, ready: asyncio.Future) -> None:
        client_cls, target = _client_target(self.config)
        try:
            async with client_cls(target, read_timeout_seconds=self.config.timeout_s) as client:
                tools, cursor = [], None
                while True:
                    listing = await client.list_tools(cursor=cursor)
                    tools.extend(listing.tools)
                    cursor = getattr(listing, "next_cursor", None)
                    if not cursor:
                        break
                self.client = client
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:  # the SDK raises exception groups from its task groups
            if not ready.done():
                ready.set_exception(MCPError(f"could not connect to MCP server {self.config.name!r}: {_describe(exc)}"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %s disconnected: %s", self.config.name, _describe(exc))
        finally:
            self.client = None

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        if self.client is None:
            raise MCPError("the connection is closed")
        return await self.client.call_tool(tool, arguments,
                                           read_timeout_seconds=self.config.timeout_s + SDK_TIMEOUT_MARGIN_S)

    async def answers(self) -> bool:
        """Whether the server answers a request now: a tool listing past the SDK's cache (MCP's
        own ping is gone from the protocol's current version)."""
        if not self.alive:
            return False
        try:
            await asyncio.wait_for(self.client.list_tools(cache_mode="bypass"),
                                   min(PROBE_TIMEOUT_S, self.config.timeout_s))
        except Exception:
            return False
        return True

    async def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 10)
            except (asyncio.TimeoutError, Exception):
                self._task.cancel()


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class MCPTool(Tool):
    """A server's tool: the server's schema shown to the model and enforced before sending."""

    def __init__(self, manager: "MCPManager", server: str, remote: Any):
        self.manager = manager
        self.server = server
        self.remote_name = remote.name
        self.name = f"{server}__{re.sub(r'[^A-Za-z0-9_-]', '_', remote.name)}"[:64]
        self.description = (remote.description or remote.name).strip() + f" (MCP server {server})"
        schema = dict(remote.input_schema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self.parameters = schema
        self.wants_context = False
        self.fn = self._call
        try:
            from jsonschema import Draft202012Validator

            Draft202012Validator.check_schema(schema)
            self._validator = Draft202012Validator(schema)
        except Exception:  # an unusable schema is the server's to enforce
            self._validator = None

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if self._validator is not None:
            problems = [f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}"
                        for e in sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))]
            if problems:
                raise ToolArgumentError(f"invalid arguments for {self.name}: " + "; ".join(problems))
        return dict(arguments)

    def _call(self, **arguments: Any) -> Observation:
        return self.manager.call(self.server, self.remote_name, arguments)


class MCPManager:
    """Owns the loop thread and every server connection; `close()` ends them all."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="toolself-mcp", daemon=True)
        self._thread.start()
        self._connections: dict[str, _Connection] = {}
        self._renewals: dict[str, concurrent.futures.Future] = {}
        self._retired: set[asyncio.Task] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _run(self, coro, timeout: float):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise

    def connect(self, config: MCPServerConfig) -> list[MCPTool]:
        """Open a server and return its tools; raises MCPError when it cannot be reached in time."""
        if config.name in self._connections:
            raise MCPError(f"an MCP server named {config.name!r} is already connected")
        connection = _Connection(config)
        try:
            remote_tools = self._run(connection.open(), CONNECT_TIMEOUT_S)
        except FutureTimeout:
            self._run(connection.close(), 15)
            raise MCPError(f"MCP server {config.name!r} did not answer within {CONNECT_TIMEOUT_S:g} s") from None
        self._connections[config.name] = connection
        return [MCPTool(self, config.name, remote) for remote in remote_tools]

    def _renew(self, server: str, check: bool) -> concurrent.futures.Future:
        """Start a renewal of `server`'s connection, unless one is under way; with `check`, only
        if the server does not answer a request. It runs on the loop to its end, whoever waits."""
        with self._lock:
            pending = self._renewals.get(server)
            if pending is None or pending.done():
                pending = asyncio.run_coroutine_threadsafe(self._renewed(server, check), self._loop)
                self._renewals[server] = pending
            return pending

    async def _renewed(self, server: str, check: bool) -> None:
        old = self._connections[server]
        if check and await old.answers():
            return
        log.warning("MCP server %s does not answer; restarting it", server)
        retiring = asyncio.create_task(old.close())  # the new server need not wait for the old one to die
        self._retired.add(retiring)
        retiring.add_done_callback(self._retired.discard)
        if self._closed:
            return
        fresh = _Connection(old.config)
        try:
            await asyncio.wait_for(fresh.open(), CONNECT_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            await fresh.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise MCPError(f"no answer within {CONNECT_TIMEOUT_S:g} s after a restart") from None
        self._connections[server] = fresh

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> Observation:
        if self._closed:
            return Observation(f"MCP server {server!r} is closed", is_error=True)
        if not self._connections[server].alive:
            self._renew(server, check=False)
        pending = self._renewals.get(server)
        if pending is not None:
            try:
                pending.result(PROBE_TIMEOUT_S + CONNECT_TIMEOUT_S + 5)
            except Exception as exc:
                return Observation(f"MCP server {server!r} is not available: {_describe(exc)}", is_error=True)
        connection = self._connections[server]
        timeout = connection.config.timeout_s
        future = asyncio.run_coroutine_threadsafe(connection.call(tool, arguments), self._loop)
        try:
            result = future.result(timeout)
        except FutureTimeout:
            future.cancel()
            self._renew(server, check=True)
            return Observation(f"{server}__{tool}: no answer from MCP server {server!r} within {timeout:g} s", is_error=True)
        except Exception as exc:
            self._renew(server, check=True)
            return Observation(f"{server}__{tool}: the MCP server failed: {_describe(exc)}", is_error=True)
        return render_result(result)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pending in list(self._renewals.values()):
            try:
                pending.result(PROBE_TIMEOUT_S + 5)
            except Exception:
                pending.cancel()
        for connection in list(self._connections.values()):
            try:
                self._run(connection.close(), 20)
            except Exception:
                pass

        async def retired() -> None:
            await asyncio.gather(*self._retired, return_exceptions=True)

        try:
            self._run(retired(), 20)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
