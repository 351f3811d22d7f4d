"""A small MCP server for the tests, written with the MCP SDK.

    python tests/mcp_server.py                 # stdio
    python tests/mcp_server.py http PORT       # streamable HTTP on 127.0.0.1:PORT/mcp
"""

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("testsrv", log_level="CRITICAL")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str, times: int = 1) -> str:
    """Upper-case a text, repeated."""
    return " ".join([text.upper()] * times)


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after a delay."""
    await anyio.sleep(seconds)
    return "finally"


@server.tool()
def fail(message: str) -> str:
    """Raise an error inside the tool."""
    raise ValueError(message)


@server.tool()
def crash() -> str:
    """End the server process abruptly."""
    os._exit(3)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def hang() -> str:
    """Block the server's event loop: the server stops answering anything, pings included."""
    import time

    time.sleep(3600)
    return "never"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
