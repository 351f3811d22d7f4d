"""Real HTTP servers on loopback for tests and benchmarks.

`running_server(app)` runs any ASGI app under uvicorn in a background thread on a free port
of 127.0.0.1 and yields its base URL; `serving(model)` does the same for `toolself serve`
over a ChatModel and yields the `/v1` URL an OpenAI client wants.

    with serving(ScriptedModel(["hi"])) as url:
        OpenAIModel("scripted", url).complete([Message("user", "hello")])

A fixed-latency server is a model whose replies sleep; concurrent requests overlap, since
`toolself serve` runs blocking models on a wide thread pool:

    def slow_reply(messages, tools):
        time.sleep(0.1)
        return call("terminate", answer="42")

    with serving(ScriptedModel([], default=slow_reply)) as url: ...
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import uvicorn

from toolself.serve import create_app


class InFlight:
    """A scripted reply that blocks for `seconds` and counts the calls (`total`) and how many
    overlapped (`peak`): a test of concurrency that does not depend on how fast the machine is."""

    def __init__(self, seconds: float, reply: str = "ok"):
        self.seconds, self.reply = seconds, reply
        self.now = self.peak = self.total = 0
        self._lock = threading.Lock()

    def __call__(self, messages: Any, tools: Any) -> str:
        with self._lock:
            self.now += 1
            self.total += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.seconds)
        with self._lock:
            self.now -= 1
        return self.reply


@contextmanager
def running_server(app: Any, host: str = "127.0.0.1", startup_timeout: float = 10.0) -> Iterator[str]:
    """Run `app` until the block ends; yields `http://127.0.0.1:PORT`."""
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets, and without it
    # every keep-alive request waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the test server on {host}:{port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        # Tests may leave requests hanging on purpose (timeouts); do not wait for them.
        server.should_exit = True
        server.force_exit = True
        thread.join(timeout=5)
        sock.close()


@contextmanager
def serving(model: Any, **create_app_options: Any) -> Iterator[str]:
    """`toolself serve` over `model`; yields the base URL ending in `/v1`."""
    with running_server(create_app(model, **create_app_options)) as url:
        yield url + "/v1"
