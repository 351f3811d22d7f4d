"""Deciding whether an attempt succeeded, and saying why.

Every verdict is a `Score` that names its scorer and its reason, and carries the benchmark's
other reported numbers in `metrics` (HotpotQA's F1 beside its EM, GSM8K's strict and flexible
extractions). Answers are scored by the benchmark's own rules (`toolself.evals.rules`, one
module per benchmark); FRAMES and xbench by an `LLMJudge` speaking the benchmark's grading
protocol, with verdicts cached on disk by a hash of (protocol, question, reference, answer), so
re-scoring a run costs nothing. `tests`: the task's check, run in the attempt's sandbox and
decided by the test runner's own per-test report (code tasks, SWE-bench; see
`toolself.evals.checks`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from toolself.evals.task import Task, TaskEnvironment
from toolself.models.base import ChatModel, Message


@dataclass
class Score:
    correct: bool
    scorer: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


# LLM judge -----------------------------------------------------------------------------------

_VERDICT = re.compile(r"^\s*VERDICT:\s*(CORRECT|INCORRECT)\s*$", re.MULTILINE)


def judge_prompt() -> str:
    return resources.files("toolself").joinpath("prompts/judge.txt").read_text(encoding="utf-8")


def parse_verdict(text: str) -> bool | None:
    """True / False for exactly one verdict line, None for anything else (no guessing)."""
    found = _VERDICT.findall(text or "")
    if len(found) != 1:
        return None
    return found[0] == "CORRECT"


def default_cache_dir() -> Path:
    base = os.environ.get("TOOLSELF_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "toolself") / "judge"


class LLMJudge:
    """A judge model with an on-disk verdict cache.

    The cache lives in one folder per judge model, keyed by the hash of (question, reference,
    prediction); unparsable verdicts are never cached, so a later run asks again.
    """

    name = "llm_judge"

    def __init__(self, model: ChatModel, cache_dir: Path | str | None = None, prompt: str | None = None,
                 attempts: int = 2):
        self.model = model
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", getattr(model, "name", "judge"))[:80]
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir() / safe
        self.prompt = prompt if prompt is not None else judge_prompt()
        self.attempts = attempts

    @classmethod
    def from_endpoint(cls, model: str, base_url: str, api_key: str | None = None, **kwargs: Any) -> "LLMJudge":
        from toolself.models.openai_compat import OpenAIModel

        return cls(OpenAIModel(model, base_url, api_key=api_key), **kwargs)

    @staticmethod
    def key(question: str, reference: str, prediction: str, protocol: str | None = None) -> str:
        parts = [question, reference, prediction] + ([protocol] if protocol else [])
        return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def judge(self, question: str, reference: str, prediction: str, protocol: Any = None) -> Score:
        """A verdict under `protocol` (a `rules.judged.JudgeProtocol`: a benchmark's own prompt
        and decision parser), or under this judge's prompt and the strict VERDICT line."""
        key = self.key(question, reference, prediction, protocol.name if protocol else None)
        path = self._cache_path(key)
        if path.exists():
            try:
                cached = json.loads(path.read_text(encoding="utf-8"))
                return Score(bool(cached["correct"]), self.name, cached["reason"] + " (cached)",
                             {**cached.get("details", {}), "cached": True})
            except (json.JSONDecodeError, KeyError, OSError):
                pass
        template, parse = (protocol.prompt, protocol.parse) if protocol else (self.prompt, parse_verdict)
        text = template.replace("{question}", question).replace("{reference}", reference).replace(
            "{prediction}", prediction)
        replies: list[str] = []
        failures: list[str] = []
        for _ in range(self.attempts):
            try:
                reply = self.model.complete([Message(role="user", content=text)]).text or ""
            except Exception as exc:  # the model's client already retried 429, 5xx and timeouts
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            replies.append(reply)
            verdict = parse(reply)
            if verdict is not None:
                reason = f"the judge said {'CORRECT' if verdict else 'INCORRECT'}"
                details = {"judge_model": getattr(self.model, "name", ""), "reply": reply, "cached": False,
                           "protocol": protocol.name if protocol else "toolself"}
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"correct": verdict, "reason": reason, "details": details}), encoding="utf-8")
                tmp.replace(path)
                return Score(verdict, self.name, reason, details)
        if failures and not replies:
            # Not cached and not a verdict: a rerun asks again once the judge is back.
            return Score(False, self.name, f"the judge failed {len(failures)} time(s), no verdict: {failures[-1]}",
                         {"judge_failed": True, "failures": failures, "cached": False})
        return Score(False, self.name, f"no strict verdict line in {len(replies)} judge replies",
                     {"replies": replies, "failures": failures, "cached": False})


# dispatch ------------------------------------------------------------------------------------

def score(task: Task, prediction: str | None, env: TaskEnvironment | None = None,
          judge: LLMJudge | None = None) -> Score:
    """Score one attempt: a task with a check command (or the `tests` scorer) by its tests,
    anything else by the rules of the scorer its metadata names (see `toolself.evals.rules`)."""
    if task.check_command or task.metadata.get("scorer") == "tests":
        return tests_score(task, env)
    from toolself.evals.rules import score_answer

    return score_answer(task, prediction, judge)
