"""What a verdict is (`Score`) and the LLM judge that gives some: a judge model speaking a
benchmark's grading protocol (FRAMES, xbench), with verdicts cached on disk by a hash of
(protocol, question, reference, answer), so re-scoring a run costs nothing.

The benchmarks' rules (`toolself.evals.rules`) and the dispatch over them (`scorers`) both build
on this module, which imports neither.
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
                refused = sorted(getattr(self.model, "refused_fields", ()))
                if refused:  # sent without these, the judge sampled at its own defaults
                    details["judge_refused_fields"] = refused
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
