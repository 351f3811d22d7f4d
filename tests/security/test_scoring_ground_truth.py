"""No reference answer within the sandbox's reach (finding 4 of issue 25): model code cannot
regenerate a built-in suite's tasks, nor read a run's records."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from toolself.evals.records import safe_name
from toolself.evals.runner import run_eval
from toolself.evals.suites import generate_suite
from toolself.evals.suites.common import suite_key_id
from toolself.evals.task import Task
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool
from toolself.tools.sandbox import UID_BASE
from toolself.tools.shell import execute_bash

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs a root host, which gives each attempt a uid of its own")
pytestmark = pytest.mark.timeout(120)

REGENERATE = ("python3 -c \"from toolself.evals.suites import generate_suite; "
              "print([t.answer for t in generate_suite('data', 'heldout', n=5)])\"")


@pytest.fixture
def shared_cache(monkeypatch):
    """The host's cache in a folder everyone may pass through, so that only the key file's own
    mode keeps the key from the sandbox."""
    folder = Path(tempfile.mkdtemp(prefix="toolself-cache-"))
    os.chmod(folder, 0o755)
    monkeypatch.setenv("TOOLSELF_CACHE", str(folder))
    monkeypatch.delenv("TOOLSELF_SUITE_KEY", raising=False)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_the_suite_key_decides_the_tasks_and_public_gives_the_unkeyed_ones(monkeypatch):
    def answers(key):
        monkeypatch.setenv("TOOLSELF_SUITE_KEY", key)
        return [t.answer for t in generate_suite("data", "heldout", n=8)]

    assert answers("k1") == answers("k1")
    assert answers("k1") != answers("k2") != answers("public")
    assert suite_key_id("public") == "public" and suite_key_id("k1") != "k1"


def test_model_code_that_regenerates_a_builtin_suite_gets_other_answers(shared_cache):
    host = [t.answer for t in generate_suite("data", "heldout", n=5)]
    task = Task(id="t", question="q")
    with task.environment() as env:
        seen = execute_bash({"command": REGENERATE}, env.context).content
    assert str(host) not in seen
    assert not any(f"'{answer}'" in seen for answer in host if len(answer) > 2)


@needs_root
def test_the_hosts_suite_key_is_unreadable_by_the_sandbox(shared_cache):
    generate_suite("data", "heldout", n=1)
    key = shared_cache / "suite.key"
    task = Task(id="t", question="q")
    with task.environment() as env:
        seen = execute_bash({"command": f"cat {key}; echo status=$?"}, env.context).content
    assert key.read_text().strip() not in seen and "status=1" in seen
    assert (key.stat().st_mode & 0o777) == 0o600


CONFIG = json.dumps({"subgoal": "answer", "strategy": "Answer.", "toolbox": [], "knowledge": "none",
                     "context_mode": "basic"})


def answer_at_once(messages, tools):
    return CONFIG if not tools else call("terminate", answer="42")


@pytest.fixture
def run_folder(tmp_path):
    spec = tmp_path / "tasks.jsonl"
    spec.write_text(json.dumps({"id": "t0", "question": "What is six times seven?", "answer": "42"}) + "\n")
    out = Path(tempfile.mkdtemp(prefix="toolself-run-")) / "eval"
    os.chmod(out.parent, 0o755)
    run_eval([f"jsonl:{spec}"], ["vanilla"], ScriptedModel([], default=answer_at_once), out, concurrency=1,
             timeout=30, progress=False, pool=ToolPool([]))
    yield out
    subprocess.run(["rm", "-rf", str(out.parent)], check=False)


def test_a_runs_records_are_owner_only(run_folder):
    method = run_folder / safe_name("vanilla")
    assert "\"reference\": \"42\"" in (method / "trajectories.jsonl").read_text()
    assert run_folder.stat().st_mode & 0o777 == 0o711
    assert method.stat().st_mode & 0o777 == 0o700
    for path in [run_folder / "run.json", method / "trajectories.jsonl", method / "results.jsonl"]:
        assert path.stat().st_mode & 0o077 == 0, path


@needs_root
def test_a_sandbox_uid_cannot_read_a_runs_records(run_folder):
    method = run_folder / safe_name("vanilla")
    paths = [method / "trajectories.jsonl", method / "results.jsonl", run_folder / "run.json"]
    done = subprocess.run(["/bin/sh", "-c", 'ls "$1"; shift; cat "$@"', "sh", str(run_folder), *map(str, paths)],
                          user=UID_BASE - 7, group=UID_BASE - 7, extra_groups=[], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode != 0 and "Permission denied" in done.stderr
    assert done.stdout == ""
