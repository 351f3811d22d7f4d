"""The resumable evaluation runner, specified on a deterministic scripted model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from toolself.evals.records import AttemptKey, AttemptRecord, MethodStore, read_records, safe_name
from toolself.evals.runner import SettingsMismatch, run_eval
from toolself.evals.task import Task
from toolself.models.base import Message, ModelError
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool

REPO = Path(__file__).resolve().parents[1]
RELEASE = threading.Event()  # lets a deliberately stuck tool go once its test is over


@tool
def lookup(key: str) -> str:
    """Look a number up.

    Args:
        key: The number, as text.
    """
    return f"double of {key} is {2 * int(key)}"


@tool
def stuck(key: str) -> str:
    """A tool that does not return in time.

    Args:
        key: Anything.
    """
    RELEASE.wait(20)
    return "late"


POOL = ToolPool([lookup, stuck])
CONFIG = json.dumps({"subgoal": "double the number", "strategy": "Use lookup, then answer.", "toolbox": ["lookup"],
                     "knowledge": "none", "context_mode": "basic"})


def number_in(messages: list[Message]) -> int:
    question = next(m.content for m in messages if "Double" in m.content)
    return int(question.split("Double ")[1].split()[0].strip("?."))


def policy(messages, tools, tool_name="lookup"):
    """Configure, look the number up, then answer: right for even numbers, off by one for odd."""
    if not tools:
        return CONFIG
    last = messages[-1]
    if last.role == "tool" and last.content.startswith("double of"):
        n = number_in(messages)
        return call("terminate", answer=str(2 * n if n % 2 == 0 else 2 * n + 1))
    return call(tool_name, key=str(number_in(messages)))


def write_tasks(path: Path, n: int) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"t{i}", "question": f"Double {i}?", "answer": str(2 * i)}) + "\n")
    return f"jsonl:{path}"


def run(tmp_path, spec, model=None, out=None, methods=("toolself", "vanilla"), **kwargs):
    options = dict(concurrency=4, timeout=30, progress=False, pool=POOL)
    options.update(kwargs)
    return run_eval([spec], list(methods), model or ScriptedModel([], default=policy), out or tmp_path / "out",
                    **options)


def test_each_attempt_is_scored_and_recorded_once_per_method(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 4)
    summary = run(tmp_path, spec)
    for method in ("toolself", "vanilla"):
        records = read_records(tmp_path / "out" / safe_name(method))
        assert sorted(r.task_id for r in records) == ["t0", "t1", "t2", "t3"]
        assert {r.task_id for r in records if r.correct} == {"t0", "t2"}
        assert all(r.status == "ok" and r.end_reason == "terminate" and r.scorer == "gaia" for r in records)
    assert summary.accuracy()["toolself"]["tasks"]["accuracy"] == 0.5
    assert summary.status == {"ok": 8, "timeout": 0, "error": 0}


def test_records_carry_tokens_steps_stages_and_the_trajectory_beside_them(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 2)
    run(tmp_path, spec, methods=("toolself",))
    folder = tmp_path / "out" / "toolself"
    records = {r.task_id: r for r in read_records(folder)}
    r = records["t1"]
    assert (r.steps, r.stages, r.reconfigurations) == (2, 1, 0)
    assert r.prompt_tokens > 0 and r.completion_tokens > 0 and r.answer == "3" and r.reference == "2"
    lines = (folder / "trajectories.jsonl").read_text().splitlines()
    trajectories = {json.loads(line)["metadata"]["attempt"]["task_id"]: json.loads(line) for line in lines}
    assert set(trajectories) == {"t0", "t1"}
    assert trajectories["t1"]["id"] == r.trajectory_id
    assert trajectories["t1"]["metadata"]["attempt"] == AttemptKey(f"{spec}", "t1", "toolself", 0).to_dict()


def test_rerunning_skips_finished_attempts_and_runs_only_the_new_ones(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 5)
    run(tmp_path, spec, limit=3)
    model = ScriptedModel([], default=policy)
    summary = run(tmp_path, spec, model=model, limit=5)
    assert (summary.skipped, summary.ran, summary.attempts) == (6, 4, 10)
    assert len(model.calls) == 4 * 3 - 2  # two new tasks x (toolself: 3 calls, vanilla: 2)
    again = ScriptedModel([], default=policy)
    summary = run(tmp_path, spec, model=again, limit=5)
    assert summary.ran == 0 and again.calls == []
    assert len(read_records(tmp_path / "out" / "toolself")) == 5


def test_a_rerun_with_other_settings_refuses_unless_forced(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 1)
    run(tmp_path, spec, methods=("vanilla",))
    with pytest.raises(SettingsMismatch, match="timeout: was 30"):
        run(tmp_path, spec, methods=("vanilla",), timeout=60)
    summary = run(tmp_path, spec, methods=("vanilla",), timeout=60, force=True)
    assert summary.skipped == 1
    saved = json.loads((tmp_path / "out" / "run.json").read_text())
    assert len(saved["commands"]) == 2 and saved["identity"]["timeout"] == 60


def test_a_served_model_resumes_on_a_restarted_server_at_another_address(tmp_path):
    from http_fixtures import serving

    spec = write_tasks(tmp_path / "tasks.jsonl", 3)
    with serving(ScriptedModel([], default=policy)) as first:
        run(tmp_path, spec, model=f"openai:doubler@{first}", methods=("toolself",), limit=2)
    with serving(ScriptedModel([], default=policy)) as second:  # the same model, on another port
        summary = run(tmp_path, spec, model=f"openai:doubler@{second}", methods=("toolself",))
    assert (summary.skipped, summary.ran) == (2, 1)
    saved = json.loads((tmp_path / "out" / "run.json").read_text())
    assert saved["identity"]["model"] == "openai:doubler"
    assert [c["served_at"] for c in saved["commands"]] == [{"model": f"openai:doubler@{first}"},
                                                           {"model": f"openai:doubler@{second}"}]


def test_another_served_model_is_refused_wherever_it_is_served(tmp_path):
    from http_fixtures import serving

    spec = write_tasks(tmp_path / "tasks.jsonl", 1)
    with serving(ScriptedModel([], default=policy)) as url:
        run(tmp_path, spec, model=f"openai:doubler@{url}", methods=("toolself",))
        with pytest.raises(SettingsMismatch, match="model: was 'openai:doubler', now 'openai:tripler'"):
            run(tmp_path, spec, model=f"openai:tripler@{url}", methods=("toolself",))


def test_a_run_recorded_with_its_servers_address_resumes_elsewhere(tmp_path):
    from http_fixtures import serving

    spec = write_tasks(tmp_path / "tasks.jsonl", 2)
    with serving(ScriptedModel([], default=policy)) as first:
        run(tmp_path, spec, model=f"openai:doubler@{first}", methods=("toolself",), limit=1)
    saved = json.loads((tmp_path / "out" / "run.json").read_text())
    saved["identity"]["model"] = f"openai:doubler@{first}"  # as runs recorded it before names alone
    (tmp_path / "out" / "run.json").write_text(json.dumps(saved))
    with serving(ScriptedModel([], default=policy)) as second:
        assert run(tmp_path, spec, model=f"openai:doubler@{second}", methods=("toolself",)).ran == 1


def test_a_rerun_runs_again_the_attempts_that_ended_in_an_error_when_the_server_was_down(tmp_path):
    from http_fixtures import serving
    from ports import free_port

    spec = write_tasks(tmp_path / "tasks.jsonl", 3)
    once = {"methods": ("toolself",), "model_options": {"max_retries": 0}}
    down = run(tmp_path, spec, model=f"openai:doubler@http://127.0.0.1:{free_port()}/v1", **once)
    assert down.status["error"] == 3
    with serving(ScriptedModel([], default=policy)) as url:  # the server is up again, at another address
        again = run(tmp_path, spec, model=f"openai:doubler@{url}", **once)
    assert (again.ran, again.retried, again.skipped, again.status["ok"]) == (3, 3, 0, 3)
    assert [r.status for r in read_records(tmp_path / "out" / "toolself")] == ["ok"] * 3
    set_aside = (tmp_path / "out" / "toolself" / "errors.jsonl").read_text().splitlines()
    assert len(set_aside) == 3 and all("Connection refused" in json.loads(line)["error"] for line in set_aside)
    assert (tmp_path / "out" / "toolself" / "errors.jsonl").stat().st_mode & 0o777 == 0o600  # references inside
    trajectories = (tmp_path / "out" / "toolself" / "trajectories.jsonl").read_text().splitlines()
    assert len(trajectories) == 3  # the failed attempts' trajectories went with their records


def test_an_attempt_the_judge_could_not_judge_is_an_error_and_is_judged_on_a_rerun(tmp_path):
    from http_fixtures import running_server
    from ports import free_port
    from test_rules_judged import ProtocolJudge

    from toolself.evals.judge import LLMJudge
    from toolself.models.openai_compat import OpenAIModel

    spec = write_tasks(tmp_path / "tasks.jsonl", 3) + "?scorer=frames_judge"

    def judge(url: str) -> LLMJudge:
        return LLMJudge(OpenAIModel("judge", url + "/v1", "k", max_retries=0, timeout=10), cache_dir=tmp_path / "j")

    down = run(tmp_path, spec, methods=("toolself",), judge=judge(f"http://127.0.0.1:{free_port()}"))
    assert down.status == {"ok": 0, "timeout": 0, "error": 3}
    records = read_records(tmp_path / "out" / "toolself")
    assert all(r.error.startswith("JudgeFailed: the judge failed") and not r.correct for r in records)
    with running_server(ProtocolJudge().app) as url:
        again = run(tmp_path, spec, methods=("toolself",), judge=judge(url))
    assert (again.ran, again.retried) == (3, 3)
    assert {r.task_id: r.correct for r in read_records(tmp_path / "out" / "toolself")} == {
        "t0": True, "t1": False, "t2": True}


def failing(messages, tools):
    raise ModelError("the model server went away")


def test_a_rerun_may_keep_the_attempts_that_ended_in_an_error(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 2)
    run(tmp_path, spec, model=ScriptedModel([], default=failing), methods=("vanilla",))
    kept = run(tmp_path, spec, methods=("vanilla",), retry_errors=False)
    assert (kept.ran, kept.retried, kept.skipped) == (0, 0, 2)
    assert not (tmp_path / "out" / "vanilla" / "errors.jsonl").exists()


def test_a_run_whose_attempts_keep_failing_stops_and_leaves_the_rest_for_a_rerun(tmp_path):
    from toolself.evals.runner import AttemptsFailing

    spec = write_tasks(tmp_path / "tasks.jsonl", 10)
    with pytest.raises(AttemptsFailing, match=r"3 attempts in a row ended in an error, so the run stopped with 6 "
                                              r"attempts not started \(the last error: .*the model server went away"):
        run(tmp_path, spec, model=ScriptedModel([], default=failing), methods=("vanilla",), concurrency=1,
            stop_after_errors=3)
    assert len(read_records(tmp_path / "out" / "vanilla")) == 4  # and the one in flight as it stopped
    resumed = run(tmp_path, spec, methods=("vanilla",), concurrency=1, stop_after_errors=3)
    assert (resumed.ran, resumed.retried, resumed.status["ok"]) == (10, 4, 10)


def test_errors_between_successes_do_not_stop_a_run(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 6)

    def every_other(messages, tools):  # odd tasks fail
        if number_in(messages) % 2:
            raise ModelError("flaky")
        return policy(messages, tools)

    summary = run(tmp_path, spec, model=ScriptedModel([], default=every_other), methods=("vanilla",),
                  concurrency=1, stop_after_errors=2)
    assert summary.status == {"ok": 3, "timeout": 0, "error": 3}


def test_a_second_runner_on_the_same_folder_is_refused_while_the_first_holds_it(tmp_path):
    import fcntl

    from toolself.evals.runner import RunInProgress

    spec = write_tasks(tmp_path / "tasks.jsonl", 1)
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(RunInProgress, match="another `toolself eval` is writing"):
            run(tmp_path, spec, methods=("vanilla",))
    assert run(tmp_path, spec, methods=("vanilla",)).ran == 1


def test_workspaces_left_by_a_killed_run_are_cleared_on_restart(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 1)
    stale = tmp_path / "out" / "workspaces" / "toolself-t0-dead"
    stale.mkdir(parents=True)
    (stale / "half-written.txt").write_text("x")
    run(tmp_path, spec, methods=("vanilla",))
    assert not stale.exists()


def test_an_attempt_past_its_time_limit_is_recorded_as_timeout(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 2)

    def slow(messages, tools):
        time.sleep(0.15)
        return policy(messages, tools)

    summary = run(tmp_path, spec, model=ScriptedModel([], default=slow), methods=("toolself",), timeout=0.2, grace=5)
    records = read_records(tmp_path / "out" / "toolself")
    assert {r.status for r in records} == {"timeout"}
    assert {r.end_reason for r in records} <= {"budget:time", "budget:cancelled"}
    assert summary.status["timeout"] == 2


def test_an_attempt_that_never_returns_is_abandoned_as_timeout_and_the_run_goes_on(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 3)

    def stuck_on_t1(messages, tools):
        return policy(messages, tools, tool_name="stuck" if number_in(messages) == 1 else "lookup")

    config = json.loads(CONFIG)
    config["toolbox"] = ["lookup", "stuck"]
    model = ScriptedModel([], default=lambda m, t: json.dumps(config) if not t else stuck_on_t1(m, t))
    try:
        started = time.monotonic()
        run(tmp_path, spec, model=model, methods=("toolself",), timeout=1.0, grace=0.3)
        assert time.monotonic() - started < 5
    finally:
        RELEASE.set()
    records = {r.task_id: r for r in read_records(tmp_path / "out" / "toolself")}
    assert records["t1"].status == "timeout" and records["t1"].end_reason == "abandoned"
    assert records["t1"].steps == 0 and records["t1"].stages == 1  # what it had done when given up
    assert records["t0"].status == records["t2"].status == "ok"
    lines = (tmp_path / "out" / "toolself" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3


def test_a_crashing_attempt_is_recorded_with_its_traceback_while_the_others_finish(tmp_path):
    def broken_setup(workspace):
        raise RuntimeError("the checkout failed")

    tasks = [Task(id=f"t{i}", question=f"Double {i}?", answer=str(2 * i)) for i in range(3)]
    tasks[1].setup = broken_setup
    summary = run(tmp_path, "custom:set", methods=("toolself",), loader=lambda spec, **_: tasks)
    records = {r.task_id: r for r in read_records(tmp_path / "out" / "toolself")}
    assert records["t1"].status == "error" and "RuntimeError: the checkout failed" in records["t1"].error
    assert "Traceback" in records["t1"].error
    assert records["t0"].status == records["t2"].status == "ok" and records["t0"].correct
    assert summary.status == {"ok": 2, "timeout": 0, "error": 1}


def test_a_model_failure_inside_the_agent_is_recorded_as_error(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 2)

    def failing(messages, tools):
        if tools and number_in(messages) == 0:
            raise ConnectionError("the server went away")
        return policy(messages, tools)

    run(tmp_path, spec, model=ScriptedModel([], default=failing), methods=("vanilla",))
    records = {r.task_id: r for r in read_records(tmp_path / "out" / "vanilla")}
    assert records["t0"].status == "error" and "ConnectionError: the server went away" in records["t0"].error
    assert records["t1"].status == "ok"


def test_repeats_give_one_record_per_task_and_repeat_and_a_standard_error(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 3)
    summary = run(tmp_path, spec, methods=("vanilla",), repeats=3)
    records = read_records(tmp_path / "out" / "vanilla")
    assert sorted((r.task_id, r.repeat) for r in records) == [(f"t{i}", r) for i in range(3) for r in range(3)]
    cell = summary.accuracy()["vanilla"]["tasks"]
    assert cell["accuracy"] == pytest.approx(2 / 3) and cell["stderr"] == 0.0 and cell["attempts"] == 9


# -- the files survive a crash at any point ----------------------------------------------------

def record(task_id: str, method: str = "toolself", correct: bool = True) -> AttemptRecord:
    return AttemptRecord(dataset="d", task_id=task_id, method=method, repeat=0, status="ok", correct=correct)


def trajectory_line(task_id: str) -> str:
    return json.dumps({"id": task_id, "metadata": {"attempt": AttemptKey("d", task_id, "toolself", 0).to_dict()}})


def test_opening_a_store_cuts_a_torn_line_and_drops_trajectories_without_a_result(tmp_path):
    folder = tmp_path / "toolself"
    store = MethodStore.open(folder)
    store.commit(record("a"), trajectory_line("a"))
    store.close()
    with open(folder / "trajectories.jsonl", "a") as f:
        f.write(trajectory_line("b") + "\n")  # b's trajectory was written, its result never was
        f.write(trajectory_line("c")[:25])  # c was cut mid-line
    with open(folder / "results.jsonl", "a") as f:
        f.write(record("b").to_json()[:30])
    store = MethodStore.open(folder)
    assert list(store.records) == [AttemptKey("d", "a", "toolself", 0).id]
    assert [json.loads(line)["id"] for line in (folder / "trajectories.jsonl").read_text().splitlines()] == ["a"]
    assert (folder / "results.jsonl").read_text().endswith("\n")
    assert store.commit(record("b"), trajectory_line("b"))
    assert not store.commit(record("b"), trajectory_line("b"))
    store.close()
    assert [r.task_id for r in read_records(folder)] == ["a", "b"]


def test_a_corrupt_line_in_the_middle_is_an_error_naming_it(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "results.jsonl").write_text(record("a").to_json() + "\n{oops\n" + record("b").to_json() + "\n")
    with pytest.raises(ValueError, match="results.jsonl:2"):
        MethodStore.open(folder)


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_runner import POOL, policy
    from toolself.evals.runner import run_eval
    from toolself.models.scripted import ScriptedModel

    def paced(messages, tools):
        time.sleep(0.04)
        return policy(messages, tools)

    run_eval([sys.argv[1]], ["toolself", "vanilla"], ScriptedModel([], default=paced, name="scripted"),
             Path(sys.argv[2]), concurrency=3, timeout=30, progress=False, pool=POOL)
""")


