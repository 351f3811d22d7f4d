"""The resumable evaluation runner: every (dataset, task, method, repeat) attempt, once.

    run_eval(["builtin:research"], ["toolself", "vanilla"], "embedded", Path("runs/eval"))

Layout of the output folder:

    run.json                          the settings that define the results (checked on rerun)
    <method>/results.jsonl            one AttemptRecord per finished attempt
    <method>/trajectories.jsonl       the full trajectories beside them
    workspaces/                       each attempt's private workspace while it runs

Rerunning the same command resumes: finished keys are skipped (see `records` for why a
`kill -9` at any moment loses at most the attempts in flight and never duplicates a record).
A rerun whose settings would mix incomparable results (another model, judge, split, budget,
seed or freeze) refuses unless `force`; adding methods, datasets, tasks or repeats is fine.
One runner at a time holds a folder (an advisory lock that dies with its process), and a
restart clears the workspaces of attempts that were in flight when the last one died.

Concurrency is a pool of threads, one per attempt in flight: the agent loop and the tools are
synchronous (tools run subprocesses with their own timeouts), an HTTP model is called from
threads with connection pooling, and the embedded model batches requests that arrive from
several threads. Only the main thread writes results. Each attempt has a wall-clock limit:
it is passed to the agent (checked between steps, ending the attempt as `budget:time`) and a
watchdog sets the attempt's cancel event at the limit. A Python thread cannot be killed, so an
attempt still running `grace` seconds after its limit is recorded as `timeout` with what its
trajectory held at that moment, and its thread is abandoned (it can no longer write: its key
is committed). A crash anywhere in an attempt is recorded with its traceback as `error`.

Where an attempt executes is its backend's business (`backends`): in its thread (local), or as
a Ray task its thread waits for; the scheduling, limits and writing above stay here.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from toolself.agent import Agent, AgentSettings, Observer
from toolself.evals.progress import EvalProgress
from toolself.evals.records import (
    AttemptKey,
    AttemptRecord,
    MethodStore,
    atomic_write_text,
    private_run_folder,
    safe_name,
)
from toolself.evals.report import RUN_FILE, Table, aggregate
from toolself.trajectory import Stage, Trajectory

RUN_FORMAT = 1
TIMEOUT_END_REASONS = ("budget:time", "budget:cancelled")


class SettingsMismatch(ValueError):
    """The output folder holds results made under other settings."""


class RunInProgress(RuntimeError):
    """Another runner holds the output folder."""


@dataclass
class RunSummary:
    """What a run produced: counts for this invocation, and the table over every record of
    the requested keys (earlier runs' included)."""

    out: Path
    attempts: int
    skipped: int
    ran: int
    status: dict[str, int]
    table: Table
    records: list[AttemptRecord]
    wall_time: float

    def accuracy(self) -> dict[str, dict[str, dict[str, float | None]]]:
        return self.table.summary()

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "attempts": self.attempts, "skipped": self.skipped, "ran": self.ran,
                "status": self.status, "wall_time": round(self.wall_time, 3), "accuracy": self.accuracy()}


@dataclass
class _Job:
    key: AttemptKey
    task: Any
    settings: AgentSettings


@dataclass
class _Running:
    job: _Job
    cancel: threading.Event
    started: float
    live: list[Trajectory] = field(default_factory=list)


class _Capture(Observer):
    """Keeps a reference to the attempt's trajectory, so that an abandoned attempt can still be
    recorded with what it did up to the moment it was given up."""

    def __init__(self, live: list[Trajectory]):
        self.live = live

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None:
        if not self.live:
            self.live.append(trajectory)


def _identity(model: Any, config_model: Any, judge: Any, split: str, seed: int, timeout: float | None,
              freeze: Sequence[str], overrides: dict[str, Any], model_options: dict[str, Any]) -> dict[str, Any]:
    def name(x: Any) -> Any:
        if x is None or isinstance(x, str):
            return x
        inner = getattr(x, "model", None)
        return getattr(x, "name", None) or getattr(inner, "name", None) or type(x).__name__

    from toolself.evals.suites.common import suite_key_id

    # the built-in suites' key decides which tasks an id names (see `suites.common`)
    return {"model": name(model), "config_model": name(config_model), "judge": name(judge), "split": split,
            "seed": seed, "suite_key": suite_key_id(), "timeout": timeout, "freeze": list(freeze),
            "settings": {k: overrides[k] for k in sorted(overrides)},
            "model_options": {k: model_options[k] for k in sorted(model_options)}}


