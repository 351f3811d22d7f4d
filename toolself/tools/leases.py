"""What a host that died left running: one lease file per live attempt, reaped at the next start.

An attempt's processes are killed when it closes, but a host killed with SIGKILL (or the
machine's OOM killer) closes nothing: processes of its sandbox uids and its control groups
stay. Each attempt that has a dedicated uid or a control group therefore writes a lease
naming them and its host (pid and start time, so a reused pid is not taken for the host),
in a folder only the host's user can write. Whenever a new attempt is given its sandbox, the
leases of hosts no longer alive are reaped: their uids' processes killed, their groups
removed, the lease deleted.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolself.tools.cgroups import PREFIX, AttemptCgroup, mounts

log = logging.getLogger(__name__)


@dataclass
class Lease:
    uid: int | None
    cgroups: list[str] = field(default_factory=list)
    host_pid: int = 0
    host_start: str = ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if it is gone): a pid and this
    name one process, where a pid alone may since belong to another."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return ""
    return raw[raw.rfind(")") + 2:].split()[19]


def state_dir() -> Path | None:
    """The host's lease folder, made private to the host's user; None where it cannot be
    (a folder the sandbox could have made or can write is no place for what the host will act on)."""
    configured = os.environ.get("TOOLSELF_SANDBOX_STATE")
    if configured:
        path = Path(configured)
    elif os.geteuid() == 0 and os.access("/run", os.W_OK):
        path = Path("/run/toolself-sandbox")
    else:
        path = Path(tempfile.gettempdir()) / f"toolself-sandbox-{os.geteuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        log.warning("%s is not a private folder of this user: leases of sandbox processes are not kept", path)
        return None
    return path


class Leases:
    """The lease of one attempt (held while it lives) and the reaping of dead hosts' leases."""

    def __init__(self, folder: Path | None, valid_uid: Callable[[int], bool]):
        self.folder = folder
        self.valid_uid = valid_uid

    def write(self, key: str, uid: int | None, cgroup: AttemptCgroup | None) -> None:
        if self.folder is None or (uid is None and cgroup is None):
            return
        me = os.getpid()
        lease = Lease(uid, [str(d) for d in (cgroup.dirs if cgroup else [])], me, _start_time(me))
        temporary = self.folder / f".{key}.tmp"
        temporary.write_text(json.dumps(asdict(lease)))
        os.replace(temporary, self.folder / f"{key}.json")

    def release(self, key: str) -> None:
        if self.folder is not None:
            (self.folder / f"{key}.json").unlink(missing_ok=True)

    def uids(self) -> set[int]:
        """The uids named by any lease, live or not yet reaped."""
        return {lease.uid for _, lease in self._read() if lease.uid is not None}

    def _read(self) -> list[tuple[Path, Lease]]:
        if self.folder is None:
            return []
        found = []
        for path in self.folder.glob("*.json"):
            try:
                found.append((path, Lease(**json.loads(path.read_text()))))
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)
        return found

    def reap(self, kill_uid: Callable[[int], None]) -> list[Lease]:
        """Reap every lease whose host is gone; the leases reaped."""
        reaped = []
        for path, lease in self._read():
            if lease.host_start and _start_time(lease.host_pid) == lease.host_start:
                continue
            if lease.uid is not None and self.valid_uid(lease.uid):
                kill_uid(lease.uid)
            groups = [Path(d) for d in lease.cgroups if _is_attempt_group(Path(d))]
            if groups and not AttemptCgroup(groups, 0).close():
                log.warning("processes of a dead host's attempt are still in %s", groups)
                continue
            path.unlink(missing_ok=True)
            reaped.append(lease)
        return reaped


def _is_attempt_group(path: Path) -> bool:
    """Only a group this module could have made: named so, inside a mounted cgroup hierarchy."""
    if not path.name.startswith(PREFIX) or ".." in path.parts:
        return False
    return any(path.is_relative_to(mount) for mount, _, _ in mounts())


def host_folder(prefix: str) -> str:
    """A fresh world-readable folder in the shared temporary folder for what this host's
    sandboxes read (the Python shims, the check reporter), named by the host (pid and start
    time) and removed at exit. A host killed with SIGKILL removes nothing at exit, so the
    folders of `prefix` whose hosts are gone are removed first: only folders of this user, and
    never one of a live host."""
    import atexit
    import shutil

    me = os.getpid()
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*-*-*"):
        pid, _, rest = path.name[len(prefix):].partition("-")
        start = rest.partition("-")[0]
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if (pid.isdigit() and stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
                and _start_time(int(pid)) != start):
            shutil.rmtree(path, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=f"{prefix}{me}-{_start_time(me)}-")
    os.chmod(folder, 0o755)
    atexit.register(shutil.rmtree, folder, True)
    return folder