def comparable(records):
    return sorted((r.dataset, r.task_id, r.method, r.repeat, r.status, r.answer, r.correct, r.steps, r.stages,
                   r.prompt_tokens, r.completion_tokens) for r in records)


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_to_exactly_the_uninterrupted_result(tmp_path):
    spec = write_tasks(tmp_path / "tasks.jsonl", 24)
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent)))
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results = [out / m / "results.jsonl" for m in ("toolself", "vanilla")]

    def finished() -> int:
        return sum(len(p.read_text().splitlines()) for p in results if p.exists())

    for kill_after in (8, 20):  # killed twice: once in the first run, once in the resumed one
        child = subprocess.Popen([sys.executable, str(script), spec, str(out)], env=env)
        deadline = time.monotonic() + 30
        while finished() < kill_after:
            assert child.poll() is None, "the run finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert finished() < 48, "the kill came too late to test anything"

    resumed = subprocess.run([sys.executable, str(script), spec, str(out)], env=env, timeout=60)
    assert resumed.returncode == 0

    reference = run(tmp_path, spec, model=ScriptedModel([], default=policy, name="scripted"),
                    out=tmp_path / "reference", concurrency=3)
    for method in ("toolself", "vanilla"):
        folder = out / method
        records = read_records(folder)
        assert sorted(r.task_id for r in records) == sorted(f"t{i}" for i in range(24))
        trajectories = [json.loads(line) for line in (folder / "trajectories.jsonl").read_text().splitlines()]
        assert sorted(t["id"] for t in trajectories) == sorted(r.trajectory_id for r in records)
    assert comparable(r for m in ("toolself", "vanilla") for r in read_records(out / m)) == comparable(reference.records)
    from toolself.evals.report import aggregate
    from toolself.evals.runs import load_run

    assert aggregate(load_run(out).records).summary() == reference.table.summary()


