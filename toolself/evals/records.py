"""The per-attempt result record, and the append-only files an evaluation keeps them in.

One folder per method holds two JSONL files (and a third once failed attempts are run again):

    results.jsonl        one small `AttemptRecord` per finished attempt (what tables are built from)
    trajectories.jsonl   the full trajectory of each attempt, its key in `metadata["attempt"]`
    errors.jsonl         the records of attempts that ended in `error` and were set aside to run again

An attempt is committed by writing its trajectory line and then its result line, each as one
`write` followed by flush and fsync: the result line is the commit marker. A process killed at
any moment therefore leaves at most a torn last line in either file, and possibly a trajectory
without a result. `MethodStore.open()` repairs both on (re)start: it cuts a torn last line,
then rewrites `trajectories.jsonl` (temporary file + `os.replace`, so the rewrite itself is
atomic) keeping one trajectory per committed key. Nothing is ever rewritten in place.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

RESULTS = "results.jsonl"
TRAJECTORIES = "trajectories.jsonl"
SET_ASIDE = "errors.jsonl"
STATUSES = ("ok", "timeout", "error")


@dataclass(frozen=True, order=True)
class AttemptKey:
    """What identifies an attempt across restarts: the dataset spec, the task, the method, the repeat."""

    dataset: str
    task_id: str
    method: str
    repeat: int = 0

    @property
    def id(self) -> str:
        return json.dumps([self.dataset, self.task_id, self.method, self.repeat], ensure_ascii=False)

    @classmethod
    def from_id(cls, text: str) -> "AttemptKey":
        dataset, task_id, method, repeat = json.loads(text)
        return cls(dataset, task_id, method, int(repeat))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AttemptRecord:
    """The outcome of one attempt: small enough to scan thousands of them for a table.

    status: `ok` (the agent ended on its own: terminate or a step, stage or token budget),
    `timeout` (the wall-clock limit ended it, or it never returned and was abandoned),
    `error` (the environment, the model, the agent or the scorer raised; `error` holds the
    traceback). `correct` is the scorer's verdict on whatever answer there was; `metrics` the
    other numbers its benchmark reports (HotpotQA's `f1`, GSM8K's `strict` and `flexible`).
    """

    dataset: str
    task_id: str
    method: str
    repeat: int
    status: str
    family: str = ""
    split: str = ""
    answer: str | None = None
    reference: str | None = None
    correct: bool = False
    scorer: str = ""
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    end_reason: str = ""
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0
    stages: int = 0
    reconfigurations: int = 0
    wall_time: float = 0.0
    trajectory_id: str | None = None
    finished_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.dataset, self.task_id, self.method, self.repeat)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def error_line(self) -> str:
        """The last line of the error's traceback: the exception and its message."""
        lines = (self.error or "").strip().splitlines()
        return lines[-1] if lines else "no error recorded"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AttemptRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def safe_name(method: str) -> str:
    """A method name as a folder name (`static:research` -> `static_research`)."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", method) or "_"


# -- durable JSONL --------------------------------------------------------------------------

def repair_torn_tail(path: Path) -> bool:
    """Cut a last line that was not completely written (no final newline). True if it cut."""
    if not path.exists():
        return False
    size = path.stat().st_size
    if size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        # Scan back for the last complete line; files are append-only so the torn part is short
        # relative to the chunk size in practice, but any length is handled.
        end = size
        chunk = 1 << 16
        keep = 0
        while end > 0:
            start = max(0, end - chunk)
            f.seek(start)
            data = f.read(end - start)
            cut = data.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return True


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-empty line; a complete line that is not JSON is
    corruption that repair cannot explain, so it is an error naming the line."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not a JSON record; the file is corrupt") from None


def append_lines(f, texts: list[str]) -> None:
    """Whole lines, then flush and fsync: a crash leaves at most the last line torn."""
    f.write("".join(text + "\n" for text in texts))
    f.flush()
    os.fsync(f.fileno())


def _private_open(path: Path):
    """A new file only its owner can read: run outputs hold reference answers, and the
    sandbox's uid must not read them (docs/security.md)."""
    path.unlink(missing_ok=True)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w", encoding="utf-8")


def _owner_only(path: str, flags: int) -> int:
    fd = os.open(path, flags | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def private_run_folder(out: Path) -> None:
    """Make `out` a folder others may pass through (attempts' workspaces may live inside) but
    not list, and everything already in it owner-only, so that no sandbox uid can read a run's
    records, whatever mode an earlier version gave them."""
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o711)
    for entry in out.iterdir():
        if entry.name == "workspaces" or entry.is_symlink():
            continue
        os.chmod(entry, 0o700 if entry.is_dir() else 0o600)


