"""The process table as /proc shows it, and killing a set of processes that may still grow."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgrp: int
    uid: int
    state: str


def processes() -> list[ProcInfo]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read().decode(errors="replace")
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        out.append(ProcInfo(int(name), int(fields[1]), int(fields[2]), uid, fields[0]))
    return out


def descendants(root_pid: int, pgid: int | None = None) -> list[int]:
    """The process, its group and everything descended from either, from one /proc scan."""
    table = processes()
    children: dict[int, list[int]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p.pid)
    found = {root_pid} | {p.pid for p in table if pgid is not None and p.pgrp == pgid}
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    alive = {p.pid for p in table if p.state != "Z"}
    return sorted(found & alive)


def kill_pids(pids_fn: Callable[[], Iterable[int]], rounds: int = 50, pause_s: float = 0.01) -> bool:
    """SIGKILL until the set is empty: a fork loop may add processes between scans. True if it emptied."""
    for _ in range(rounds):
        pids = list(pids_fn())
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(pause_s)
    log.warning("processes still alive after %d kill rounds: %s", rounds, list(pids_fn()))
    return False
