"""An eval output folder's run.json, checked against a rerun's settings and written, and the
folder read back: the settings it ran with, its committed records, and how many failed attempts
were set aside to run again (`errors.jsonl`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolself.evals.records import (SET_ASIDE, AttemptRecord, atomic_write_text, changed_settings, count_set_aside,
                                    read_records)
from toolself.models.digests import same_base
from toolself.models.spec import served_name

RUN_FILE = "run.json"
RUN_FORMAT = 1


class SettingsMismatch(ValueError):
    """The output folder holds results made under other settings."""


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
                 f"their records are in `{m}/{SET_ASIDE}`" for m, n in self.set_aside.items()]
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
        if count := count_set_aside(sub):
            set_aside[sub.name] = count
    if not records and not run_file.exists():
        raise FileNotFoundError(f"{folder} holds no eval results (no run.json, no */results.jsonl)")
    return Run(folder, settings, records, set_aside)


def check_run_file(out: Path, identity: dict[str, Any], command: dict[str, Any], force: bool) -> None:
    """Record the command in run.json, refusing (unless forced) a run folder whose results were
    made under another identity: another model (known by its served name, or a `local:` model
    by what it holds), budgets, split, seed or suite key."""
    path = out / RUN_FILE
    data: dict[str, Any] = {"format": RUN_FORMAT, "identity": identity, "commands": []}
    if path.exists():
        existing = json.loads(path.read_text(encoding="utf-8"))
        old = _moved_models(_without_addresses(existing.get("identity", {})), identity, existing,
                            command.get("weights", {}))
        differ = changed_settings(old, identity)
        if differ and not force:
            raise SettingsMismatch(f"{out} holds results made under other settings; rerunning would mix them:\n"
                                   + "\n".join(f"  {line}" for line in differ)
                                   + "\nUse another --out folder, or --force to add to it anyway.")
        data["commands"] = list(existing.get("commands", []))
        if differ:
            data["forced_over"] = existing.get("forced_over", []) + [existing.get("identity", {})]
    data["commands"].append({**command, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    data["last_command"] = command
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _moved_models(old: dict[str, Any], identity: dict[str, Any], existing: dict[str, Any],
                  weights: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`old` with each `local:` model that moved since the run recorded it (`digests.same_base`)
    known by its new path: the same run."""
    recorded: dict[str, Any] = {}
    for command in existing.get("commands", []):
        recorded.update(command.get("weights") or {})
    moved = {role: identity[role] for role, now in weights.items()
             if old.get(role) != identity.get(role) and role in recorded and same_base(recorded[role], now)}
    return {**old, **moved}


def _without_addresses(identity: dict[str, Any]) -> dict[str, Any]:
    """An identity as recorded before models were known by their served names."""
    return {k: served_name(v) if k in ("model", "config_model", "judge") and isinstance(v, str) else v
            for k, v in identity.items()}
