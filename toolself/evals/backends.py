"""Where the runner's attempts execute: threads in this process, or tasks on a Ray cluster.

A backend does not schedule. The runner's scheduler keeps `concurrency` attempts in flight,
enforces limits and alone writes the results; a backend only turns one attempt into a
(record, trajectory) pair. So resume semantics, the single-writer lock and the per-attempt
limits are the same whichever backend runs the attempts.

    run_eval(specs, methods, "openai:Qwen/Qwen3-8B@http://gpu0:8000/v1", out, backend="ray")
    run_eval(..., backend="ray:auto")                 # join the cluster `ray start` made
    run_eval(..., backend=RayBackend(address="ray://head:10001", num_cpus=0.5))

On Ray, each attempt is a task: its task record, method settings and model specs travel to a
worker, the worker builds the models from their specs once per process (cached), makes the
attempt's workspace on its own disk and returns the scored record and trajectory. A worker
that dies mid-attempt (node lost, OOM kill) has nothing committed, so Ray reruns the task
(`max_retries`); when the retries are spent the attempt is recorded as `error`.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from toolself.evals.attempt import AttemptEnv, AttemptModels, BuiltModels, Job, record, run_attempt
from toolself.tools.registry import default_pool

RAY_MISSING = "the Ray backend needs ray: pip install 'toolself[ray]'"


class Executor(Protocol):
    def execute(self, job: Any, cancel: threading.Event, live: list) -> tuple[Any, str | None]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str

    def open(self, models: AttemptModels, pool: Any, workspaces: Path, grace: float) -> Executor: ...


def make_backend(backend: Any) -> Backend:
    """`local`, `ray`, `ray:ADDRESS` (e.g. `ray:auto`, `ray:ray://head:10001`) or a Backend."""
    if not isinstance(backend, str):
        return backend
    if backend == "local":
        return LocalBackend()
    if backend == "ray" or backend.startswith("ray:"):
        return RayBackend(address=backend.split(":", 1)[1] if ":" in backend else None)
    raise ValueError(f"unknown backend {backend!r}; expected local, ray or ray:ADDRESS")


class LocalBackend:
    """Each attempt in the scheduler's thread, in this process: the models are built once and
    shared by every thread (an HTTP client pools connections, the embedded model batches)."""

    name = "local"

    def open(self, models: AttemptModels, pool: Any, workspaces: Path, grace: float) -> "_LocalExecutor":
        built = models.build()
        own_pool = default_pool() if pool is None else None  # closed at the end (MCP connections)
        env = AttemptEnv.of(built, pool if pool is not None else own_pool, workspaces)
        return _LocalExecutor(env, own_pool, built)


@dataclass
class _LocalExecutor:
    env: AttemptEnv
    own_pool: Any
    built: BuiltModels

    def execute(self, job: Job, cancel: threading.Event, live: list) -> tuple[Any, str | None]:
        return run_attempt(self.env, job, cancel, live)

    def close(self) -> None:
        if self.own_pool is not None and hasattr(self.own_pool, "close"):
            self.own_pool.close()
        self.built.close()


@dataclass
class RayBackend:
    """Attempts as Ray tasks.

    address: None starts (or reuses) a local cluster; `auto` joins the cluster this machine is
    part of; `ray://HOST:10001` connects a remote driver. num_cpus: Ray CPUs each attempt holds
    (an attempt mostly waits for its model server: fractions such as 0.25 let more of them run
    than the cluster has cores; attempts in flight are at most the runner's concurrency).
    max_retries: reruns of an attempt whose worker died. Tool pools and task files must be
    reachable from every node (a pool is pickled to the workers; a task's `files` are paths).
    The runner keeps no more attempts in flight than the cluster's CPUs / num_cpus at the start
    (an attempt's clock runs from its hand-over, so it must not wait in Ray's queue).
    """

    address: str | None = None
    num_cpus: float = 1.0
    max_retries: int = 2
    name: str = "ray"

    def open(self, models: AttemptModels, pool: Any, workspaces: Path, grace: float) -> "_RayExecutor":
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        if getattr(models.model, "in_process", False):
            warnings.warn(f"--backend ray with model {models.model!r}: every Ray worker process loads its own copy "
                          "of the model; serve it once (`toolself serve` or vLLM) and pass openai:NAME@URL instead",
                          RuntimeWarning, stacklevel=2)
        context = _WorkerContext(run=uuid.uuid4().hex, models=models, pool=pool)
        remote = ray.remote(_remote_attempt).options(num_cpus=self.num_cpus, max_retries=self.max_retries,
                                                     retry_exceptions=False, name="toolself_attempt")
        try:
            context_ref = ray.put(context)
        except Exception as exc:  # cloudpickle raises TypeError, PicklingError, ... by content
            raise ValueError("the Ray backend ships the models and the tool pool to its workers, and these do not "
                             f"pickle ({type(exc).__name__}: {exc}); give models as specs (openai:NAME@URL, "
                             "embedded, local:DIR, expert) rather than objects") from exc
        executor = _RayExecutor(ray, remote, [context_ref], context.run, grace)
        executor.capacity = int(ray.cluster_resources().get("CPU", 0) // self.num_cpus) or None
        return executor


@dataclass
class _WorkerContext:
    """What every attempt of a run needs on a worker, shipped once through the object store."""

    run: str
    models: AttemptModels
    pool: Any


class _RayExecutor:
    """Submits one task per attempt and waits for it in the scheduler's thread; the scheduler's
    cancel event becomes a Ray cancel once the attempt is past its grace (a stuck attempt
    would otherwise hold its worker for ever)."""

    def __init__(self, ray: Any, remote: Any, context_ref: list, run: str, grace: float):
        self.ray = ray
        self.remote = remote
        self.context_ref = context_ref
        self.run = run
        self.grace = grace
        self.lock = threading.Lock()
        self.capacity: int | None = None  # attempts the cluster runs at once (its CPUs / num_cpus)

    def execute(self, job: Job, cancel: threading.Event, live: list) -> tuple[Any, str | None]:
        started = time.monotonic()
        limit = job.settings.time_limit
        try:
            with self.lock:  # submission from many threads at once is safe, but serialising it is cheaper
                ref = self.remote.remote(self.context_ref, self.run, job, limit)
            cancelled_at = None
            while not self.ray.wait([ref], timeout=0.5)[0]:
                if cancel.is_set():
                    cancelled_at = cancelled_at or time.monotonic()
                    if time.monotonic() - cancelled_at > self.grace:
                        self.ray.cancel(ref, force=True)
                        break
            return self.ray.get(ref)
        except BaseException as exc:  # a lost worker after its retries, a cancelled task
            failure = "".join(traceback.format_exception(exc)).strip()
            return record(job, None, None, failure, time.monotonic() - started), None

    def close(self) -> None:
        pass


_WORKER_LOCK = threading.Lock()
_WORKER_MODELS: dict[Any, BuiltModels] = {}  # kept for later runs with the same specs
_WORKER_POOLS: dict[str, Any] = {}


def _worker_env(context_ref: list, run: str) -> AttemptEnv:
    """The attempt environment of this worker process for a run: models built once per process
    (per spec, so a later run with the same models reuses them), the pool once per run."""
    import ray

    with _WORKER_LOCK:
        pool = _WORKER_POOLS.get(run)
        context: _WorkerContext | None = None
        if pool is None:
            context = ray.get(context_ref[0])
            pool = context.pool if context.pool is not None else default_pool()
            _WORKER_POOLS.clear()  # one run at a time per worker process: drop the last run's pool
            _WORKER_POOLS[run] = pool
            _WORKER_POOLS[run + ":models"] = context.models
        models: AttemptModels = _WORKER_POOLS[run + ":models"]
        key = models.cache_key() or run
        built = _WORKER_MODELS.get(key)
        if built is None:
            for stale in [k for k in _WORKER_MODELS if isinstance(k, str)]:  # model objects of an earlier run
                del _WORKER_MODELS[stale]
            built = _WORKER_MODELS[key] = models.build()
    import tempfile

    return AttemptEnv.of(built, pool, Path(tempfile.gettempdir()) / "toolself-ray" / run)


def _remote_attempt(context_ref: list, run: str, job: Job, limit: float | None) -> tuple[Any, str | None]:
    """One attempt on a Ray worker; the cancel event fires at the time limit, as the local
    scheduler's watchdog would (the agent ends the attempt as `budget:time`)."""
    env = _worker_env(context_ref, run)
    cancel = threading.Event()
    timer = threading.Timer(limit, cancel.set) if limit else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        return run_attempt(env, job, cancel, [])
    finally:
        if timer is not None:
            timer.cancel()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray
