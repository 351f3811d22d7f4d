"""The Ray backend: the same runner, its attempts executed as Ray tasks on a local cluster.

The model is a scripted policy served over loopback HTTP, so that driver and workers (separate
processes) talk to the same deterministic model through its spec.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'toolself[ray]')")

from toolself.evals.backends import RayBackend  # noqa: E402
from toolself.evals.records import read_records, safe_name  # noqa: E402
from toolself.evals.runner import run_eval  # noqa: E402
from toolself.models.base import Message  # noqa: E402
from toolself.models.scripted import ScriptedModel, call  # noqa: E402
from toolself.tools.base import ToolPool, tool  # noqa: E402

from http_fixtures import serving  # noqa: E402

pytestmark = pytest.mark.slow

# The workers cannot import this test module: its tools travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONFIG = json.dumps({"subgoal": "double the number", "strategy": "Use lookup, then answer.", "toolbox": ["lookup"],
                     "knowledge": "none", "context_mode": "basic"})
VOLATILE = {"wall_time", "finished_at", "trajectory_id"}


@tool
def lookup(key: str) -> str:
    """Look a number up.

    Args:
        key: The number, as text.
    """
    return f"double of {key} is {2 * int(key)}"


POOL = ToolPool([lookup])


def number_in(messages: list[Message]) -> int:
    question = next(m.content for m in messages if "Double" in m.content)
    return int(question.split("Double ")[1].split()[0].strip("?."))


def policy(messages, tools, delay: float = 0.0):
    """Configure, look the number up, then answer: right for even numbers, off by one for odd."""
    time.sleep(delay)
    if not tools:
        return CONFIG
    last = messages[-1]
    if last.role == "tool" and last.content.startswith("double of"):
        n = number_in(messages)
        return call("terminate", answer=str(2 * n if n % 2 == 0 else 2 * n + 1))
    return call("lookup", key=str(number_in(messages)))


def write_tasks(path: Path, n: int) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"t{i}", "question": f"Double {i}?", "answer": str(2 * i)}) + "\n")
    return f"jsonl:{path}"


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def stable(records) -> list[dict]:
    return sorted(({k: v for k, v in r.to_dict().items() if k not in VOLATILE} for r in records),
                  key=lambda d: (d["method"], d["task_id"], d["repeat"]))


def test_ray_backend_records_the_same_results_as_local_threads(tmp_path, cluster):
    spec = write_tasks(tmp_path / "tasks.jsonl", 4)
    with serving(ScriptedModel([], default=policy)) as url:
        model = f"openai:scripted@{url}"
        options = dict(concurrency=4, timeout=60, progress=False, pool=POOL)
        local = run_eval([spec], ["toolself", "vanilla"], model, tmp_path / "local", **options)
        remote = run_eval([spec], ["toolself", "vanilla"], model, tmp_path / "ray",
                          backend=RayBackend(num_cpus=0.5), **options)
    assert remote.status == local.status == {"ok": 8, "timeout": 0, "error": 0}
    for method in ("toolself", "vanilla"):
        assert stable(read_records(tmp_path / "ray" / safe_name(method))) == \
            stable(read_records(tmp_path / "local" / safe_name(method)))
    assert stable(remote.records) == stable(local.records)
    assert {r.task_id for r in remote.records if r.correct} == {"t0", "t2"}


def attempt_workers() -> list[int]:
    """Pids of Ray workers running an attempt now (Ray titles a busy worker `ray::TASK_NAME`)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::toolself_attempt"):
                pids.append(int(entry))
    return pids


def evaluate_killing_one_worker(spec: str, out: Path, concurrency: int, max_retries: int):
    """Run an evaluation on Ray and SIGKILL the first worker seen running an attempt."""
    slow = lambda messages, tools: policy(messages, tools, delay=0.3)  # noqa: E731
    outcome: dict = {}
    with serving(ScriptedModel([], default=slow)) as url:
        def evaluate() -> None:
            outcome["summary"] = run_eval([spec], ["toolself"], f"openai:scripted@{url}", out,
                                          concurrency=concurrency, timeout=60, progress=False, pool=POOL,
                                          backend=RayBackend(num_cpus=1, max_retries=max_retries))

        thread = threading.Thread(target=evaluate)
        thread.start()
        deadline = time.monotonic() + 60
        while not (busy := attempt_workers()):
            assert time.monotonic() < deadline and thread.is_alive(), "no Ray worker ran an attempt"
            time.sleep(0.05)
        os.kill(busy[0], signal.SIGKILL)
        thread.join(timeout=120)
    assert not thread.is_alive()
    return outcome["summary"]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds Ray workers through /proc")
