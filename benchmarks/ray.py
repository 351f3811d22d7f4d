"""What the Ray backend costs over local threads, against the same slow HTTP model.

The server of `benchmarks/runner.py` (a child process answering every call after a fixed
100 ms) serves the same short ToolSelf episode (configure, one tool call, terminate: 3 calls).
The same attempts run with the local backend and with the Ray backend on a local cluster, at
the same concurrency, in one process; the difference is Ray's cost per attempt (submission,
shipping the task and the record, the worker's own HTTP client). The cluster declares one
logical CPU per attempt in flight (the attempts wait on the network, not on cores), and a
warm-up run starts the workers before the clock, reported apart as the cold start.

    python benchmarks/ray.py [--attempts 256] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, this file's folder leads sys.path and its name would shadow the ray package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]


def _runner_benchmark():
    spec = importlib.util.spec_from_file_location("runner_benchmark", HERE / "runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def echo_pool():
    from toolself.tools.base import ToolPool, tool

    @tool
    def echo(text: str) -> str:
        """Return the text.

        Args:
            text: What to return.
        """
        return text

    return ToolPool([echo])


def run_once(model: str, attempts: int, concurrency: int, backend, label: str) -> dict:
    from toolself.evals.runner import run_eval
    from toolself.evals.task import Task

    tasks = [Task(id=f"{label}{i}", question=f"Say ok ({i}).", answer="ok") for i in range(attempts)]
    with tempfile.TemporaryDirectory() as folder:
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = run_eval(["bench"], ["toolself"], model, Path(folder), concurrency=concurrency, timeout=120,
                           progress=False, pool=echo_pool(), loader=lambda spec, **_: tasks, backend=backend,
                           model_options={"tool_protocol": "native", "max_retries": 0})
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"attempts": attempts, "wall_s": round(wall, 3), "status": summary.status,
            "correct": sum(r.correct for r in summary.records), "driver_cpu_s": round(cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attempts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    import ray

    from toolself.evals.backends import LocalBackend, RayBackend

    bench = _runner_benchmark()
    load_before = os.getloadavg()[0]
    child, url = bench.start_server(bench.LATENCY)
    model = f"openai:fixed-latency@{url}"
    c, n = args.concurrency, args.attempts
    ideal = n * bench.CALLS_PER_ATTEMPT * bench.LATENCY / c
    try:
        run_once(model, 8, 8, LocalBackend(), "w")  # imports, connections, the server's executor
        local = run_once(model, n, c, LocalBackend(), "l")
        started = time.perf_counter()
        ray.init(num_cpus=c, include_dashboard=False, log_to_driver=False)
        init_s = time.perf_counter() - started
        cold = run_once(model, c, c, RayBackend(num_cpus=1), "c")
        remote = run_once(model, n, c, RayBackend(num_cpus=1), "r")
    finally:
        child.terminate()
        child.wait(timeout=10)
        if ray.is_initialized():
            ray.shutdown()
    for row in (local, remote):
        row["ideal_s"] = round(ideal, 3)
        row["wall_over_ideal"] = round(row["wall_s"] / ideal, 3)
    print(json.dumps({
        "benchmark": "ray", "latency_s": bench.LATENCY, "calls_per_attempt": bench.CALLS_PER_ATTEMPT,
        "concurrency": c, "episode": "configure, one tool call, terminate (method toolself)",
        "local": local, "ray": remote,
        "ray_overhead_s": round(remote["wall_s"] - local["wall_s"], 3),
        "ray_overhead_ms_per_attempt": round(1000 * (remote["wall_s"] - local["wall_s"]) / n, 2),
        "ray_over_local": round(remote["wall_s"] / local["wall_s"], 3),
        "ray_cold_start": {"init_s": round(init_s, 3), "first_wave_attempts": c, "first_wave_wall_s": cold["wall_s"]},
        "python": platform.python_version(), "ray_version": ray.__version__, "cpus": os.cpu_count(),
        "load_average_before": round(load_before, 2)}, indent=2))


if __name__ == "__main__":
    main()
