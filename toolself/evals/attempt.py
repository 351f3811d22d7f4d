"""One attempt: its models, its environment, the run of the agent and its record.

The runner (`runner`) decides which attempts run, when, for how long, and alone writes their
records; a backend (`backends`) decides where an attempt runs. Both meet here: whatever the
backend, an attempt is `run_attempt(env, job, cancel, live)`, which never raises and returns
the scored record and the trajectory's JSON.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from toolself.agent import Agent, AgentSettings, Observer
from toolself.evals.records import AttemptKey, AttemptRecord
from toolself.evals.judge import LLMJudge
from toolself.evals.scorers import score
from toolself.evals.teacher import ExpertTeacher
from toolself.models.spec import ModelSpec
from toolself.trajectory import Stage, Trajectory

TIMEOUT_END_REASONS = ("budget:time", "budget:cancelled")


@dataclass
class Job:
    """One attempt to make: which, at what, under which settings."""

    key: AttemptKey
    task: Any
    settings: AgentSettings


def as_model(model: Any) -> Any:
    """A spec given as text becomes a `ModelSpec` (parsed here, once); a model object stays."""
    return ModelSpec.parse(model) if isinstance(model, str) else model


@dataclass(frozen=True)
class AttemptModels:
    """The models of a run as the user gave them: specs travel to Ray workers and are built
    there; model objects are used as they are (and must pickle to travel)."""

    model: Any
    config_model: Any = None
    judge: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("model", "config_model", "judge"):
            object.__setattr__(self, name, as_model(getattr(self, name)))

    def build(self) -> "BuiltModels":
        """One shared policy, except `expert`: a fresh teacher per attempt, since it follows one
        task's plan. Models built here from specs are owned, and closed with the run."""
        owned: list[Any] = []

        def load(spec: Any, **options: Any) -> Any:
            if not isinstance(spec, ModelSpec):
                return spec
            built = spec.load(**options)
            owned.append(built)
            return built

        if isinstance(self.model, ModelSpec) and self.model.kind == "expert":
            policy_for: Callable[[Any], Any] = ExpertTeacher.for_task
        else:
            shared = load(self.model, **self.options)
            policy_for = lambda task: shared  # noqa: E731
        judge = self.judge
        if isinstance(judge, ModelSpec):
            judge = LLMJudge(load(judge))
        return BuiltModels(policy_for, load(self.config_model), judge, owned)

    def cache_key(self) -> tuple | None:
        """A key under which a worker may keep the built models across runs: only specs name
        the same models twice."""
        parts = (self.model, self.config_model, self.judge)
        if not all(p is None or isinstance(p, ModelSpec) for p in parts):
            return None
        return parts + (tuple(sorted((k, repr(v)) for k, v in self.options.items())),)


@dataclass
class BuiltModels:
    """The models of a run, built from what the user gave. `owned` holds those built from
    specs: the run closes them when it ends, since an embedded model's engine threads and KV
    caches would otherwise outlive it (a study builds a dozen in one process)."""

    policy_for: Callable[[Any], Any]
    writer: Any
    judge: Any
    owned: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for model in self.owned:
            close = getattr(model, "close", None)
            if callable(close):
                close()
        self.owned = []


@dataclass
class AttemptEnv:
    """What every attempt of a run shares."""

    policy_for: Callable[[Any], Any]
    pool: Any
    writer: Any
    judge: Any
    workspaces: Path

    @classmethod
    def of(cls, built: BuiltModels, pool: Any, workspaces: Path) -> "AttemptEnv":
        return cls(built.policy_for, pool, built.writer, built.judge, workspaces)


class LiveTrajectory(Observer):
    """Keeps a reference to the attempt's trajectory, so that an abandoned attempt can still be
    recorded with what it did up to the moment it was given up."""

    def __init__(self, live: list[Trajectory]):
        self.live = live

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None:
        if not self.live:
            self.live.append(trajectory)


def run_attempt(env: AttemptEnv, job: Job, cancel: threading.Event,
                live: list[Trajectory]) -> tuple[AttemptRecord, str | None]:
    """One attempt in its own environment, scored before the environment closes (code tasks
    run their tests in the workspace). Never raises: a crash is an `error` record."""
    started = time.monotonic()
    task = job.task
    trajectory: Trajectory | None = None
    verdict = None
    failure: str | None = None
    try:
        policy = env.policy_for(task)
        with task.environment(root=env.workspaces, model=policy) as environment:
            agent = Agent(policy, env.pool, job.settings, config_model=env.writer, observer=LiveTrajectory(live))
            metadata = {"attempt": job.key.to_dict(), "family": task.family, "split": task.split,
                        "reference": task.answer}
            trajectory = agent.run(task.question, ctx=environment.context, task_id=task.id, metadata=metadata,
                                   cancel=cancel)
            verdict = score(task, trajectory.answer, environment, env.judge)
    except BaseException as exc:  # a crash in one attempt is data, never the end of the run
        failure = "".join(traceback.format_exception(exc)).strip()
    try:
        made = record(job, trajectory, verdict, failure, time.monotonic() - started)
        return made, (trajectory.to_json() if trajectory is not None else None)
    except BaseException as exc:
        return record(job, None, None, "".join(traceback.format_exception(exc)).strip(), 0.0), None


def record(job: Job, trajectory: Trajectory | None, verdict: Any, failure: str | None,
           wall_time: float) -> AttemptRecord:
    """The record of an attempt that returned (or crashed: `failure` holds the traceback)."""
    task = job.task
    key = job.key
    made = AttemptRecord(dataset=key.dataset, task_id=key.task_id, method=key.method, repeat=key.repeat,
                         status=_status(trajectory, failure), family=getattr(task, "family", ""),
                         split=getattr(task, "split", ""), reference=getattr(task, "answer", None),
                         wall_time=round(wall_time, 3), finished_at=time.time(), error=failure)
    if trajectory is not None:
        fill_from_trajectory(made, trajectory)
        if failure is None and trajectory.error:
            made.error = trajectory.error
    if verdict is not None:
        made.correct = bool(verdict.correct)
        made.scorer = verdict.scorer
        made.reason = verdict.reason
        made.metrics = dict(getattr(verdict, "metrics", None) or {})
        details = getattr(verdict, "details", None) or {}
        if details.get("judge_refused_fields"):
            made.extra["judge_refused_fields"] = list(details["judge_refused_fields"])
        if details.get("judge_failed") and made.status == "ok":
            # No verdict, not a wrong answer: a judge that could not be reached says nothing of
            # it, so the attempt is no label to train on and runs again on a rerun.
            made.status = "error"
            made.error = f"JudgeFailed: {verdict.reason}"
    return made


def fill_from_trajectory(made: AttemptRecord, trajectory: Trajectory) -> None:
    made.answer = trajectory.answer
    made.end_reason = trajectory.end_reason
    made.prompt_tokens = trajectory.usage.prompt_tokens
    made.completion_tokens = trajectory.usage.completion_tokens
    made.steps = trajectory.num_steps
    made.stages = len(trajectory.stages)
    made.reconfigurations = trajectory.num_reconfigurations
    made.trajectory_id = trajectory.id
    if trajectory.metadata.get("model_refused_fields"):
        made.extra["model_refused_fields"] = list(trajectory.metadata["model_refused_fields"])


def _status(trajectory: Trajectory | None, failure: str | None) -> str:
    if failure is not None:
        return "error"
    assert trajectory is not None
    if trajectory.end_reason in TIMEOUT_END_REASONS:
        return "timeout"
    if trajectory.end_reason == "error":
        return "error"
    return "ok"
