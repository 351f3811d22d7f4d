"""The resumable evaluation runner: every (dataset, task, method, repeat) attempt, once.

    run_eval(["builtin:research"], ["toolself", "vanilla"], "embedded", Path("runs/eval"))

Layout of the output folder:

    run.json                          the settings that define the results (checked on rerun)
    <method>/results.jsonl            one AttemptRecord per finished attempt
    <method>/trajectories.jsonl       the full trajectories beside them
    workspaces/                       each attempt's private workspace while it runs

Rerunning the same command resumes: finished keys are skipped (see `records` for why a
`kill -9` at any moment loses at most the attempts in flight and never duplicates a record),
and attempts that ended in `error` run again (their records set aside in `errors.jsonl`): a
model server that was down, or a judge that failed, says nothing about the method. A run whose
attempts keep failing (`stop_after_errors` in a row: the model server went away) stops instead
of recording an error for every attempt left, and a rerun resumes it.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from toolself.agent import AgentSettings
from toolself.evals.attempt import AttemptModels, Job, as_model, fill_from_trajectory
from toolself.evals.backends import Backend, make_backend
from toolself.evals.judge import LLMJudge
from toolself.evals.loaders import load_tasks
from toolself.evals.progress import EvalProgress
from toolself.evals.records import (
    AttemptKey,
    AttemptRecord,
    MethodStore,
    private_run_folder,
    safe_name,
)
from toolself.evals.report import Table, aggregate
from toolself.evals.runs import SettingsMismatch, check_run_file
from toolself.evals.suites.common import suite_key_id
from toolself.interrupts import StoppedEarly
from toolself.models.base import ChatModel
from toolself.models.digests import local_model_identity
from toolself.models.spec import ModelSpec
from toolself.tools.base import ToolPool
from toolself.trajectory import Trajectory
from toolself.variants import settings_for


class RunInProgress(RuntimeError):
    """Another runner holds the output folder."""


class AttemptsFailing(StoppedEarly):
    """The run stopped because its attempts kept ending in errors."""


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
    retried: int = 0  # attempts that had ended in an error and ran again

    def accuracy(self) -> dict[str, dict[str, dict[str, float | None]]]:
        return self.table.summary()

    def raise_if_all_failed(self) -> None:
        """For what builds on the results (training data, a pipeline's table): a run whose every
        attempt ended in an error measured nothing, so it must not count as done."""
        if self.records and all(r.status == "error" for r in self.records):
            raise AttemptsFailing(f"every one of the {len(self.records)} attempts in {self.out} ended in an error "
                                  f"(the last: {self.records[-1].error_line}). Mend the cause (is the model server "
                                  "up?) and rerun: failed attempts run again.")

    def refused_fields(self) -> dict[str, list[str]]:
        """The sampling fields a server refused (`openai_compat`), by whose server: "model" or
        "judge". Sent without them, those attempts or verdicts sampled at the server's defaults,
        not at the run's settings."""
        refused = {who: sorted({f for r in self.records for f in r.extra.get(f"{who}_refused_fields", ())})
                   for who in ("model", "judge")}
        return {who: fields for who, fields in refused.items() if fields}

    def to_dict(self) -> dict[str, Any]:
        out = {"out": str(self.out), "attempts": self.attempts, "skipped": self.skipped, "ran": self.ran,
               "retried": self.retried, "status": self.status, "wall_time": round(self.wall_time, 3),
               "accuracy": self.accuracy()}
        refused = self.refused_fields()
        if refused:
            out["refused_fields"] = refused
        return out


@dataclass
class _Running:
    job: Job
    cancel: threading.Event
    started: float
    live: list[Trajectory] = field(default_factory=list)


@dataclass(frozen=True)
class EvalRun:
    """What decides an evaluation's results, recorded in run.json and compared on a rerun.
    Made once at the edge (`of`): model specs are parsed, the agent's budgets take the
    model's defaults where the user set none."""

    model: ModelSpec | ChatModel
    config_model: ModelSpec | ChatModel | None = None
    judge: ModelSpec | LLMJudge | None = None
    split: str = "heldout"
    seed: int = 0
    timeout: float | None = 600.0
    freeze: tuple[str, ...] = ()
    agent: dict[str, Any] = field(default_factory=dict)  # AgentSettings overrides
    model_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, model: ModelSpec | ChatModel | str, *, config_model: ModelSpec | ChatModel | str | None = None,
           judge: ModelSpec | LLMJudge | str | None = None, agent: dict[str, Any] | None = None,
           model_options: dict[str, Any] | None = None, freeze: Sequence[str] = (), **fields: Any) -> "EvalRun":
        model = as_model(model)
        defaults = getattr(model, "defaults", None)
        overrides = {**(defaults.settings() if defaults else {}), **(agent or {})}
        return cls(model, as_model(config_model), as_model(judge), agent=overrides, freeze=tuple(freeze),
                   model_options=dict(model_options or {}), **fields)

    def settings(self, method: str) -> AgentSettings:
        return settings_for(method, self.freeze, time_limit=self.timeout, **self.agent)

    def models(self) -> AttemptModels:
        return AttemptModels(self.model, self.config_model, self.judge, self.model_options)

    def identity(self) -> dict[str, Any]:
        # the built-in suites' key decides which tasks an id names (see `suites.common`); a served
        # model is known by its name, not its server's address (`spec.served_name`)
        return {"model": _name(self.model), "config_model": _name(self.config_model), "judge": _name(self.judge),
                "split": self.split, "seed": self.seed, "suite_key": suite_key_id(), "timeout": self.timeout,
                "freeze": list(self.freeze), "settings": {k: self.agent[k] for k in sorted(self.agent)},
                "model_options": {k: self.model_options[k] for k in sorted(self.model_options)}}

    def specs(self) -> dict[str, ModelSpec]:
        """The run's models given as specs, by role."""
        roles = {"model": self.model, "config_model": self.config_model, "judge": self.judge}
        return {role: model for role, model in roles.items() if isinstance(model, ModelSpec)}

    def weights(self) -> dict[str, dict[str, Any]]:
        """What each `local:` model of the run holds (`digests.local_model_identity`), for the
        record of a command: a rerun from a moved folder, or with the model mounted elsewhere, is
        the same run."""
        found = {role: local_model_identity(model) for role, model in self.specs().items()}
        return {role: identity for role, identity in found.items() if identity is not None}

    def addresses(self) -> dict[str, str]:
        """Where each served model of the run was reached, for the record of a command."""
        return {role: model.text for role, model in self.specs().items() if model.identity != model.text}


