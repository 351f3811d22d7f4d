"""An eval output folder read back: the settings it ran with, its committed records, and how
many failed attempts were set aside to run again (`errors.jsonl`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolself.evals.records import SET_ASIDE, AttemptRecord, count_set_aside, read_records

RUN_FILE = "run.json"


@dataclass
class Run:
    """One eval output folder: its settings and its records."""

    folder: Path
    settings: dict[str, Any]
    records: list[AttemptRecord]
    set_aside: dict[str, int] = field(default_factory=dict)  # method -> failed attempts that ran again

    @property
    def history(self) -> list[str]:
        """What the table alone hides: attempts that failed on an earlier run and ran again, and
        attempts that still ended in an error (counted wrong)."""
        lines = [f"{n} attempt(s) of `{m}` ended in an error on an earlier run and ran again; "
                 f"their records are in `{m}/{SET_ASIDE}`" for m, n in self.set_aside.items() if n]
        failed = sum(r.status == "error" for r in self.records)
        if failed:
            lines.append(f"{failed} attempt(s) ended in an error and count as wrong; "
                         "a rerun of the same command runs them again")
        return lines

    @property
    def methods(self) -> list[str]:
        listed = list(self.settings.get("methods") or [])
        return listed + [m for m in dict.fromkeys(r.method for r in self.records) if m not in listed]

    @property
    def datasets(self) -> list[str]:
        listed = list(self.settings.get("tasks") or [])
        return listed + [d for d in dict.fromkeys(r.dataset for r in self.records) if d not in listed]


def load_run(folder: Path) -> Run:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no eval output folder at {folder}")
    settings: dict[str, Any] = {}
    run_file = folder / RUN_FILE
    if run_file.exists():
        data = json.loads(run_file.read_text(encoding="utf-8"))
        settings = dict(data.get("last_command") or {})
        settings.update(data.get("identity") or {})
    records = []
    set_aside = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        records.extend(read_records(sub))
        set_aside[sub.name] = count_set_aside(sub)
    if not records and not run_file.exists():
        raise FileNotFoundError(f"{folder} holds no eval results (no run.json, no */results.jsonl)")
    return Run(folder, settings, records, {m: n for m, n in set_aside.items() if n})
