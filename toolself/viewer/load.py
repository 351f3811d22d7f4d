"""Find the attempts a report shows: trajectories joined to their result records.

Accepts what people actually have at hand: a single trajectories JSONL file (from `toolself
run`), a results JSONL, a method folder, or a whole run folder (`RUN/<method>/results.jsonl`
and `RUN/<method>/trajectories.jsonl`). A trajectory is joined to its result by the attempt
key the runner stores in `metadata["attempt"]`; trajectories written without one fall back to
(task id, method, repeat). A result with no trajectory (the attempt crashed before writing
one) still becomes a row, so a report never hides a failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from toolself.evals.records import RESULTS, TRAJECTORIES, AttemptRecord
from toolself.trajectory import Trajectory

OUTCOMES = ("correct", "wrong", "error", "timeout", "unscored")


@dataclass
class Attempt:
    """One attempt at one task by one method: what a row of the report stands for."""

    trajectory: Trajectory | None
    record: AttemptRecord | None
    source: str = ""
    method_label: str = ""

    def _meta(self) -> dict[str, Any]:
        return self.trajectory.metadata if self.trajectory else {}

    def _key(self) -> dict[str, Any]:
        attempt = self._meta().get("attempt")
        return attempt if isinstance(attempt, dict) else {}

    @property
    def task_id(self) -> str:
        if self.record:
            return self.record.task_id
        assert self.trajectory is not None
        return self.trajectory.task_id or str(self._key().get("task_id") or self.trajectory.id)

    @property
    def method(self) -> str:
        if self.method_label:
            return self.method_label
        if self.record:
            return self.record.method
        assert self.trajectory is not None
        return self._key().get("method") or self.trajectory.method

    @property
    def dataset(self) -> str:
        if self.record and self.record.dataset:
            return self.record.dataset
        meta = self._meta()
        task = meta.get("task") if isinstance(meta.get("task"), dict) else {}
        return str(self._key().get("dataset") or meta.get("dataset") or task.get("family") or meta.get("family") or "")

    @property
    def family(self) -> str:
        if self.record and self.record.family:
            return self.record.family
        meta = self._meta()
        task = meta.get("task") if isinstance(meta.get("task"), dict) else {}
        return str(meta.get("family") or task.get("family") or "")

    @property
    def repeat(self) -> int:
        if self.record:
            return self.record.repeat
        return int(self._key().get("repeat") or self._meta().get("repeat") or 0)

    @property
    def reference(self) -> str | None:
        if self.record and self.record.reference is not None:
            return self.record.reference
        meta = self._meta()
        task = meta.get("task") if isinstance(meta.get("task"), dict) else {}
        value = meta.get("reference", task.get("answer"))
        return None if value is None else str(value)

    @property
    def outcome(self) -> str:
        """correct | wrong | error | timeout | unscored (a trajectory nobody scored)."""
        if self.record:
            if self.record.status in ("error", "timeout"):
                return self.record.status
            return "correct" if self.record.correct else "wrong"
        assert self.trajectory is not None
        if self.trajectory.error:
            return "error"
        correct = self._meta().get("correct")
        if isinstance(correct, bool):
            return "correct" if correct else "wrong"
        return "unscored"


def _join_key(task_id: str, method: str, repeat: int) -> tuple[str, str, int]:
    return (task_id, method, int(repeat))


def _read_lines(path: Path) -> Iterable[dict[str, Any]]:
    """JSON objects of a JSONL file; a torn last line (a run still writing, or killed) is
    skipped, any other bad line is an error naming it."""
    lines = path.read_text(encoding="utf-8").split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if number == last:
                return
            raise ValueError(f"{path}:{number + 1}: not a JSON record") from None


def _read_group(files: list[Path]) -> tuple[list[Trajectory], list[AttemptRecord]]:
    trajectories: list[Trajectory] = []
    records: list[AttemptRecord] = []
    for path in files:
        for data in _read_lines(path):
            if isinstance(data.get("stages"), list):
                trajectories.append(Trajectory.from_dict(data))
            elif "status" in data and "task_id" in data:
                records.append(AttemptRecord.from_dict(data))
            else:
                raise ValueError(f"{path}: a line is neither a trajectory nor a result record")
    return trajectories, records


def _join(trajectories: list[Trajectory], records: list[AttemptRecord], source: str) -> list[Attempt]:
    by_key = {r.key.id: r for r in records}
    by_loose = {_join_key(r.task_id, r.method, r.repeat): r for r in records}
    used: set[int] = set()
    out: list[Attempt] = []
    for trajectory in trajectories:
        attempt = Attempt(trajectory, None, source)
        key = attempt._key()
        record = None
        if key:
            record = by_key.get(json.dumps([key.get("dataset"), key.get("task_id"), key.get("method"),
                                            key.get("repeat", 0)], ensure_ascii=False))
        if record is None:
            record = by_loose.get(_join_key(attempt.task_id, attempt.method, attempt.repeat))
        if record is not None and id(record) not in used:
            used.add(id(record))
            attempt.record = record
        out.append(attempt)
    out.extend(Attempt(None, r, source) for r in records if id(r) not in used)
    return out


def _groups(path: Path) -> list[list[Path]]:
    """Files read together (and joined together): a method folder's two files, or one of
    them with its partner beside it. Folders are searched two levels deep, no further, so a
    run's leftover workspaces are never walked."""
    if path.is_file():
        partner = {TRAJECTORIES: RESULTS, RESULTS: TRAJECTORIES}.get(path.name)
        beside = path.with_name(partner) if partner else None
        return [[path, beside] if beside is not None and beside.exists() else [path]]
    if not path.is_dir():
        raise FileNotFoundError(f"no such file or folder: {path}")
    folders = sorted({p.parent for pattern in ("", "*/", "*/*/") for name in (RESULTS, TRAJECTORIES)
                      for p in path.glob(pattern + name)})
    if folders:
        return [[f / name for name in (TRAJECTORIES, RESULTS) if (f / name).exists()] for f in folders]
    loose = sorted(path.glob("*.jsonl"))
    if not loose:
        raise FileNotFoundError(f"{path}: no {TRAJECTORIES}, {RESULTS} or other .jsonl file in it")
    return [[p] for p in loose]


def load_attempts(paths: Iterable[str | Path]) -> list[Attempt]:
    """Every attempt under `paths`. When two inputs hold attempts with the same task, method
    and repeat (two runs of one method), the method is labelled with its input's name so both
    stay visible and comparable side by side."""
    per_source: list[tuple[str, list[Attempt]]] = []
    for raw in paths:
        path = Path(raw)
        attempts: list[Attempt] = []
        for files in _groups(path):
            trajectories, records = _read_group(files)
            attempts.extend(_join(trajectories, records, path.name))
        per_source.append((path.stem if path.is_file() else path.name, attempts))
    seen: set[tuple[str, str, str, int]] = set()
    out: list[Attempt] = []
    for label, attempts in per_source:
        keys = {(a.dataset, a.task_id, a.method, a.repeat) for a in attempts}
        if keys & seen:
            for a in attempts:
                a.method_label = f"{a.method} @ {label}"
        seen |= keys
        out.extend(attempts)
    return out
