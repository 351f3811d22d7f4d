"""Ctrl-C, as a real SIGINT to a real `toolself` process: `run` keeps the attempt so far and
exits 130; `eval` and `train` exit 130 with one line, the exact command that resumes them.
The model is `toolself serve` over a scripted model on loopback whose reply hangs until the
test lets it go, so that the signal lands while the command waits for its model."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from http_fixtures import serving
from toolself.interrupts import EXIT_INTERRUPTED
from toolself.models.scripted import ScriptedModel, call
from toolself.trajectory import read_jsonl

pytestmark = pytest.mark.timeout(120)

CONFIG = json.dumps({"subgoal": "compute it", "strategy": "Use the interpreter, then answer.",
                     "toolbox": ["code_interpreter"], "knowledge": "none", "context_mode": "basic"})


class Stuck:
    """A reply that tells the test it has been asked, then blocks until the test is done."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()

    def __call__(self, messages, tools):
        self.asked.set()
        self.release.wait(60)
        return call("terminate", answer="too late")


@pytest.fixture
def stuck():
    reply = Stuck()
    yield reply
    reply.release.set()


def heed_ctrl_c() -> None:
    """A shell that starts the test run in the background has it ignore SIGINT, which its
    children inherit: give the command the default disposition a terminal's Ctrl-C meets."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(args: list[str], cwd: Path, ready: threading.Event | None = None, marker: str | None = None,
                within: float = 60, signum: int = signal.SIGINT) -> subprocess.CompletedProcess:
    """Start `python -m toolself ARGS`, send SIGINT (or `signum`) once `ready` is set (or
    `marker` is in its output), and return how it ended."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLSELF_DEBUG"}
    process = subprocess.Popen([sys.executable, "-m", "toolself", *args], cwd=cwd, env=env, text=True,
                               preexec_fn=heed_ctrl_c,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[str] = []
    came = threading.Event()

    def read_stdout() -> None:
        for line in process.stdout:
            seen.append(line)
            if marker is not None and marker in line:
                came.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        if not (ready or came).wait(within):
            process.kill()
            pytest.fail("the command never reached its model:\n" + "".join(seen) + process.stderr.read())
        process.send_signal(signum)
        stderr = process.stderr.read()
        process.wait(60)
    finally:
        process.kill()
    reader.join(5)
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(seen), stderr)


@pytest.mark.parametrize("limit", [[], ["--timeout", "60"]], ids=["no-time-limit", "a-bounded-model-call"])
def test_ctrl_c_during_run_writes_the_attempt_so_far_and_exits_130(tmp_path, stuck, limit):
    out = tmp_path / "t.jsonl"
    with serving(ScriptedModel([CONFIG], default=stuck)) as url:
        ended = interrupted(["run", "What is 6 x 7?", "--model", f"openai:scripted@{url}", "--out", str(out), *limit],
                            tmp_path, ready=stuck.asked)
    assert ended.returncode == EXIT_INTERRUPTED, ended.stderr
    assert f"interrupted; the attempt so far is written to {out}" in ended.stderr
    [trajectory] = read_jsonl(out)
    assert trajectory.end_reason == "interrupted"
    assert trajectory.stages[0].configuration.subgoal == "compute it"


def resume_line(stderr: str) -> list[str]:
    [line] = [x for x in stderr.splitlines() if x.startswith("interrupted; to resume: ")]
    command = shlex.split(line.removeprefix("interrupted; to resume: "))
    return command[command.index("toolself") + 1:]


def test_ctrl_c_during_eval_exits_130_with_the_command_that_resumes_it(tmp_path, stuck):
    with serving(ScriptedModel([], default=stuck)) as url:
        args = ["eval", "--tasks", "builtin:research", "--limit", "1", "--model", f"openai:scripted@{url}",
                "--out", str(tmp_path / "run")]
        ended = interrupted(args, tmp_path, ready=stuck.asked)
    assert ended.returncode == EXIT_INTERRUPTED, ended.stderr
    assert resume_line(ended.stderr) == args


def test_ctrl_c_during_train_rft_exits_130_with_the_command_that_resumes_it(tmp_path, stuck):
    with serving(ScriptedModel([], default=stuck)) as url:
        args = ["train", "rft", "--tasks", "builtin:research", "--limit", "1", "--samples", "1",
                "--teacher", f"openai:scripted@{url}", "--out", str(tmp_path / "rft")]
        ended = interrupted(args + ["--no-resume"], tmp_path, ready=stuck.asked)
    assert ended.returncode == EXIT_INTERRUPTED, ended.stderr
    assert resume_line(ended.stderr) == args + ["--resume"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_stop_signal_during_eval_stops_it_as_ctrl_c_does_with_the_command_that_resumes_it(tmp_path, stuck, stop):
    with serving(ScriptedModel([], default=stuck)) as url:
        args = ["eval", "--tasks", "builtin:research", "--limit", "1", "--model", f"openai:scripted@{url}",
                "--out", str(tmp_path / "run")]
        ended = interrupted(args, tmp_path, ready=stuck.asked, signum=stop)
    assert ended.returncode == EXIT_INTERRUPTED, ended.stderr
    assert resume_line(ended.stderr) == args


def test_sigterm_to_train_cat_reaches_the_process_of_its_step_and_exits_with_the_command_that_resumes_it(
        tmp_path, stuck):
    """A container runtime signals its first process only: `train cat`, whose step runs in a
    process of its own."""
    with serving(ScriptedModel([], default=stuck)) as url:
        args = ["train", "cat", "--tasks", "builtin:research", "--limit", "1", "--teacher-samples", "1",
                "--teacher", f"openai:scripted@{url}", "--out", str(tmp_path / "cat")]
        ended = interrupted(args, tmp_path, ready=stuck.asked, signum=signal.SIGTERM)
    assert ended.returncode == EXIT_INTERRUPTED, ended.stderr
    assert resume_line(ended.stderr) == args
    state = json.loads((tmp_path / "cat" / "state.json").read_text())
    assert not state["steps"].get("collect_teacher", {}).get("done")


@pytest.mark.slow
def test_ctrl_c_while_the_embedded_model_decodes_exits_130_without_aborting(tmp_path):
    out = tmp_path / "t.jsonl"
    ended = interrupted(["run", "Write a long essay about kettles.", "--out", str(out)], tmp_path,
                        marker="sub-goal", within=110)
    assert "terminate called" not in ended.stderr
    assert ended.returncode == EXIT_INTERRUPTED, ended.stderr
    [trajectory] = read_jsonl(out)
    assert trajectory.end_reason == "interrupted" and trajectory.stages


EXIT_WHILE_DECODING = """
import sys, threading, time
from toolself.models import load_model
from toolself.models.base import Message

model = load_model("embedded")

def reply():
    try:
        model.complete([Message("user", "Write a long essay about kettles.")], max_tokens=4000)
    except Exception:
        pass

threading.Thread(target=reply, daemon=True).start()
deadline = time.monotonic() + 60
while model.engine.stats["steps"] < 5 and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(0 if model.engine.stats["steps"] >= 5 else 3)
"""


@pytest.mark.slow
def test_a_process_that_exits_while_the_embedded_model_decodes_exits_cleanly():
    """The cause of the abort on Ctrl-C: the interpreter finalizing while an engine thread is
    inside a torch op (see `engine._stop_running_engines`)."""
    ended = subprocess.run([sys.executable, "-c", EXIT_WHILE_DECODING], capture_output=True, text=True, timeout=110)
    assert "terminate called" not in ended.stderr
    assert ended.returncode == 0, ended.stderr
