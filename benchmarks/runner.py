"""How close the eval runner gets to the latency-bound ideal against a slow HTTP model.

A child process serves an OpenAI-compatible API on loopback (`toolself serve`'s app) over a
model that answers every call after a fixed 100 ms, awaited asynchronously so that concurrent
requests overlap. Each attempt is the same short ToolSelf episode: the configuration turn,
one tool call, terminate (3 calls). The runner (real workspaces, scoring, fsynced JSONL) runs
the attempts at several concurrencies; with perfect overlap the wall time would be
attempts * calls * 0.1 s / concurrency. Prints one JSON object.

    python benchmarks/runner.py [--attempts 256] [--concurrency 1,8,32] [--attempts-at-1 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LATENCY = 0.1
CALLS_PER_ATTEMPT = 3
CONFIG = {"subgoal": "echo the word", "strategy": "Call echo once, then terminate with its output.",
          "toolbox": ["echo"], "knowledge": "none", "context_mode": "basic"}


def serve(latency: float) -> None:
    """The child: print the port, then serve until killed."""
    import uvicorn

    from toolself.models.base import Completion, Message, SyncModelBase, ToolCall, Usage
    from toolself.serve import create_app

    class FixedLatency(SyncModelBase):
        name = "fixed-latency"

        def decide(self, messages, tools, response_schema) -> Message:
            if response_schema is not None:
                return Message("assistant", json.dumps(CONFIG))
            last = messages[-1]
            if last.role == "tool":
                arguments = {"answer": last.content}
                return Message("assistant", tool_calls=[ToolCall("terminate", arguments, id="t",
                                                                 raw_arguments=json.dumps(arguments))])
            arguments = {"text": "ok"}
            return Message("assistant", tool_calls=[ToolCall("echo", arguments, id="e",
                                                             raw_arguments=json.dumps(arguments))])

        def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None):
            time.sleep(latency)
            return Completion(self.decide(messages, tools, response_schema), Usage(100, 10), latency)

        async def acomplete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None):
            await asyncio.sleep(latency)
            return Completion(self.decide(messages, tools, response_schema), Usage(100, 10), latency)

    # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only when it does, and
    # without it Nagle's algorithm meets the client's delayed ACK and adds ~40 ms to each reply.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(create_app(FixedLatency()), log_level="warning", access_log=False, lifespan="off",
                            backlog=512)
    uvicorn.Server(config).run(sockets=[sock])


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(latency)], stdout=subprocess.PIPE, text=True)
    port = int(child.stdout.readline())
    url = f"http://127.0.0.1:{port}/v1"
    import httpx

    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(url + "/models", timeout=1).raise_for_status()
            return child, url
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                child.kill()
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)


def measure(url: str, attempts: int, concurrency: int) -> dict:
    from toolself.evals.runner import run_eval
    from toolself.evals.task import Task
    from toolself.models.base import Message
    from toolself.models.openai_compat import OpenAIModel
    from toolself.tools.base import ToolPool, tool

    @tool
    def echo(text: str) -> str:
        """Return the text.

        Args:
            text: What to return.
        """
        return text

    tasks = [Task(id=f"a{i}", question=f"Say ok ({i}).", answer="ok") for i in range(attempts)]
    model = OpenAIModel("fixed-latency", url, tool_protocol="native", max_retries=0)
    # Build the model's HTTP client before the clock starts: a long eval pays for it once, but
    # 32 threads racing to build it lazily would each load the CA store (~50 ms of CPU apiece).
    model.complete([Message("user", "warm up")])
    with tempfile.TemporaryDirectory() as folder:
        load_before = os.getloadavg()[0]
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = run_eval(["bench"], ["toolself"], model, Path(folder), concurrency=concurrency, timeout=120,
                           progress=False, pool=ToolPool([echo]), loader=lambda spec, **_: tasks)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    ideal = attempts * CALLS_PER_ATTEMPT * LATENCY / concurrency
    correct = sum(r.correct for r in summary.records)
    calls = sum(1 for _ in summary.records) * CALLS_PER_ATTEMPT
    return {"concurrency": concurrency, "attempts": attempts, "calls": calls, "wall_s": round(wall, 3),
            "ideal_s": round(ideal, 3), "wall_over_ideal": round(wall / ideal, 3),
            "within_15pct": wall <= 1.15 * ideal, "status": summary.status, "correct": correct,
            # The runner and the HTTP client share one Python process (one GIL): its CPU time
            # is a floor on the wall time whatever the concurrency.
            "client_cpu_s": round(cpu, 3), "client_cpu_ms_per_attempt": round(1000 * cpu / attempts, 2),
            "load_average_before": round(load_before, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attempts", type=int, default=256)
    parser.add_argument("--attempts-at-1", type=int, default=None,
                        help="attempts at concurrency 1 (default: --attempts); fewer keeps the run short")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--serve", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    child, url = start_server(LATENCY)
    try:
        measure(url, 8, 8)  # warm-up: imports, connections, the server's executor
        rows = []
        for c in (int(x) for x in args.concurrency.split(",")):
            n = args.attempts_at_1 if c == 1 and args.attempts_at_1 else args.attempts
            rows.append(measure(url, n, c))
    finally:
        child.terminate()
        child.wait(timeout=10)
    print(json.dumps({"benchmark": "runner", "latency_s": LATENCY, "calls_per_attempt": CALLS_PER_ATTEMPT,
                      "episode": "configure, one tool call, terminate (method toolself)",
                      "python": platform.python_version(), "cpus": os.cpu_count(), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
