"""Deciding whether an attempt succeeded, and saying why.

Every verdict is a `Score` that names its scorer and its reason, and carries the benchmark's
other reported numbers in `metrics` (HotpotQA's F1 beside its EM, GSM8K's strict and flexible
extractions). Answers are scored by the benchmark's own rules (`toolself.evals.rules`, one
module per benchmark); FRAMES and xbench by an `LLMJudge` speaking the benchmark's grading
protocol, with verdicts cached on disk by a hash of (protocol, question, reference, answer), so
re-scoring a run costs nothing (`judge`). `tests`: the task's check, run in the attempt's sandbox and
decided by the test runner's own per-test report (code tasks, SWE-bench; see
`toolself.evals.checks`).
"""

from __future__ import annotations

from typing import Any

from toolself.evals.judge import LLMJudge, Score
from toolself.evals.task import Task, TaskEnvironment


# test execution ------------------------------------------------------------------------------

def tests_score(task: Task, env: TaskEnvironment | None) -> Score:
    """The task's check, run by `checks` in the attempt's sandbox once its processes are gone,
    on the grader's restored files; correct only on the test runner's own report that every
    test in `task.check_tests` passed (an exit status alone never is)."""
    if not task.check_command:
        return Score(False, "tests", "the task has no check command")
    if env is None or env.closed:
        return Score(False, "tests", "no open environment to run the check in")
    from toolself.evals.checks import check_attempt, expected_ids, status_of

    expected = expected_ids(task.check_tests)
    verdict, run = check_attempt(env.context, task.check_command, task.check_files, expected, task.check_timeout)
    details = {"command": task.check_command, "exit_status": run.exit_status, "seconds": round(run.seconds, 3),
               "output": run.output, "runner_finished": run.finished,
               "tests": {t: status_of(t, run.outcomes) for t in expected[:200]}}
    if run.tampered:
        details["tampered"] = run.tampered
    if run.exit_status is None:
        return Score(False, "tests", f"the check timed out after {task.check_timeout:g} s", details)
    if task.metadata.get("scorer") == "swebench":
        return _swebench_score(task, verdict, run, details)
    return Score(verdict.passed, "tests", verdict.reason, details)


def _swebench_score(task: Task, verdict: Any, run: Any, details: dict[str, Any]) -> Score:
    """SWE-bench's own rules decide from the log (`rules.swebench`), but code under test prints
    into that log; so where the runner also reports per test (pytest, Django's runner) its
    report must agree, and only a runner without one (sympy's `bin/test`) is taken on its log."""
    from toolself.evals.checks import reports_per_test
    from toolself.evals.rules.swebench import swebench_verdict

    official = swebench_verdict(task, run.log)
    official.details = {**details, **official.details}
    if not reports_per_test(task.check_command):
        official.details["evidence"] = "the printed log only: this test runner sends no per-test report"
        return official
    if official.correct and not verdict.passed:
        return Score(False, official.scorer, "the log reads resolved but the test runner's own report does not: "
                     + verdict.reason, official.details, metrics=official.metrics)
    return official


# dispatch ------------------------------------------------------------------------------------

def score(task: Task, prediction: str | None, env: TaskEnvironment | None = None,
          judge: LLMJudge | None = None) -> Score:
    """Score one attempt: a task with a check command (or the `tests` scorer) by its tests,
    anything else by the rules of the scorer its metadata names (see `toolself.evals.rules`)."""
    if task.check_command or task.metadata.get("scorer") == "tests":
        return tests_score(task, env)
    from toolself.evals.rules import score_answer

    return score_answer(task, prediction, judge)
