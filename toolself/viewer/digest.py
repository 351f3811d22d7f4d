"""What the page shows, computed once in Python: list rows, run summaries, and per-attempt
detail with each stage's configuration diff already worked out.

The page itself only lays these records out, so everything a reader relies on (what changed
between stages, how many tokens a stage spent, which attempts count as correct) is decided
here, where it is tested, rather than in the browser.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from toolself.config import Configuration
from toolself.trajectory import Conversation, Stage, Trajectory
from toolself.viewer.load import Attempt

SCALAR_FIELDS = ("subgoal", "strategy", "knowledge", "knowledge_summary", "context_mode")
ROW_TEXT = 240


@dataclass
class ConfigChange:
    """How a stage's configuration differs from the previous stage's.

    changed: the fields that differ (`toolbox` included when a tool was added or removed);
    previous: their old values, so the page can show "was: ...".
    """

    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    previous: dict[str, Any] = field(default_factory=dict)


def config_change(previous: Configuration | None, current: Configuration) -> ConfigChange:
    """The first stage has nothing to differ from: every tool counts as kept, nothing changed."""
    if previous is None:
        return ConfigChange(kept=list(current.toolbox))
    change = ConfigChange(
        added=[t for t in current.toolbox if t not in previous.toolbox],
        removed=[t for t in previous.toolbox if t not in current.toolbox],
        kept=[t for t in current.toolbox if t in previous.toolbox],
    )
    for name in SCALAR_FIELDS:
        before, after = getattr(previous, name), getattr(current, name)
        if before != after:
            change.changed.append(name)
            change.previous[name] = before
    if change.added or change.removed:
        change.changed.append("toolbox")
    return change


def _clip(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "…"


def _tokens(conversation: Conversation | None, kinds: tuple[str, ...] | None = None) -> dict[str, int]:
    prompt = completion = 0
    if conversation is not None:
        for call in conversation.calls:
            if kinds is None or call.kind in kinds:
                prompt += call.usage.prompt_tokens
                completion += call.usage.completion_tokens
    return {"prompt": prompt, "completion": completion}


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {"prompt": a["prompt"] + b["prompt"], "completion": a["completion"] + b["completion"]}


def _clip_observation(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not included in this report ...]"


def _events(stage: Stage, max_observation: int | None) -> list[dict[str, Any]]:
    """The stage's actions in call order: each tool call with its observation, and each reply
    that called no tool (a model's stray text is part of what happened)."""
    conversation = stage.conversation
    by_call: dict[int, list[int]] = {}
    for i, step in enumerate(stage.steps):
        by_call.setdefault(step.call, []).append(i)
    events: list[dict[str, Any]] = []
    for call_index, call in enumerate(conversation.calls):
        if call.kind == "configure":
            continue
        message = conversation.messages[call.output] if 0 <= call.output < len(conversation.messages) else None
        thought = (message.content or "").strip() if message else ""
        reasoning = (message.reasoning or "").strip() if message else ""
        usage = {"prompt": call.usage.prompt_tokens, "completion": call.usage.completion_tokens}
        step_ids = by_call.pop(call_index, [])
        if not step_ids:
            events.append({"kind": "text", "thought": thought, "reasoning": reasoning, "tokens": usage,
                           "latency": call.latency, "call_kind": call.kind})
            continue
        for n, i in enumerate(step_ids):
            step = stage.steps[i]
            events.append({
                "kind": "step", "tool": step.tool, "arguments": step.arguments,
                "observation": _clip_observation(step.observation, max_observation), "error": step.is_error,
                "duration": step.duration, "call_kind": call.kind,
                "thought": thought if n == 0 else "", "reasoning": reasoning if n == 0 else "",
                "tokens": usage if n == 0 else None, "latency": call.latency if n == 0 else None,
            })
    for ids in by_call.values():  # steps whose call index is unknown (older or hand-made records)
        for i in ids:
            step = stage.steps[i]
            events.append({"kind": "step", "tool": step.tool, "arguments": step.arguments,
                           "observation": _clip_observation(step.observation, max_observation),
                           "error": step.is_error, "duration": step.duration, "call_kind": "action",
                           "thought": "", "reasoning": "", "tokens": None, "latency": None})
    return events


def stage_details(trajectory: Trajectory, max_observation: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous: Stage | None = None
    for stage in trajectory.stages:
        # A stage's configuration is written either in its own setup conversation or by the
        # last (configure) calls of the stage before it: those tokens belong to this stage.
        config_tokens = _tokens(stage.config_conversation)
        if previous is not None:
            config_tokens = _add(config_tokens, _tokens(previous.conversation, ("configure",)))
        action_tokens = _tokens(stage.conversation, ("action", "final"))
        change = config_change(previous.configuration if previous else None, stage.configuration)
        out.append({
            "index": stage.index, "configuration": stage.configuration.to_dict(), "change": asdict(change),
            "source": stage.config_source, "problems": stage.config_problems, "frozen": stage.frozen,
            "request": stage.request, "summary": stage.summary, "reason": stage.reason, "end": stage.end,
            "duration": stage.duration, "tokens": _add(config_tokens, action_tokens),
            "config_tokens": config_tokens, "events": _events(stage, max_observation),
        })
        previous = stage
    return out


def attempt_row(key: int, attempt: Attempt) -> dict[str, Any]:
    """One line of the task list: small, because the page holds all of them at once."""
    t, r = attempt.trajectory, attempt.record
    if r is not None:
        tokens, steps, stages = r.total_tokens, r.steps, r.stages
        reconfigurations, duration = r.reconfigurations, r.wall_time
        answer, end_reason, error = r.answer, r.end_reason, r.error
    else:
        assert t is not None
        tokens, steps, stages = t.usage.total_tokens, t.num_steps, len(t.stages)
        reconfigurations, duration = t.num_reconfigurations, t.duration
        answer, end_reason, error = t.answer, t.end_reason, t.error
    subgoals = " · ".join(s.configuration.subgoal for s in t.stages) if t else ""
    return {
        "key": key, "task_id": attempt.task_id, "method": attempt.method, "dataset": attempt.dataset,
        "family": attempt.family, "repeat": attempt.repeat, "outcome": attempt.outcome,
        "tokens": tokens, "steps": steps, "stages": stages, "reconfigurations": reconfigurations,
        "duration": round(duration or 0.0, 3), "end_reason": end_reason or "",
        "question": _clip(t.task if t else "", ROW_TEXT) or "", "answer": _clip(answer, ROW_TEXT),
        "reference": _clip(attempt.reference, ROW_TEXT), "error": _clip(error, ROW_TEXT),
        "subgoals": _clip(subgoals, 2 * ROW_TEXT) or "", "has_detail": t is not None,
        "model": t.model if t else "",
    }


def attempt_detail(attempt: Attempt, max_observation: int | None = None) -> dict[str, Any] | None:
    t = attempt.trajectory
    if t is None:
        return None
    r = attempt.record
    return {
        "id": t.id, "question": t.task, "answer": t.answer, "reference": attempt.reference,
        "end_reason": t.end_reason, "error": t.error or (r.error if r else None), "model": t.model,
        "usage": {"prompt": t.usage.prompt_tokens, "completion": t.usage.completion_tokens},
        "duration": t.duration, "settings": t.settings, "history": t.history,
        "scorer": ({"name": r.scorer, "reason": r.reason} if r and (r.scorer or r.reason) else None),
        "stages": stage_details(t, max_observation),
    }


def method_order(method: str) -> tuple[bool, str]:
    """ToolSelf and its ablations first (what a run is usually about), then the baselines."""
    return (not method.startswith("toolself"), method)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method, then per method and dataset: attempts, accuracy and mean costs.

    Accuracy counts every scored attempt (errors and timeouts count as failures); it is
    None where nothing was scored, rather than a misleading 0%.
    """
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["method"], None), []).append(row)
        groups.setdefault((row["method"], row["dataset"]), []).append(row)
    out = []
    for (method, dataset), members in sorted(groups.items(), key=lambda kv: (method_order(kv[0][0]), kv[0][1] is not None, kv[0][1] or "")):
        scored = [m for m in members if m["outcome"] != "unscored"]
        correct = sum(1 for m in scored if m["outcome"] == "correct")
        out.append({
            "method": method, "dataset": dataset, "attempts": len(members), "scored": len(scored),
            "correct": correct, "accuracy": correct / len(scored) if scored else None,
            "errors": sum(1 for m in members if m["outcome"] in ("error", "timeout")),
            "tokens": _mean([m["tokens"] for m in members]), "steps": _mean([m["steps"] for m in members]),
            "stages": _mean([m["stages"] for m in members]),
            "reconfigurations": _mean([m["reconfigurations"] for m in members]),
            "duration": _mean([m["duration"] for m in members]),
        })
    return out


def json_for_script(value: Any) -> str:
    """JSON that is safe inside a <script> element: no `<` can close it or open a comment,
    and the two line separators JavaScript once rejected are escaped too."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