def changed_settings(was: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """What differs between two recorded settings, one line each (`rft.learning_rate: was
    0.0002, now 0.0001`), nested records by their dotted names: what a refused rerun names."""
    lines = []
    for name in sorted(set(was) | set(now)):
        old, new = was.get(name), now.get(name)
        if isinstance(old, dict) and isinstance(new, dict) and old and new:
            lines += changed_settings(old, new, f"{prefix}{name}.")
        elif old != new or (name in was) != (name in now):
            lines.append(f"{prefix}{name}: was {_recorded(was, name)}, now {_recorded(now, name)}")
    return lines


def _recorded(settings: dict[str, Any], name: str) -> str:
    """A setting's value as a refusal names it; one a run recorded before the setting existed is
    "not recorded", which a value of None would read like."""
    return repr(settings[name]) if name in settings else "not recorded"


def atomic_write_lines(path: Path, lines: Iterable[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with _private_open(tmp) as f:
        for line in lines:
            f.write(line if line.endswith("\n") else line + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with _private_open(tmp) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def trajectory_key(data: dict[str, Any]) -> str | None:
    attempt = (data.get("metadata") or {}).get("attempt")
    if not isinstance(attempt, dict):
        return None
    try:
        return AttemptKey(**attempt).id
    except TypeError:
        return None


class MethodStore:
    """The two files of one method's folder, opened for appending after repair.

    Thread-safe: `commit` holds a lock, so any thread may call it, and the files see whole lines
    in commit order.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.results_path = self.folder / RESULTS
        self.trajectories_path = self.folder / TRAJECTORIES
        self.records: dict[str, AttemptRecord] = {}
        self.set_aside = 0  # records of failed attempts moved to errors.jsonl as the store opened
        self._lock = threading.Lock()
        self._results = None
        self._trajectories = None

    @classmethod
    def open(cls, folder: Path, retry_errors: bool = False) -> "MethodStore":
        """The store of `folder`, repaired; with `retry_errors`, the attempts that ended in
        `error` are set aside (`_set_aside_errors`) so that they count as not run."""
        store = cls(folder)
        store.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(store.folder, 0o700)
        store._recover()
        if retry_errors:
            store.set_aside = store._set_aside_errors()
        store._results = open(store.results_path, "a", encoding="utf-8", opener=_owner_only)
        store._trajectories = open(store.trajectories_path, "a", encoding="utf-8", opener=_owner_only)
        return store

    def _recover(self) -> None:
        repair_torn_tail(self.results_path)
        repair_torn_tail(self.trajectories_path)
        duplicates = False
        for _, data in iter_json_lines(self.results_path):
            record = AttemptRecord.from_dict(data)
            if record.key.id in self.records:
                duplicates = True
                continue
            self.records[record.key.id] = record
        if duplicates:
            atomic_write_lines(self.results_path, (r.to_json() for r in self.records.values()))
        self._compact_trajectories()

    def _set_aside_errors(self) -> int:
        """Move the records of attempts that ended in `error` (the environment, a model server or
        the scorer failed: nothing the policy did) from results.jsonl to errors.jsonl, where their
        tracebacks stay, so that the attempts run again. Done before the files are opened for
        appending, as a copy then an atomic rewrite: a crash between the two sets the same
        records aside again, and loses none."""
        failed = [r for r in self.records.values() if r.status == "error"]
        if not failed:
            return 0
        with open(self.folder / SET_ASIDE, "a", encoding="utf-8", opener=_owner_only) as f:
            append_lines(f, [r.to_json() for r in failed])
        for record in failed:
            del self.records[record.key.id]
        atomic_write_lines(self.results_path, (r.to_json() for r in self.records.values()))
        self._compact_trajectories()
        return len(failed)

    def _compact_trajectories(self) -> None:
        """Keep one trajectory per committed key: drop the lines of attempts that were in flight
        when the process died (and any repeat of a key), in one atomic rewrite."""
        if not self.trajectories_path.exists():
            return
        keep: list[str] = []
        seen: set[str] = set()
        dropped = False
        with open(self.trajectories_path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    dropped = True
                    continue
                try:
                    key = trajectory_key(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{self.trajectories_path}:{number}: not a JSON record; the file is corrupt") from None
                if key is None or key not in self.records or key in seen:
                    dropped = True
                    continue
                seen.add(key)
                keep.append(line)
        if dropped:
            atomic_write_lines(self.trajectories_path, keep)

    def done(self, key: AttemptKey) -> bool:
        return key.id in self.records

    def commit(self, record: AttemptRecord, trajectory_json: str | None) -> bool:
        """Append the trajectory, then the result. False (and nothing written) if the key is
        already committed, so a late duplicate can never reach the files."""
        return bool(self.commit_many([(record, trajectory_json)]))

    def commit_many(self, items: list[tuple[AttemptRecord, str | None]]) -> list[AttemptRecord]:
        """Group commit: every trajectory of the batch, one fsync, then every result, one fsync.
        The order keeps the invariant (no result without its trajectory) at a fraction of the
        fsyncs when many attempts end together. Returns the records actually committed."""
        with self._lock:
            fresh: dict[str, tuple[AttemptRecord, str | None]] = {}
            for record, trajectory_json in items:
                if record.key.id not in self.records and record.key.id not in fresh:
                    fresh[record.key.id] = (record, trajectory_json)
            if not fresh:
                return []
            trajectories = [t for _, t in fresh.values() if t is not None]
            if trajectories:
                append_lines(self._trajectories, trajectories)
            append_lines(self._results, [r.to_json() for r, _ in fresh.values()])
            for key, (record, _) in fresh.items():
                self.records[key] = record
            return [record for record, _ in fresh.values()]

    def close(self) -> None:
        with self._lock:
            for f in (self._results, self._trajectories):
                if f is not None:
                    f.close()
            self._results = self._trajectories = None


def count_set_aside(folder: Path) -> int:
    """How many failed attempts of a method folder were set aside to run again. A crash while
    setting aside copies the same records twice (`MethodStore._set_aside_errors`), so identical
    lines count once; a torn last line is ignored."""
    path = Path(folder) / SET_ASIDE
    if not path.exists():
        return 0
    return len({line for line in path.read_text(encoding="utf-8").split("\n")[:-1] if line.strip()})


def read_records(folder: Path) -> list[AttemptRecord]:
    """The committed records of a method folder, read-only (a torn last line is ignored)."""
    path = Path(folder) / RESULTS
    if not path.exists():
        return []
    out: dict[str, AttemptRecord] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    # The element after the last newline is empty in a whole file and torn otherwise.
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}:{number}: not a JSON record; the file is corrupt") from None
        record = AttemptRecord.from_dict(data)
        out.setdefault(record.key.id, record)
    return list(out.values())
