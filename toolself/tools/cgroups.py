"""One memory and process budget for everything an attempt starts, and a way to find all of it.

Per-process limits (`RLIMIT_AS`) let three forked children hold a limit's worth of memory
each, and a process that calls `setsid` and forks twice leaves its process group and its
parent's tree. A control group fixes both: the kernel charges every process of the attempt
to one memory and one process budget, children are born in their parent's group, and the
sandbox uid cannot move itself out (the group's files belong to root). Each session of the
attempt gets a subgroup of the attempt's group, so that one session can be emptied (after a
timeout) without touching the other.

Where the machine offers it: cgroup v2 with the `memory` and `pids` controllers available
to the host's own group (or to the root group), else the v1 `memory` and `pids` hierarchies.
Creating groups needs write access to them, which in practice means a root host. Where
neither works, `AttemptCgroup.create` returns None and the sandbox falls back to per-uid
process limits and a watchdog over resident memory (see toolself.tools.sandbox).
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from toolself.tools.procs import kill_pids

log = logging.getLogger(__name__)

PREFIX = "toolself-"


@dataclass(frozen=True)
class Hierarchy:
    """Where new groups go in one mounted hierarchy, and which controllers it carries."""

    version: int
    parent: Path
    controllers: frozenset[str]


def mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, options) of every cgroup mount, from /proc/self/mountinfo."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and tail and tail[0] in {"cgroup", "cgroup2"}:
            options = set(tail[2].split(",")) if len(tail) > 2 else set()
            out.append((fields[4].replace("\\040", " "), tail[0], options))
    return out


def _own_paths() -> dict[str, str]:
    """This process's group in each hierarchy: {"memory": "/a/b", ..., "": "/c"} (v2 is "")."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    return paths


def _v2_parent(mount: str, own: str) -> Path | None:
    """The host's own v2 group if it delegates memory and pids to children, or can be made to."""
    for path in (Path(mount) / own.lstrip("/"), Path(mount)):
        try:
            available = set((path / "cgroup.controllers").read_text().split())
            if not {"memory", "pids"} <= available:
                continue
            enabled = set((path / "cgroup.subtree_control").read_text().split())
            if not {"memory", "pids"} <= enabled:
                # refused with EBUSY when the group holds processes itself (except the root)
                (path / "cgroup.subtree_control").write_text("+memory +pids")
            return path
        except OSError:
            continue
    return None


def hierarchies() -> list[Hierarchy]:
    """The hierarchies that give an attempt both a memory and a process budget, or []."""
    own = _own_paths()
    found_mounts = mounts()
    for mount, kind, _ in found_mounts:
        if kind == "cgroup2" and "" in own:
            parent = _v2_parent(mount, own[""])
            if parent is not None:
                return [Hierarchy(2, parent, frozenset({"memory", "pids"}))]
    found: dict[str, Hierarchy] = {}
    for mount, kind, options in found_mounts:
        for name in ("memory", "pids"):
            if kind == "cgroup" and name in options and name in own and name not in found:
                parent = Path(mount) / own[name].lstrip("/")
                if os.access(parent, os.W_OK):
                    found[name] = Hierarchy(1, parent, frozenset({name}))
    return list(found.values()) if len(found) == 2 else []


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _pids(group: Path) -> set[int]:
    """Every process in `group` and its subgroups."""
    out: set[int] = set()
    for dirpath, _, filenames in os.walk(group):
        if "cgroup.procs" in filenames:
            try:
                out.update(int(pid) for pid in Path(dirpath, "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
    return out


def _remove(group: Path) -> bool:
    """rmdir the group and its subgroups, deepest first; False if a process is still in one."""
    ok = True
    for dirpath, _, _ in sorted(os.walk(group), key=lambda entry: -len(entry[0])):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok


def kill_group(groups: list[Path]) -> bool:
    """SIGKILL every process in the groups until they are empty (a fork lands in its parent's
    group, so the set only shrinks once each round has killed the parents). True if empty."""
    return kill_pids(lambda: set().union(*(_pids(g) for g in groups if g.exists())), rounds=100, pause_s=0.005)


class AttemptCgroup:
    """The attempt's group in each hierarchy: its limits on the group, sessions in subgroups."""

    def __init__(self, dirs: list[Path], version: int):
        self.dirs = dirs
        self.version = version

    @classmethod
    def create(cls, memory_bytes: int, processes: int) -> "AttemptCgroup | None":
        found = hierarchies()
        if not found:
            return None
        name = PREFIX + secrets.token_hex(6)
        dirs: list[Path] = []
        try:
            for hierarchy in found:
                path = hierarchy.parent / name
                path.mkdir(mode=0o755)
                dirs.append(path)
                if hierarchy.version == 2:
                    _write(path / "memory.max", str(memory_bytes))
                    _try_write(path / "memory.swap.max", "0")
                    _write(path / "pids.max", str(processes))
                    _write(path / "cgroup.subtree_control", "+memory +pids")
                elif "memory" in hierarchy.controllers:
                    _try_write(path / "memory.use_hierarchy", "1")
                    _write(path / "memory.limit_in_bytes", str(memory_bytes))
                    _try_write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
                else:
                    _write(path / "pids.max", str(processes))
        except OSError as exc:
            log.warning("no control group for the attempt (%s): falling back to per-process limits", exc)
            for path in dirs:
                _remove(path)
            return None
        return cls(dirs, found[0].version)

    def session(self, name: str) -> list[Path]:
        """A subgroup per hierarchy for one session (made once, reused by its restarts)."""
        paths = [d / name for d in self.dirs]
        for path in paths:
            path.mkdir(mode=0o755, exist_ok=True)
        return paths

    @staticmethod
    def enter(paths: list[Path], pid: int) -> None:
        for path in paths:
            _write(path / "cgroup.procs", str(pid))

    def processes(self) -> int:
        """How many processes (and threads, for the kernel's count) the attempt holds now."""
        for path in self.dirs:
            current = path / "pids.current"
            if current.exists():
                try:
                    return int(current.read_text())
                except (OSError, ValueError):
                    return 0
        return 0

    def oom_kills(self) -> int:
        """How many of the attempt's processes the kernel has killed to keep its memory budget
        (v2 counts them in the group's own `memory.events`; v1 in the subgroup where it happened)."""
        if self.version == 2:
            files = [d / "memory.events" for d in self.dirs]
        else:
            files = [Path(top, "memory.oom_control") for d in self.dirs for top, _, names in os.walk(d)
                     if "memory.oom_control" in names]
        kills = 0
        for path in files:
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            kills += sum(int(value) for key, _, value in (line.partition(" ") for line in lines) if key == "oom_kill")
        return kills

    def members(self) -> set[int]:
        return _pids(self.dirs[0]) if self.dirs else set()

    def kill(self) -> bool:
        return kill_group(self.dirs)

    def close(self) -> bool:
        """Kill everything in the attempt's group and remove it; False if some of it stayed."""
        emptied = self.kill()
        return all([_remove(d) for d in self.dirs]) and emptied


def _try_write(path: Path, value: str) -> None:
    try:
        _write(path, value)
    except OSError:
        pass