def test_progress_outside_a_terminal_prints_a_line_every_n_attempts_with_accuracy_tokens_and_eta(tmp_path):
    import io

    from rich.console import Console

    from toolself.evals.progress import EvalProgress

    stream = io.StringIO()
    progress = EvalProgress(console=Console(file=stream, width=200), every=2)
    spec = write_tasks(tmp_path / "tasks.jsonl", 4)
    run(tmp_path, spec, methods=("vanilla",), progress=progress, concurrency=1)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "eval: 4 attempts, 0 already finished, 4 to run"
    assert lines[1].startswith("2/4 done, 1 running, 0 failed, 0 timed out | accuracy 50.0% | ")
    assert "tokens | elapsed" in lines[1] and "ETA" in lines[1]
    assert lines[-1].startswith("4/4 done, 0 running") and len(lines) == 4


@pytest.mark.slow
def test_every_method_runs_on_every_built_in_suite_with_the_expert_policy(tmp_path):
    from toolself.evals.report import write_report
    from toolself.variants import methods as all_methods

    names = [m.name for m in all_methods()]
    suites = ["builtin:research", "builtin:data", "builtin:code", "builtin:mixed"]
    summary = run_eval(suites, names, "expert", tmp_path / "out", limit=1, concurrency=4, timeout=120,
                       progress=False)
    assert summary.status == {"ok": len(names) * 4, "timeout": 0, "error": 0}
    accuracy = summary.accuracy()
    assert accuracy["toolself"]["average"]["accuracy"] == 1.0
    assert accuracy["static:swe"]["research"]["accuracy"] == 0.0  # no search tool in the swe preset
    stages = {r.method: r.stages for r in summary.records if r.dataset == "builtin:research"}
    assert stages["vanilla"] == 1 and stages["toolself"] > 1
    files = write_report([tmp_path / "out"])
    assert all(f"| {name} |" in files.markdown.read_text() for name in names)


def test_a_run_of_a_local_model_resumes_where_the_model_moved_but_not_from_a_copy_beside_it(tmp_path, tiny):
    import shutil

    spec = write_tasks(tmp_path / "tasks.jsonl", 2)
    once = {"methods": ("vanilla",), "settings": {"max_steps_per_stage": 1}, "timeout": 60}
    first = shutil.copytree(tiny, tmp_path / "first")
    run(tmp_path, spec, model=f"local:{first}", limit=1, **once)
    moved = shutil.move(first, tmp_path / "moved")  # a folder moved, or the model mounted elsewhere
    resumed = run(tmp_path, spec, model=f"local:{moved}", **once)
    assert (resumed.skipped, resumed.ran) == (1, 1)
    saved = json.loads((tmp_path / "out" / "run.json").read_text())
    assert saved["identity"]["model"] == f"local:{moved}"
    copy = shutil.copytree(moved, tmp_path / "copy")  # while the model is still there, this is another one
    with pytest.raises(SettingsMismatch, match=f"model: was 'local:{moved}', now 'local:{copy}'"):
        run(tmp_path, spec, model=f"local:{copy}", **once)
