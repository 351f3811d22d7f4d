"""Deciding whether an attempt succeeded, and saying why.

Three scorers, each returning a `Score` that names itself and its reason:

- `gaia_exact`: GAIA's normalised exact match, following the official scorer: a numeric
  reference is compared as a float after removing `$`, `%` and commas from the prediction; a
  reference containing `,` or `;` is a list compared element by element; anything else is
  compared after lower-casing and removing whitespace and punctuation. One deliberate
  extension: a numeric prediction that still carries a unit (`17 km`, `3.5 hours`) is read as
  its leading number, because small models add units that the reference omits.
- `llm_judge`: a model behind any OpenAI-compatible endpoint reads the question, the reference
  and the prediction and must answer with one strict verdict line; verdicts are cached on disk
  by a hash of (question, reference, prediction), so re-scoring a run costs nothing.
- `tests`: the task's check command run in the attempt's workspace with a timeout (code tasks).

`score()` picks the scorer from the task: a check command means tests; a task whose metadata
asks for the judge (FRAMES, xbench) uses it when one is given, after a free exact-match check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import string
import subprocess
import sys
import time
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# GAIA normalised exact match -----------------------------------------------------------------

_NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*[^\d\s].*$")


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def normalize_number(text: str) -> float | None:
    """A prediction read as a number: `$`, `%`, commas and a trailing unit removed; None if not."""
    cleaned = text
    for char in ("$", "%", ","):
        cleaned = cleaned.replace(char, "")
    cleaned = cleaned.strip()
    try:
        return float(cleaned)
    except ValueError:
        pass
    match = _NUMBER_WITH_UNIT.match(cleaned)
    if match:
        return float(match.group(1))
    return None


def normalize_str(text: str, remove_punct: bool = True) -> str:
    no_spaces = re.sub(r"\s", "", text).lower()
    if remove_punct:
        return no_spaces.translate(str.maketrans("", "", string.punctuation))
    return no_spaces


def _split_list(text: str) -> list[str]:
    return re.split(r"[,;]", text)


def gaia_match(prediction: str | None, reference: str) -> tuple[bool, str]:
    """(match, why) under GAIA's rules."""
    prediction = "None" if prediction is None else str(prediction)
    reference = str(reference)
    if _is_float(reference):
        value = normalize_number(prediction)
        if value is None:
            return False, f"reference is the number {reference}; prediction {prediction!r} is not a number"
        ok = value == float(reference)
        return ok, f"numbers compared: {value:g} {'==' if ok else '!='} {float(reference):g}"
    if any(char in reference for char in ",;"):
        ref_items, pred_items = _split_list(reference), _split_list(prediction)
        if len(ref_items) != len(pred_items):
            return False, f"list lengths differ: reference has {len(ref_items)}, prediction {len(pred_items)}"
        mismatches = []
        for index, (pred, ref) in enumerate(zip(pred_items, ref_items)):
            if _is_float(ref):
                value = normalize_number(pred)
                same = value is not None and value == float(ref)
            else:
                same = normalize_str(pred, remove_punct=False) == normalize_str(ref, remove_punct=False)
            if not same:
                mismatches.append(f"item {index + 1}: {pred.strip()!r} vs {ref.strip()!r}")
        if mismatches:
            return False, "list items differ: " + "; ".join(mismatches)
        return True, f"all {len(ref_items)} list items match"
    ok = normalize_str(prediction) == normalize_str(reference)
    return ok, "normalised strings " + ("match" if ok else f"differ: {normalize_str(prediction)!r} vs {normalize_str(reference)!r}")


def exact_score(task: Task, prediction: str | None) -> Score:
    if task.answer is None:
        return Score(False, "gaia_exact", "the task has no reference answer")
    ok, why = gaia_match(prediction, task.answer)
    return Score(ok, "gaia_exact", why, {"reference": task.answer, "prediction": prediction})


# test execution ------------------------------------------------------------------------------

def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def run_check(command: str, workspace: Path, timeout: float) -> tuple[int | None, str, float]:
    """(exit status or None on timeout, output tail, seconds). The interpreter running toolself
    comes first on PATH, so `python -m pytest` means the same Python everywhere."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    start = time.perf_counter()
    process = subprocess.Popen(["bash", "-c", command], cwd=workspace, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, _tail(output), time.perf_counter() - start
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output, _ = process.communicate()
        return None, _tail(output or ""), time.perf_counter() - start


def tests_score(task: Task, env: TaskEnvironment | None) -> Score:
    if not task.check_command:
        return Score(False, "tests", "the task has no check command")
    if env is None or env.closed:
        return Score(False, "tests", "no open environment to run the check in")
    for relative, content in task.check_files.items():
        target = env.workspace / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    status, output, seconds = run_check(task.check_command, env.workspace, task.check_timeout)
    details = {"command": task.check_command, "exit_status": status, "seconds": round(seconds, 3), "output": output}
    if status is None:
        return Score(False, "tests", f"the check timed out after {task.check_timeout:g} s", details)
    if status == 0:
        return Score(True, "tests", "the check command passed", details)
    return Score(False, "tests", f"the check command failed with exit status {status}", details)


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
    def key(question: str, reference: str, prediction: str) -> str:
        return hashlib.sha256(json.dumps([question, reference, prediction], ensure_ascii=False).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def judge(self, question: str, reference: str, prediction: str) -> Score:
        key = self.key(question, reference, prediction)
        path = self._cache_path(key)
        if path.exists():
            try:
                cached = json.loads(path.read_text(encoding="utf-8"))
                return Score(bool(cached["correct"]), self.name, cached["reason"] + " (cached)",
                             {**cached.get("details", {}), "cached": True})
            except (json.JSONDecodeError, KeyError, OSError):
                pass
        text = self.prompt.replace("{question}", question).replace("{reference}", reference).replace(
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
            verdict = parse_verdict(reply)
            if verdict is not None:
                reason = f"the judge said {'CORRECT' if verdict else 'INCORRECT'}"
                details = {"judge_model": getattr(self.model, "name", ""), "reply": reply, "cached": False}
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
    """Score one attempt with the scorer the task calls for (see the module docs)."""
    if task.check_command:
        return tests_score(task, env)
    exact = exact_score(task, prediction)
    if exact.correct or task.answer is None:
        return exact
    if task.metadata.get("scorer") == "judge":
        if judge is None:
            exact.details["note"] = "this task asks for an LLM judge but none is configured"
            return exact
        if prediction is None or not str(prediction).strip():
            return Score(False, judge.name, "no prediction to judge")
        verdict = judge.judge(task.question, task.answer, str(prediction))
        verdict.details["exact_match"] = exact.reason
        return verdict
    return exact
