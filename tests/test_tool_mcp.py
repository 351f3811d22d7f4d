"""MCP servers' tools in the pool: a real server (tests/mcp_server.py) over stdio and over HTTP."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from ports import free_port  # noqa: E402
from toolself.tools.base import ToolPool  # noqa: E402
from toolself.tools.mcp import MCPError, MCPManager, MCPServerConfig, load_mcp_config  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_server.py"))


@pytest.fixture(scope="module")
def stdio_tools():
    manager = MCPManager()
    tools = manager.connect(MCPServerConfig("demo", command=[sys.executable, SERVER], timeout_s=2))
    yield {t.name: t for t in tools}
    manager.close()


@pytest.fixture(scope="module")
def http_url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def test_server_tools_join_under_namespaced_names(stdio_tools):
    assert {"demo__add", "demo__shout", "demo__slow", "demo__fail", "demo__crash"} <= set(stdio_tools)
    add = stdio_tools["demo__add"]
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert "Add two integers." in add.description
    pool = ToolPool(list(stdio_tools.values()))
    assert pool.schemas(["demo__add"])[0]["function"]["name"] == "demo__add"


def test_call_returns_the_servers_answer(stdio_tools):
    assert stdio_tools["demo__add"]({"a": 2, "b": 40}).content == "42"
    assert stdio_tools["demo__shout"]({"text": "hey", "times": 2}).content == "HEY HEY"


def test_arguments_are_checked_against_the_servers_schema(stdio_tools):
    obs = stdio_tools["demo__add"]({"a": "two"})
    assert obs.is_error
    assert "'b' is a required property" in obs.content and "'two' is not of type 'integer'" in obs.content


def test_error_inside_the_tool_is_an_error_observation(stdio_tools):
    obs = stdio_tools["demo__fail"]({"message": "boom"})
    assert obs.is_error and "fail" in obs.content


def test_slow_server_times_out_and_the_next_call_works(stdio_tools):
    start = time.perf_counter()
    obs = stdio_tools["demo__slow"]({"seconds": 30})
    assert obs.is_error and "within 2 s" in obs.content
    assert time.perf_counter() - start < 10
    assert stdio_tools["demo__add"]({"a": 1, "b": 1}).content == "2"


@pytest.mark.slow
def test_dead_server_is_an_error_and_is_restarted_on_the_next_call():
    manager = MCPManager()
    try:
        tools = {t.name: t for t in manager.connect(MCPServerConfig("gone", command=[sys.executable, SERVER], timeout_s=5))}
        died = tools["gone__crash"]({})
        assert died.is_error and "gone__crash" in died.content
        assert tools["gone__add"]({"a": 3, "b": 4}).content == "7"
    finally:
        manager.close()


def test_streamable_http_server(http_url):
    manager = MCPManager()
    try:
        tools = {t.name: t for t in manager.connect(MCPServerConfig.parse(f"web={http_url}"))}
        assert tools["web__add"]({"a": 5, "b": 6}).content == "11"
    finally:
        manager.close()


def test_unreachable_server_fails_to_connect_with_a_clear_error():
    manager = MCPManager()
    try:
        with pytest.raises(MCPError, match="could not connect to MCP server 'nowhere'"):
            manager.connect(MCPServerConfig("nowhere", url=f"http://127.0.0.1:{free_port()}/mcp"))
        with pytest.raises(MCPError, match="'missing'"):
            manager.connect(MCPServerConfig("missing", command=["/nonexistent/server-binary"]))
    finally:
        manager.close()


def test_server_specs_and_config_files(tmp_path):
    stdio = MCPServerConfig.parse("files=python -m my_server --root '/data dir'")
    assert stdio.command == ["python", "-m", "my_server", "--root", "/data dir"] and stdio.url is None
    assert MCPServerConfig.parse("web=https://example.org/mcp").url == "https://example.org/mcp"
    with pytest.raises(ValueError):
        MCPServerConfig.parse("no-equals-sign")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "a": {"command": "python", "args": ["server.py"], "env": {"X": "1"}, "timeout": 5},
        "b": {"url": "http://127.0.0.1:1/mcp"},
    }}))
    a, b = load_mcp_config(config)
    assert (a.name, a.command, a.env, a.timeout_s) == ("a", ["python", "server.py"], {"X": "1"}, 5.0)
    assert b.url == "http://127.0.0.1:1/mcp"