def test_an_attempt_whose_worker_is_killed_is_rerun_and_recorded_once(tmp_path, cluster):
    spec = write_tasks(tmp_path / "tasks.jsonl", 6)
    summary = evaluate_killing_one_worker(spec, tmp_path / "out", concurrency=2, max_retries=2)
    lines = (tmp_path / "out" / "toolself" / "results.jsonl").read_text().splitlines()
    keys = [(json.loads(line)["task_id"], json.loads(line)["repeat"]) for line in lines]
    assert sorted(keys) == sorted((f"t{i}", 0) for i in range(6))
    assert summary.ran == 6
    assert summary.status == {"ok": 6, "timeout": 0, "error": 0}  # the lost attempt ran again (max_retries)
    assert {r.task_id for r in summary.records if r.correct} == {"t0", "t2", "t4"}


def test_an_attempt_whose_worker_is_killed_with_no_retries_left_is_an_error_record(tmp_path, cluster):
    spec = write_tasks(tmp_path / "tasks.jsonl", 3)
    summary = evaluate_killing_one_worker(spec, tmp_path / "out", concurrency=1, max_retries=0)
    assert summary.ran == 3 and summary.status == {"ok": 2, "timeout": 0, "error": 1}
    lost = next(r for r in summary.records if r.status == "error")
    assert "WorkerCrashedError" in lost.error or "died" in lost.error


def test_toolself_eval_runs_its_attempts_on_ray_with_backend_ray(tmp_path, cluster):
    from typer.testing import CliRunner

    from toolself.cli import app

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "-t", "builtin:research", "--limit", "2", "-m", "expert", "-o", str(out),
                                      "--backend", "ray", "--ray-cpus", "0.5", "--no-report"])
    assert result.exit_code == 0, result.output
    records = read_records(out / "toolself")
    assert len(records) == 2 and all(r.status == "ok" and r.correct for r in records)


def test_training_collection_passes_its_backend_to_the_runner(tmp_path, cluster):
    from toolself.train.collect import collect, labelled_trajectories

    result = collect(["builtin:research"], "expert", tmp_path / "collect", samples=2, limit=1, progress=False,
                     backend=RayBackend(num_cpus=0.5))
    assert (result.attempts, result.ran, result.errors) == (2, 2, 0)
    trajectories = labelled_trajectories(tmp_path / "collect")
    assert len(trajectories) == 2 and all(t.metadata["correct"] for t in trajectories)


@tool
def hang(key: str) -> str:
    """A tool that does not return in time.

    Args:
        key: Anything.
    """
    time.sleep(60)
    return "late"


def hanging_policy(messages, tools):
    """Like `policy`, but task t0 calls a tool that never returns in time."""
    if not tools:
        return CONFIG.replace('["lookup"]', '["lookup", "hang"]')
    if number_in(messages) == 0 and messages[-1].role != "tool":
        return call("hang", key="0")
    return policy(messages, tools)


def test_an_attempt_stuck_past_its_limit_is_abandoned_and_its_ray_task_cancelled(tmp_path, cluster):
    spec = write_tasks(tmp_path / "tasks.jsonl", 2)
    pool = ToolPool([lookup, hang])
    started = time.monotonic()
    with serving(ScriptedModel([], default=hanging_policy)) as url:
        # Each attempt holds the whole cluster: t1 can start only once t0's worker is freed.
        with pytest.warns(RuntimeWarning, match="concurrency 2 lowered to 1"):
            summary = run_eval([spec], ["toolself"], f"openai:scripted@{url}", tmp_path / "out", concurrency=2,
                               timeout=4, grace=1, progress=False, pool=pool, backend=RayBackend(num_cpus=2))
    records = {r.task_id: r for r in summary.records}
    assert records["t0"].status == "timeout" and records["t0"].end_reason == "abandoned"
    assert records["t1"].status == "ok"
    assert time.monotonic() - started < 30


def test_a_model_object_that_cannot_travel_to_the_workers_is_refused_with_a_way_out(tmp_path, cluster):
    from toolself.models.openai_compat import OpenAIModel

    spec = write_tasks(tmp_path / "tasks.jsonl", 1)
    with pytest.raises(ValueError, match="give models as specs"):
        run_eval([spec], ["toolself"], OpenAIModel("m", "http://127.0.0.1:9/v1"), tmp_path / "out", progress=False,
                 pool=POOL, backend=RayBackend(num_cpus=0.5))
