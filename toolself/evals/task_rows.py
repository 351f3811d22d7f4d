"""A benchmark file's rows, and the rows that cannot become tasks.

Every file loader (see `loaders`, `swebench_tasks`) reads its rows here and turns each into a
task, so that JSONL, JSON, CSV, TSV and parquet are read one way, and a malformed row is always
skipped the same way: kept as a `SkippedRow` naming its file and line, never raised and never
dropped silently.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from toolself.evals.task import Task

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass
class SkippedRow:
    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class RowError(ValueError):
    """A row that cannot become a task; the message says why."""


Row = tuple[int, dict[str, Any]]


def read_rows(path: Path, skipped: list[SkippedRow]) -> Iterator[Row]:
    """(line, record) for JSONL, JSON (a list or {"data": [...]}), CSV, TSV or parquet.
    For JSON lists the 'line' is the item's position (1-based); for CSV the record's first line."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    skipped.append(SkippedRow(str(path), number, f"not JSON: {exc.msg}"))
                    continue
                if not isinstance(record, dict):
                    skipped.append(SkippedRow(str(path), number, f"a row must be a JSON object, not {type(record).__name__}"))
                    continue
                yield number, record
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        for number, record in enumerate(data, 1):
            if not isinstance(record, dict):
                skipped.append(SkippedRow(str(path), number, f"item must be a JSON object, not {type(record).__name__}"))
                continue
            yield number, record
    elif suffix in (".csv", ".tsv"):
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle, delimiter="\t" if suffix == ".tsv" else ",")
            while True:
                line = reader.line_num + 1
                try:
                    record = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    skipped.append(SkippedRow(str(path), line, f"not CSV: {exc}"))
                    continue
                if None in record:
                    skipped.append(SkippedRow(str(path), line, "more fields than the header has"))
                    continue
                yield line, record
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - pyarrow comes with datasets
            raise RuntimeError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from exc
        for number, record in enumerate(pq.read_table(path).to_pylist(), 1):
            yield number, record
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json, .csv, .tsv or .parquet)")


def each_row(path: Path, skipped: list[SkippedRow], make: Callable[[int, dict[str, Any]], Task | None]) -> list[Task]:
    """`make` applied to each row: a `RowError` it raises skips that row, a None leaves it out."""
    tasks = []
    for line, record in read_rows(path, skipped):
        try:
            task = make(line, record)
        except RowError as exc:
            skipped.append(SkippedRow(str(path), line, str(exc)))
            continue
        if task is not None:
            tasks.append(task)
    return tasks


def require_fields(record: dict[str, Any], *names: str) -> list[Any]:
    """The values of `names`, in order; a `RowError` naming the first that is missing or blank."""
    values = []
    for name in names:
        value = record.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise RowError(f"missing field {name!r}")
        values.append(value)
    return values


def split_for(path: Path, split: str | None) -> str:
    """The split asked for, else the one the file's name or folder says (validation, train,
    test), else `test`."""
    if split:
        return split
    name = str(path).lower()
    for candidate, label in (("validation", "validation"), ("dev", "validation"), ("train", "train"),
                             ("test", "test")):
        if candidate in Path(name).name or f"/{candidate}/" in name:
            return label
    return "test"
