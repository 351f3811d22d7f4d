"""MCP servers cannot hold the agent (finding 13 of issue 25): a call ends at its timeout, within
a tenth of it, and a server that stops answering is killed and started afresh, so one hung
server does not time out every later call. The server is a real one (tests/mcp_server.py)
over stdio."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from toolself.tools.mcp import MCPManager, MCPServerConfig  # noqa: E402

pytestmark = pytest.mark.timeout(90)

SERVER = str(Path(__file__).parent.parent / "mcp_server.py")


@pytest.fixture
def server():
    manager = MCPManager()
    tools = {t.name.split("__", 1)[1]: t for t in
             manager.connect(MCPServerConfig("srv", command=[sys.executable, SERVER], timeout_s=3))}
    yield tools
    manager.close()


def timed(tool, arguments):
    started = time.perf_counter()
    observation = tool(arguments)
    return observation, time.perf_counter() - started


def gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_call_ends_at_its_timeout_within_a_tenth_of_it(server):
    for _ in range(3):
        observation, took = timed(server["slow"], {"seconds": 30})
        assert observation.is_error and "within 3 s" in observation.content
        assert 3.0 <= took <= 3.3


def test_a_slow_tool_on_a_live_server_keeps_its_server(server):
    before = int(server["pid"]({}).content)
    server["slow"]({"seconds": 30})
    assert int(server["pid"]({}).content) == before


def test_a_hung_server_is_killed_and_restarted_and_the_next_call_answers(server):
    hung = int(server["pid"]({}).content)
    observation, took = timed(server["hang"], {})
    assert observation.is_error and 3.0 <= took <= 3.3
    answer, _ = timed(server["add"], {"a": 2, "b": 5})
    assert answer.content == "7"
    assert int(server["pid"]({}).content) != hung
    assert gone(hung, within=15)
