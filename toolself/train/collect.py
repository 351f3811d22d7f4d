"""Collecting attempts for training: K attempts per task by a teacher (RFT) or by the policy
being trained (KTO), scored, through the evaluation runner (resumable, per-attempt timeouts,
one private environment per attempt).

The runner keeps each attempt's verdict in `results.jsonl` beside the trajectory; the training
data needs the verdict *on* the trajectory, so `labelled_trajectories` joins the two and
writes `metadata["correct"]` (and the scorer's reason) onto each trajectory. The tool schemas
the attempts were run with are saved beside them (`tools.json`), because a trajectory records
tool names only and the data builder must render exactly the schemas the policy was shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from toolself.evals.records import TRAJECTORIES, read_records, safe_name
from toolself.evals.runner import EvalRun, evaluate
from toolself.models.spec import ModelSpec
from toolself.tools.registry import default_pool
from toolself.train.data import tool_schemas
from toolself.trajectory import Trajectory, read_jsonl

TOOLS_FILE = "tools.json"
METHOD = "toolself"


@dataclass
class CollectResult:
    run_dir: str
    attempts: int
    ran: int
    correct: int
    errors: int
    wall_time: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def collect(tasks: Sequence[str], model: Any, out: str | Path, samples: int, *, method: str = METHOD,
            split: str = "train",
            limit: int | None = None, temperature: float = 0.7, seed: int = 0, concurrency: int = 4,
            timeout: float | None = 600.0, settings: dict[str, Any] | None = None, pool: Any = None,
            progress: bool = True, backend: Any = "local", dtype: str = "auto", judge: Any = None,
            model_options: dict[str, Any] | None = None, loader: Any = None) -> CollectResult:
    """Run `samples` attempts per task with `model` (a spec such as `expert`, `embedded`,
    `local:DIR`, `openai:NAME@URL`, or a ChatModel) as `method` (`toolself`, or `vanilla` for
    the static-configuration control) into the runner folder `out`; rerunning resumes it.
    backend: where the attempts run (`local`, `ray`, a runner Backend); judge: the judge of
    free-text answers (a spec or an LLMJudge), whose verdicts label the trajectories;
    model_options: load options over the spec's own (a run preset's sampling and protocol);
    loader: loads the tasks (`runner.evaluate`'s; a run preset's rescores them). A collection
    whose every attempt ended in an error raises `AttemptsFailing` (nothing to learn from: a
    model server that was down); attempts that failed run again when it is rerun."""
    model = ModelSpec.parse(model) if isinstance(model, str) else model
    options = {**(model.options(temperature, seed, dtype) if isinstance(model, ModelSpec) else {}),
               **(model_options or {})}
    run = EvalRun.of(model, judge=judge, agent=settings, model_options=options, split=split, seed=seed,
                     timeout=timeout)
    out = Path(out)
    pool = pool if pool is not None else default_pool()
    out.mkdir(parents=True, exist_ok=True)
    (out / TOOLS_FILE).write_text(json.dumps(tool_schemas(pool), indent=1) + "\n", encoding="utf-8")
    summary = evaluate(list(tasks), [method], run, out, repeats=samples, limit=limit, concurrency=concurrency,
                       pool=pool, progress=progress, backend=backend, loader=loader)
    summary.raise_if_all_failed()
    return CollectResult(run_dir=str(out), attempts=summary.attempts, ran=summary.ran,
                         correct=sum(r.correct for r in summary.records),
                         errors=sum(r.status == "error" for r in summary.records),
                         wall_time=round(summary.wall_time, 3))


def labelled_trajectories(run_dir: str | Path, method: str = METHOD, include_errors: bool = False) -> list[Trajectory]:
    """The trajectories of a runner folder with their verdicts attached. Attempts that crashed
    (status `error`: the environment, the model server or the scorer failed) say nothing about
    the policy and are left out unless `include_errors`."""
    folder = Path(run_dir) / safe_name(method)
    records = {r.trajectory_id: r for r in read_records(folder) if r.trajectory_id}
    out = []
    for t in read_jsonl(folder / TRAJECTORIES) if (folder / TRAJECTORIES).is_file() else []:
        record = records.get(t.id)
        if record is None or (record.status == "error" and not include_errors):
            continue
        t.metadata = {**t.metadata, "correct": bool(record.correct), "status": record.status,
                      "score": {"correct": bool(record.correct), "scorer": record.scorer, "reason": record.reason}}
        out.append(t)
    return out


def saved_schemas(run_dir: str | Path) -> dict[str, dict[str, Any]] | None:
    path = Path(run_dir) / TOOLS_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def load_any(source: str | Path, method: str = METHOD) -> tuple[list[Trajectory], dict[str, dict[str, Any]] | None]:
    """Trajectories from a runner folder (labelled from its records) or a JSONL file (labelled
    by its own `metadata`), with the tool schemas saved beside them when there are some."""
    source = Path(source)
    if source.is_dir():
        return labelled_trajectories(source, method), saved_schemas(source)
    if not source.is_file():
        raise FileNotFoundError(f"no trajectories at {source}")
    return read_jsonl(source), saved_schemas(source.parent)