def _check_run_file(out: Path, identity: dict[str, Any], command: dict[str, Any], force: bool) -> None:
    path = out / RUN_FILE
    data: dict[str, Any] = {"format": RUN_FORMAT, "identity": identity, "commands": []}
    if path.exists():
        existing = json.loads(path.read_text(encoding="utf-8"))
        old = existing.get("identity", {})
        differ = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
        if differ and not force:
            lines = [f"  {k}: was {old.get(k)!r}, now {identity.get(k)!r}" for k in differ]
            raise SettingsMismatch(
                f"{out} holds results made under other settings; rerunning would mix them:\n" + "\n".join(lines)
                + "\nUse another --out folder, or --force to add to it anyway.")
        data["commands"] = list(existing.get("commands", []))
        if differ:
            data["forced_over"] = existing.get("forced_over", []) + [old]
    data["commands"].append({**command, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    data["last_command"] = command
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def model_options(model: str, temperature: float, seed: int, dtype: str = "auto") -> dict[str, Any]:
    """Sampling options for a model spec, for `run_eval(model_options=...)`: local models take
    temperature, seed and dtype (see `local.default_dtype`); a served model a temperature when
    one is asked for (on-policy collection samples so that the K attempts at a task differ); the
    expert teacher none."""
    if model == "embedded" or model.startswith("local:"):
        return {"temperature": temperature, "seed": seed, "dtype": dtype}
    if model.startswith("openai:") and temperature:
        return {"temperature": temperature}
    return {}


def _load_model(spec: Any, **options: Any) -> Any:
    if spec is None or not isinstance(spec, str):
        return spec
    from toolself.models import load_model

    return load_model(spec, **options)


def _expert_policy() -> Callable[[Any], Any]:
    from toolself.evals.teacher import ExpertTeacher

    return ExpertTeacher.for_task


def default_pool():
    """The global tool pool (falls back to the tools present when the registry is absent)."""
    try:
        from toolself.tools.registry import default_pool as registry_pool
    except ImportError:
        from toolself.tools.base import ToolPool
        from toolself.tools.search import search
        from toolself.tools.visit import visit

        return ToolPool([search, visit])
    return registry_pool()


def run_eval(
    tasks: Sequence[str],
    methods: Sequence[str],
    model: Any,
    out: Path,
    *,
    concurrency: int = 4,
    timeout: float | None = 600.0,
    grace: float | None = None,
    limit: int | None = None,
    repeats: int = 1,
    judge: Any = None,
    freeze: Sequence[str] = (),
    config_model: Any = None,
    split: str = "heldout",
    seed: int = 0,
    force: bool = False,
    settings: dict[str, Any] | None = None,
    pool: Any = None,
    model_options: dict[str, Any] | None = None,
    progress: EvalProgress | bool | None = None,
    loader: Callable[..., list[Any]] | None = None,
    backend: Any = "local",
) -> RunSummary:
    """Run every missing attempt and return the summary over all of the requested ones.

    tasks: dataset specs (`builtin:research`, `gaia:PATH`, ...); methods: names from
    `toolself methods`; model: a spec (`embedded`, `openai:NAME@URL`, `expert` for the built-in
    suites' per-task teacher) or a ChatModel; settings: AgentSettings overrides (budgets);
    grace: seconds after the timeout before an attempt that has not returned is abandoned
    (default: a quarter of the timeout, at least 5 s); backend: where attempts execute,
    `local` (threads in this process), `ray`, `ray:ADDRESS` or a Backend (see `backends`).
    """
    from toolself.evals.backends import AttemptModels, make_backend
    from toolself.variants import settings_for

    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    if not tasks:
        raise ValueError("no task spec given")
    if not methods:
        raise ValueError("no method given")
    out = Path(out)
    overrides = dict(settings or {})
    if isinstance(model, str) and model != "expert":
        from toolself.cli import model_defaults

        defaults = model_defaults(model)
        overrides.setdefault("context_budget", defaults.context_budget)
        overrides.setdefault("config_max_text", defaults.config_max_text)
        overrides.setdefault("max_tokens_per_call", defaults.max_tokens_per_call)
    method_settings = {m: settings_for(m, tuple(freeze), time_limit=timeout, **overrides) for m in methods}
    grace = max(5.0, 0.25 * timeout) if grace is None and timeout else (grace or 0.0)

    loader = loader or _default_loader
    datasets: dict[str, list[Any]] = {}
    for spec in tasks:
        loaded = loader(spec, split=split, limit=limit, seed=seed)
        ids = [t.id for t in loaded]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{spec}: task ids are not unique; results could not be keyed by them")
        datasets[spec] = list(loaded)

    identity = _identity(model, config_model, judge, split, seed, timeout, freeze, overrides, model_options or {})
    command = {"tasks": list(tasks), "methods": list(methods), "limit": limit, "repeats": repeats,
               "concurrency": concurrency, **identity}
    private_run_folder(out)
    lock = _single_writer(out)
    try:
        _check_run_file(out, identity, command, force)
        _clear_stale_workspaces(out / "workspaces")

        stores = {m: MethodStore.open(out / safe_name(m)) for m in methods}
        executor = None
        try:
            jobs = _missing(stores, datasets, methods, method_settings, repeats)
            # Models load only when something is left to run: a finished run reports at once.
            if jobs:
                models = AttemptModels(model, config_model, judge, dict(model_options or {}))
                executor = make_backend(backend).open(models, pool, out / "workspaces", grace)
                concurrency = _within_capacity(concurrency, getattr(executor, "capacity", None))
        except BaseException:
            for store in stores.values():
                store.close()
            raise
        requested = [AttemptKey(spec, task.id, m, repeat) for repeat in range(repeats)
                     for spec, spec_tasks in datasets.items() for task in spec_tasks for m in methods]
        skipped = len(requested) - len(jobs)

        if progress is None or progress is True:
            progress = EvalProgress()
        elif progress is False:
            progress = EvalProgress(live=False, every=10**9)
            progress.console.quiet = True
        scheduler = _Scheduler(executor.execute if executor else None, stores, progress, concurrency, timeout, grace)
        progress.start(len(requested), skipped)
        try:
            scheduler.run(jobs)
        finally:
            progress.close()
            for store in stores.values():
                store.close()
            if executor is not None:
                executor.close()

        wanted = {k.id for k in requested}
        records = [r for m in methods for r in stores[m].records.values() if r.key.id in wanted]
        table = aggregate(records, methods, list(tasks))
        return RunSummary(out=out, attempts=len(requested), skipped=skipped, ran=scheduler.ran,
                          status=scheduler.status, table=table, records=records, wall_time=scheduler.wall_time)
    finally:
        lock.close()


@dataclass
class _AttemptEnv:
    """What every attempt of a run shares."""

    policy_for: Callable[[Any], Any]
    pool: Any
    writer: Any
    judge: Any
    workspaces: Path


def _run_attempt(env: _AttemptEnv, job: _Job, cancel: threading.Event,
                 live: list[Trajectory]) -> tuple[AttemptRecord, str | None]:
    """One attempt in its own environment, scored before the environment closes (code tasks
    run their tests in the workspace). Never raises: a crash is an `error` record."""
    from toolself.evals.scorers import score

    started = time.monotonic()
    task = job.task
    trajectory: Trajectory | None = None
    verdict = None
    failure: str | None = None
    try:
        policy = env.policy_for(task)
        with task.environment(root=env.workspaces, model=policy) as environment:
            agent = Agent(policy, env.pool, job.settings, config_model=env.writer, observer=_Capture(live))
            metadata = {"attempt": job.key.to_dict(), "family": task.family, "split": task.split,
                        "reference": task.answer}
            trajectory = agent.run(task.question, ctx=environment.context, task_id=task.id, metadata=metadata,
                                   cancel=cancel)
            verdict = score(task, trajectory.answer, environment, env.judge)
    except BaseException as exc:  # a crash in one attempt is data, never the end of the run
        failure = "".join(traceback.format_exception(exc)).strip()
    try:
        record = _record(job, trajectory, verdict, failure, time.monotonic() - started)
        return record, (trajectory.to_json() if trajectory is not None else None)
    except BaseException as exc:
        return _record(job, None, None, "".join(traceback.format_exception(exc)).strip(), 0.0), None


Execute = Callable[[_Job, threading.Event, list[Trajectory]], tuple[AttemptRecord, str | None]]


class _Scheduler:
    """Keeps `concurrency` attempts in flight, each in a thread; the watchdog and the only
    writer run in the calling thread. `execute` runs one attempt where the backend puts it
    (in the thread itself, or on a Ray worker the thread waits for)."""

    def __init__(self, execute: Execute | None, stores: dict[str, MethodStore], progress: EvalProgress,
                 concurrency: int, timeout: float | None, grace: float):
        self.execute = execute
        self.stores = stores
        self.progress = progress
        self.concurrency = concurrency
        self.timeout = timeout
        self.grace = grace
        self.results: queue.Queue = queue.Queue()
        self.running: dict[str, _Running] = {}
        self.ran = 0
        self.status = {"ok": 0, "timeout": 0, "error": 0}
        self.wall_time = 0.0

    def run(self, jobs: list[_Job]) -> None:
        started = time.monotonic()
        pending = list(reversed(jobs))
        try:
            while pending or self.running:
                self.fill(pending)
                finished = self.collect()
                # New attempts start before the results are written, so the writes overlap them.
                self.fill(pending)
                finished += self.watchdog()
                if finished:
                    self.commit(finished)
        except BaseException:
            for entry in self.running.values():
                entry.cancel.set()
            raise
        finally:
            self.wall_time = time.monotonic() - started

    def fill(self, pending: list[_Job]) -> None:
        while pending and len(self.running) < self.concurrency:
            self.launch(pending.pop())

    def launch(self, job: _Job) -> None:
        entry = _Running(job, threading.Event(), time.monotonic())

        def body() -> None:
            assert self.execute is not None
            self.results.put((job.key.id, self.execute(job, entry.cancel, entry.live)))

        self.running[job.key.id] = entry
        self.progress.attempt_started(job.key)
        threading.Thread(target=body, name=f"attempt-{job.key.task_id}", daemon=True).start()

    def collect(self) -> list[tuple[_Job, AttemptRecord, str | None]]:
        """Wait for results (or the next deadline), then take every result that is there."""
        arrived = []
        try:
            arrived.append(self.results.get(timeout=_next_deadline(self.running, self.timeout, self.grace)))
            while True:
                arrived.append(self.results.get_nowait())
        except queue.Empty:
            pass
        finished = []
        for key_id, (record, trajectory_json) in arrived:
            entry = self.running.pop(key_id, None)
            if entry is not None:  # None: an abandoned attempt came back late; its key is taken
                self.progress.attempt_returned(entry.job.key)
                finished.append((entry.job, record, trajectory_json))
        return finished

    def watchdog(self) -> list[tuple[_Job, AttemptRecord, str | None]]:
        """Cancel attempts at their limit; give up on those still running after the grace."""
        if self.timeout is None:
            return []
        now = time.monotonic()
        finished = []
        for key_id, entry in list(self.running.items()):
            if now >= entry.started + self.timeout and not entry.cancel.is_set():
                entry.cancel.set()
            if now >= entry.started + self.timeout + self.grace:
                del self.running[key_id]
                record, trajectory_json = _abandoned(entry, now - entry.started, self.timeout)
                finished.append((entry.job, record, trajectory_json))
        return finished

    def commit(self, finished: list[tuple[_Job, AttemptRecord, str | None]]) -> None:
        by_method: dict[str, list[tuple[AttemptRecord, str | None]]] = {}
        for job, record, trajectory_json in finished:
            by_method.setdefault(job.key.method, []).append((record, trajectory_json))
        for method, items in by_method.items():
            for record in self.stores[method].commit_many(items):
                self.ran += 1
                self.status[record.status] += 1
                self.progress.attempt_finished(record)


def _within_capacity(concurrency: int, capacity: int | None) -> int:
    """No more attempts in flight than the backend runs at once: the clock of an attempt starts
    when it is handed over, so one queued behind a full cluster would spend its limit waiting."""
    if capacity is None or concurrency <= capacity:
        return concurrency
    import warnings

    warnings.warn(f"concurrency {concurrency} lowered to {max(1, capacity)}: the backend runs at most that many "
                  "attempts at once", RuntimeWarning, stacklevel=3)
    return max(1, capacity)


def _single_writer(out: Path):
    """Hold an exclusive lock on the output folder for the run: two runners appending to the
    same files could both run a key. The lock dies with the process, so a killed run never
    leaves it behind."""
    handle = open(out / ".lock", "a+")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no advisory locks on this platform
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise RunInProgress(f"another `toolself eval` is writing to {out}; wait for it or use another --out") from None
    return handle


def _clear_stale_workspaces(folder: Path) -> None:
    """Workspaces left by attempts that were in flight when an earlier run was killed (under the
    lock no attempt of this folder is running)."""
    if folder.is_dir():
        for child in folder.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def _missing(stores: dict[str, MethodStore], datasets: dict[str, list[Any]], methods: Sequence[str],
             method_settings: dict[str, AgentSettings], repeats: int) -> list[_Job]:
    """The attempts not yet committed, repeat by repeat so that early repeats finish first."""
    return [_Job(AttemptKey(spec, task.id, m, repeat), task, method_settings[m])
            for repeat in range(repeats) for spec, spec_tasks in datasets.items() for task in spec_tasks
            for m in methods if not stores[m].done(AttemptKey(spec, task.id, m, repeat))]


@dataclass
class BuiltModels:
    """The models of a run, built from what the user gave. `owned` holds those built here from
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


def _models(model: Any, config_model: Any, judge: Any, model_options: dict[str, Any] | None) -> BuiltModels:
    """One shared policy, except `expert`: a fresh teacher per attempt, since it follows one
    task's plan."""
    owned: list[Any] = []

    def load(spec: Any, **options: Any) -> Any:
        built = _load_model(spec, **options)
        if isinstance(spec, str) and built is not None:
            owned.append(built)
        return built

    if model == "expert":
        policy_for = _expert_policy()
    else:
        shared = load(model, **(model_options or {}))
        policy_for = lambda task: shared  # noqa: E731
    if isinstance(judge, str):
        from toolself.evals.scorers import LLMJudge

        judge = LLMJudge(load(judge))
    return BuiltModels(policy_for, load(config_model), judge, owned)


def _default_loader(spec: str, split: str, limit: int | None, seed: int) -> list[Any]:
    from toolself.evals.loaders import load_tasks

    return load_tasks(spec, split=split, limit=limit, seed=seed)


def _next_deadline(running: dict[str, _Running], timeout: float | None, grace: float) -> float | None:
    if timeout is None or not running:
        return None if running else 0.0
    now = time.monotonic()
    moments = []
    for entry in running.values():
        moments.append(entry.started + timeout + (grace if entry.cancel.is_set() else 0.0))
    return max(0.0, min(moments) - now) + 0.01


def _status(trajectory: Trajectory | None, failure: str | None) -> str:
    if failure is not None:
        return "error"
    assert trajectory is not None
    if trajectory.end_reason in TIMEOUT_END_REASONS:
        return "timeout"
    if trajectory.end_reason == "error":
        return "error"
    return "ok"


def _record(job: _Job, trajectory: Trajectory | None, verdict: Any, failure: str | None,
            wall_time: float) -> AttemptRecord:
    task = job.task
    key = job.key
    record = AttemptRecord(dataset=key.dataset, task_id=key.task_id, method=key.method, repeat=key.repeat,
                           status=_status(trajectory, failure), family=getattr(task, "family", ""),
                           split=getattr(task, "split", ""), reference=getattr(task, "answer", None),
                           wall_time=round(wall_time, 3), finished_at=time.time(), error=failure)
    if trajectory is not None:
        _fill_from_trajectory(record, trajectory)
        if failure is None and trajectory.error:
            record.error = trajectory.error
    if verdict is not None:
        record.correct = bool(verdict.correct)
        record.scorer = verdict.scorer
        record.reason = verdict.reason
        record.metrics = dict(getattr(verdict, "metrics", None) or {})
    return record


def _fill_from_trajectory(record: AttemptRecord, trajectory: Trajectory) -> None:
    record.answer = trajectory.answer
    record.end_reason = trajectory.end_reason
    record.prompt_tokens = trajectory.usage.prompt_tokens
    record.completion_tokens = trajectory.usage.completion_tokens
    record.steps = trajectory.num_steps
    record.stages = len(trajectory.stages)
    record.reconfigurations = trajectory.num_reconfigurations
    record.trajectory_id = trajectory.id


def _abandoned(entry: _Running, elapsed: float, timeout: float) -> tuple[AttemptRecord, str | None]:
    """The record of an attempt that did not return within its limit and grace."""
    job = entry.job
    record = AttemptRecord(
        dataset=job.key.dataset, task_id=job.key.task_id, method=job.key.method, repeat=job.key.repeat,
        status="timeout", family=getattr(job.task, "family", ""), split=getattr(job.task, "split", ""),
        reference=getattr(job.task, "answer", None), end_reason="abandoned", wall_time=round(elapsed, 3),
        finished_at=time.time(),
        reason=f"no answer within {timeout:g} s; the attempt was abandoned {elapsed - timeout:.1f} s after its limit")
    trajectory_json = None
    if entry.live:
        trajectory = entry.live[0]
        # The attempt's thread may still be changing it; a copy taken mid-change is retried.
        for _ in range(5):
            try:
                data = json.loads(trajectory.to_json())
                break
            except (RuntimeError, ValueError):
                time.sleep(0.01)
        else:
            data = None
        if data is not None:
            snapshot = Trajectory.from_dict(data)
            snapshot.end_reason = "abandoned"
            snapshot.answer = None
            snapshot.duration = elapsed
            _fill_from_trajectory(record, snapshot)
            trajectory_json = snapshot.to_json()
    return record, trajectory_json