def _name(model: Any) -> str | None:
    if model is None or isinstance(model, ModelSpec):
        return None if model is None else model.identity
    inner = getattr(model, "model", None)
    return getattr(model, "name", None) or getattr(inner, "name", None) or type(model).__name__


def run_eval(
    tasks: Sequence[str],
    methods: Sequence[str],
    model: ModelSpec | ChatModel | str,
    out: Path,
    *,
    concurrency: int = 4,
    timeout: float | None = 600.0,
    grace: float | None = None,
    limit: int | None = None,
    repeats: int = 1,
    judge: ModelSpec | LLMJudge | str | None = None,
    freeze: Sequence[str] = (),
    config_model: ModelSpec | ChatModel | str | None = None,
    split: str = "heldout",
    seed: int = 0,
    force: bool = False,
    settings: dict[str, Any] | None = None,
    pool: ToolPool | None = None,
    model_options: dict[str, Any] | None = None,
    progress: EvalProgress | bool | None = None,
    loader: Callable[..., list[Any]] | None = None,
    backend: Backend | str = "local",
    retry_errors: bool = True,
    stop_after_errors: int | None = None,
) -> RunSummary:
    """Run every missing attempt and return the summary over all of the requested ones.

    tasks: dataset specs (`builtin:research`, `gaia:PATH`, ...); methods: names from
    `toolself methods`; model: a spec (`embedded`, `openai:NAME@URL`, `expert` for the built-in
    suites' per-task teacher) or a ChatModel; settings: AgentSettings overrides (budgets);
    grace: seconds after the timeout before an attempt that has not returned is abandoned
    (default: a quarter of the timeout, at least 5 s); backend: where attempts execute,
    `local` (threads in this process), `ray`, `ray:ADDRESS` or a Backend (see `backends`);
    retry_errors: run again the attempts that ended in `error`; stop_after_errors: stop the run
    (`AttemptsFailing`) once this many attempts in a row ended in `error` (default: the
    concurrency, at least 5; 0: never). The results' settings become an `EvalRun`; `evaluate`
    runs one.
    """
    run = EvalRun.of(model, config_model=config_model, judge=judge, agent=settings, model_options=model_options,
                     freeze=freeze, split=split, seed=seed, timeout=timeout)
    return evaluate(tasks, methods, run, out, concurrency=concurrency, grace=grace, limit=limit, repeats=repeats,
                    force=force, pool=pool, progress=progress, loader=loader, backend=backend,
                    retry_errors=retry_errors, stop_after_errors=stop_after_errors)


def evaluate(tasks: Sequence[str], methods: Sequence[str], run: EvalRun, out: Path, *, concurrency: int = 4,
             grace: float | None = None, limit: int | None = None, repeats: int = 1, force: bool = False,
             pool: ToolPool | None = None, progress: EvalProgress | bool | None = None,
             loader: Callable[..., list[Any]] | None = None, backend: Backend | str = "local",
             retry_errors: bool = True, stop_after_errors: int | None = None) -> RunSummary:
    """`run_eval` for a run whose settings are already an `EvalRun`."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    if not tasks:
        raise ValueError("no task spec given")
    if not methods:
        raise ValueError("no method given")
    out = Path(out)
    method_settings = {m: run.settings(m) for m in methods}
    timeout = run.timeout
    grace = max(5.0, 0.25 * timeout) if grace is None and timeout else (grace or 0.0)

    loader = loader or load_tasks
    datasets: dict[str, list[Any]] = {}
    for spec in tasks:
        loaded = loader(spec, split=run.split, limit=limit, seed=run.seed)
        ids = [t.id for t in loaded]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{spec}: task ids are not unique; results could not be keyed by them")
        datasets[spec] = list(loaded)

    identity, addresses, weights = run.identity(), run.addresses(), run.weights()
    command = {"tasks": list(tasks), "methods": list(methods), "limit": limit, "repeats": repeats,
               "concurrency": concurrency, **identity, **({"served_at": addresses} if addresses else {}),
               **({"weights": weights} if weights else {})}
    private_run_folder(out)
    lock = _single_writer(out)
    try:
        check_run_file(out, identity, command, force)
        _clear_stale_workspaces(out / "workspaces")

        stores = {m: MethodStore.open(out / safe_name(m), retry_errors=retry_errors) for m in methods}
        executor = None
        try:
            jobs = _missing(stores, datasets, methods, method_settings, repeats)
            # Models load only when something is left to run: a finished run reports at once.
            if jobs:
                executor = make_backend(backend).open(run.models(), pool, out / "workspaces", grace)
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
        failing = max(5, concurrency) if stop_after_errors is None else stop_after_errors
        scheduler = _Scheduler(executor.execute if executor else None, stores, progress, concurrency, timeout, grace,
                               failing)
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
                          status=scheduler.status, table=table, records=records, wall_time=scheduler.wall_time,
                          retried=sum(store.set_aside for store in stores.values()))
    finally:
        lock.close()


Execute = Callable[[Job, threading.Event, list[Trajectory]], tuple[AttemptRecord, str | None]]


class _Scheduler:
    """Keeps `concurrency` attempts in flight, each in a thread; the watchdog and the only
    writer run in the calling thread. `execute` runs one attempt where the backend puts it
    (in the thread itself, or on a Ray worker the thread waits for)."""

    def __init__(self, execute: Execute | None, stores: dict[str, MethodStore], progress: EvalProgress,
                 concurrency: int, timeout: float | None, grace: float, stop_after_errors: int = 0):
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
        self.stop_after_errors = stop_after_errors
        self.errors_in_a_row = 0
        self.last_error = ""
        self.stopped: str | None = None

    def run(self, jobs: list[Job]) -> None:
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
                if pending and self.failing():
                    self.stopped = (f"{self.errors_in_a_row} attempts in a row ended in an error, so the run "
                                    f"stopped with {len(pending)} attempts not started (the last error: "
                                    f"{self.last_error}). Mend the cause (is the model server up?) and rerun: "
                                    "finished attempts are kept, failed ones run again.")
                    pending.clear()  # the attempts in flight end, and are recorded, first
            if self.stopped:
                raise AttemptsFailing(self.stopped)
        except BaseException:
            for entry in self.running.values():
                entry.cancel.set()
            raise
        finally:
            self.wall_time = time.monotonic() - started

    def fill(self, pending: list[Job]) -> None:
        while pending and len(self.running) < self.concurrency:
            self.launch(pending.pop())

    def launch(self, job: Job) -> None:
        entry = _Running(job, threading.Event(), time.monotonic())

        def body() -> None:
            assert self.execute is not None
            self.results.put((job.key.id, self.execute(job, entry.cancel, entry.live)))

        self.running[job.key.id] = entry
        self.progress.attempt_started(job.key)
        threading.Thread(target=body, name=f"attempt-{job.key.task_id}", daemon=True).start()

    def collect(self) -> list[tuple[Job, AttemptRecord, str | None]]:
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

    def watchdog(self) -> list[tuple[Job, AttemptRecord, str | None]]:
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

    def commit(self, finished: list[tuple[Job, AttemptRecord, str | None]]) -> None:
        by_method: dict[str, list[tuple[AttemptRecord, str | None]]] = {}
        for job, record, trajectory_json in finished:
            by_method.setdefault(job.key.method, []).append((record, trajectory_json))
        for method, items in by_method.items():
            for record in self.stores[method].commit_many(items):
                self.ran += 1
                self.status[record.status] += 1
                self.progress.attempt_finished(record)
                if record.status == "error":
                    self.errors_in_a_row += 1
                    self.last_error = record.error_line
                else:
                    self.errors_in_a_row = 0

    def failing(self) -> bool:
        return 0 < self.stop_after_errors <= self.errors_in_a_row


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
             method_settings: dict[str, AgentSettings], repeats: int) -> list[Job]:
    """The attempts not yet committed, repeat by repeat so that early repeats finish first."""
    return [Job(AttemptKey(spec, task.id, m, repeat), task, method_settings[m])
            for repeat in range(repeats) for spec, spec_tasks in datasets.items() for task in spec_tasks
            for m in methods if not stores[m].done(AttemptKey(spec, task.id, m, repeat))]


def _next_deadline(running: dict[str, _Running], timeout: float | None, grace: float) -> float | None:
    if timeout is None or not running:
        return None if running else 0.0
    now = time.monotonic()
    moments = []
    for entry in running.values():
        moments.append(entry.started + timeout + (grace if entry.cancel.is_set() else 0.0))
    return max(0.0, min(moments) - now) + 0.01


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
            fill_from_trajectory(record, snapshot)
            trajectory_json = snapshot.to_json()
    return record, trajectory_json
