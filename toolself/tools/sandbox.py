"""Process-level containment shared by `code_interpreter`, `execute_bash` and `file_analyzer`.

The model (or whoever wrote the text it read) chooses the code these tools run, so each
attempt's processes get:

- their own session and process group, so that a timeout kills the whole group and every
  descendant found in /proc, not only the direct child;
- resource limits set by the child on itself before any untrusted code runs: address space
  (a 10 GB allocation fails with MemoryError), CPU seconds, file size, and process count;
- a scrubbed environment (no API keys or tokens of the host; HOME is the workspace);
- when the host process runs as root: a dedicated, otherwise unused numeric uid for the
  attempt. Root ignores RLIMIT_NPROC and may write anywhere; the attempt's uid cannot write
  outside its workspace (except world-writable folders such as /tmp), cannot read other
  attempts' workspaces, is really held to its process limit (a fork bomb stops there), and
  every process it started can be found and killed by uid at the end, including ones that
  left the process group;
- where the machine offers control groups (in practice: a root host), one memory and one
  process budget for the whole attempt, and a group per session that a timeout empties,
  wherever its processes went (toolself.tools.cgroups); a lease per attempt lets the next
  sandbox reap what a host killed with SIGKILL left running (toolself.tools.leases);
- optionally (`Limits.network = False`), no network: a new user and network namespace, and a
  seccomp filter refusing Unix sockets, which reach the host through the filesystem
  (toolself.tools.seccomp);
- a control pipe on which only the reply carrying the call's random id answers a call, and a
  reply line is bounded (`REPLY_BYTES`).

What remains possible is written down in docs/security.md: this is not a container.
Output is captured per call through pipes with an end-of-call marker and capped, keeping the
head and the tail and saying how much was cut.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import resource
import secrets
import select
import signal
import site
import stat
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from toolself.tools.cgroups import AttemptCgroup, kill_group
from toolself.tools.procs import descendants, kill_pids, processes
from toolself.tools.leases import Leases, host_folder, state_dir
from toolself.tools.seccomp import no_unix_sockets_filter
from toolself.tools.workspace import hand_over, open_directory

log = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UID_BASE = 1_500_000_000
UID_SPAN = 500_000_000
REPLY_BYTES = 1 << 20  # the longest reply line the host keeps; a longer one is an error for its call


@dataclass(frozen=True)
class Limits:
    """Per-call and per-process limits. Read from the environment (TOOLSELF_TOOL_*) unless an
    attempt puts its own `Limits` in `ToolContext.resources["limits"]`."""

    timeout_s: float = 60.0
    memory_bytes: int = 4 << 30
    cpu_seconds: int = 3600
    processes: int = 256
    file_bytes: int = 1 << 30
    output_chars: int = 16_000
    network: bool = True

    @classmethod
    def from_env(cls) -> "Limits":
        env = os.environ
        base = cls()
        return cls(
            timeout_s=float(env.get("TOOLSELF_TOOL_TIMEOUT", base.timeout_s)),
            memory_bytes=int(float(env.get("TOOLSELF_TOOL_MEMORY_MB", base.memory_bytes >> 20))) << 20,
            cpu_seconds=int(env.get("TOOLSELF_TOOL_CPU_S", base.cpu_seconds)),
            processes=int(env.get("TOOLSELF_TOOL_PROCESSES", base.processes)),
            file_bytes=int(float(env.get("TOOLSELF_TOOL_FILE_MB", base.file_bytes >> 20))) << 20,
            output_chars=int(env.get("TOOLSELF_TOOL_OUTPUT_CHARS", base.output_chars)),
            network=env.get("TOOLSELF_TOOL_NETWORK", "1").lower() not in {"0", "no", "none", "off", "false"},
        )


def limits_for(ctx: Any) -> Limits:
    limits = getattr(ctx, "resources", {}).get("limits") if ctx is not None else None
    return limits if isinstance(limits, Limits) else Limits.from_env()


# the attempt's identity ------------------------------------------------------------------

def _world_reachable(path: Path, *, need_read: bool = True) -> bool:
    """Whether a user with no ownership or group membership can reach (and read) `path`."""
    path = path.resolve()
    try:
        for parent in list(path.parents)[::-1]:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return bool(mode & stat.S_IXOTH) and (not need_read or bool(mode & stat.S_IROTH))
    return not need_read or bool(mode & stat.S_IROTH)


@dataclass(frozen=True)
class Interpreter:
    """The sandbox's Python: `bin_dir` goes first on PATH so that `python` in the shell is it."""

    executable: str
    site_dirs: tuple[str, ...] = ()
    bin_dir: str = ""


_SHIMS: dict[str, str] = {}


def _python_shims(executable: str) -> str:
    """A private, world-readable folder whose `python` and `python3` point at `executable`.

    Made fresh by each host process (never reused from the shared temporary folder, where
    another user could have planted one); see `leases.host_folder`."""
    folder = _SHIMS.get(executable)
    if folder is None:
        folder = host_folder("toolself-python-")
        for name in ("python", "python3"):
            os.symlink(executable, os.path.join(folder, name))
        _SHIMS[executable] = folder
    return folder


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def find_interpreter(unprivileged: bool) -> Interpreter | None:
    """The Python the sandbox runs. Our own when the sandbox user can reach it; otherwise a
    system Python of the same minor version (same C ABI) given our site-packages, because a
    virtual environment built on an interpreter under a private home is common."""
    extra = [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d and os.path.isdir(d)]
    own_bin = f"{_python_shims(sys.executable)}{os.pathsep}{Path(sys.executable).parent}"
    own = Interpreter(sys.executable, tuple(extra), own_bin)
    if not unprivileged:
        return own
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if _world_reachable(Path(sys.executable)) and _world_reachable(stdlib):
        return Interpreter(sys.executable, tuple(d for d in extra if _world_reachable(Path(d))), own_bin)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.access(candidate, os.X_OK) and _world_reachable(Path(candidate)):
            sites = tuple(d for d in [*_site_dirs(), *extra] if _world_reachable(Path(d)))
            return Interpreter(candidate, sites, _python_shims(candidate))
    return None


def _is_sandbox_uid(uid: int) -> bool:
    return UID_BASE <= uid < UID_BASE + UID_SPAN


def _free_uid() -> int:
    used = {p.uid for p in processes()} | leases().uids()  # a dead host's uid is reaped later
    while True:
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        if uid not in used:
            return uid


def _fork_refused(limit: int) -> int:
    """1 if a process held to `limit` processes cannot fork now, else 0."""
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    try:
        pid = os.fork()
    except BlockingIOError:
        return 1
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return 0


def as_uid(uid: int, action, on_refused: int = 0) -> int:
    """Run `action` in a forked child that became `uid`; its exit code (the action's return
    value), or `on_refused` when even the child could not be forked."""
    try:
        with warnings.catch_warnings():  # the child makes a few system calls and exits
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except BlockingIOError:
        return on_refused
    if pid == 0:
        code = 0
        try:
            os.setgid(uid)
            os.setuid(uid)
            code = action()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def kill_uid(uid: int) -> None:
    """Kill every process of `uid`: as that uid, kill(-1) reaches exactly its processes, atomically."""
    as_uid(uid, lambda: os.kill(-1, signal.SIGKILL) or 0)
    kill_pids(lambda: [p.pid for p in processes() if p.uid == uid and p.state != "Z"])


def resident_bytes(pids: list[int]) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            pass
    return total


_LEASES: Leases | None = None


def leases() -> Leases:
    global _LEASES
    if _LEASES is None:
        _LEASES = Leases(state_dir(), _is_sandbox_uid)
    return _LEASES


class SandboxUser:
    """Who an attempt's processes run as, and the power to stop all of them.

    One per attempt (kept in `ToolContext.resources`), shared by its Python and bash
    sessions so that both can write the workspace. Where the machine allows, the attempt also
    gets a control group (toolself.tools.cgroups) holding its memory and process budget, made
    when its first session starts. While either exists, a lease (toolself.tools.leases) says
    so, for the next host to reap if this one dies. `close()` kills whatever is left and gives
    the workspace back to its original owner.
    """

    def __init__(self, workspace: Path, uid: int | None = None, note: str = "",
                 interpreter: Interpreter | None = None):
        self.workspace = Path(workspace)
        self.uid = uid
        self.gid = uid
        self.note = note
        self.interpreter = interpreter or find_interpreter(unprivileged=False)
        self.cgroup: AttemptCgroup | None = None
        self.sessions: list[SandboxedProcess] = []
        self._cgroup_tried = False
        self._cgroup_limits: Limits | None = None
        self._oom_kills = 0
        self._lease = secrets.token_hex(8)
        self._owner: tuple[int, int] | None = None
        self._mode: int | None = None
        self._root: int | None = None  # the workspace's descriptor, for handing it over and back

    @classmethod
    def for_context(cls, ctx: Any) -> "SandboxUser":
        user = ctx.resources.get("sandbox_user")
        if user is None:
            user = cls.create(Path(ctx.workspace))
            ctx.resources["sandbox_user"] = user
        return user

    @classmethod
    def create(cls, workspace: Path, mode: str | None = None) -> "SandboxUser":
        mode = (mode or os.environ.get("TOOLSELF_SANDBOX_USER", "auto")).lower()
        workspace = Path(workspace).resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return cls(workspace, note="the sandbox runs as the current (non-root) user")
        leases().reap(kill_uid)
        if mode in {"none", "off", "root"}:
            return cls._as_root(workspace, "TOOLSELF_SANDBOX_USER=none")
        if not _world_reachable(workspace.parent, need_read=False):
            return cls._as_root(workspace, f"an unprivileged user cannot reach {workspace.parent} "
                                           "(put workspaces under a world-traversable folder such as /tmp)")
        interpreter = find_interpreter(unprivileged=True)
        if interpreter is None:
            return cls._as_root(workspace, "no Python is reachable by an unprivileged user")
        uid = _free_uid()
        user = cls(workspace, uid, interpreter=interpreter)
        leases().write(user._lease, uid, None)
        user._root = open_directory(workspace)
        st = os.fstat(user._root)
        user._owner = (st.st_uid, st.st_gid)
        user._mode = stat.S_IMODE(st.st_mode)
        hand_over(user._root, uid, uid, mode=0o700)
        return user

    @classmethod
    def _as_root(cls, workspace: Path, why: str) -> "SandboxUser":
        note = f"tool processes run as root, so writes outside the workspace are not contained: {why}"
        log.warning(note)
        return cls(workspace, note=note)

    @property
    def dedicated(self) -> bool:
        return self.uid is not None

    def popen_identity(self) -> dict[str, Any]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def attempt_cgroup(self, limits: Limits) -> AttemptCgroup | None:
        """The attempt's control group, made with the first session's limits; None where the
        machine offers none (then memory is watched by `over_memory`)."""
        if not self._cgroup_tried:
            self._cgroup_tried = True
            self._cgroup_limits = limits
            if os.environ.get("TOOLSELF_SANDBOX_CGROUP", "auto").lower() in {"none", "off"}:
                return None
            self.cgroup = AttemptCgroup.create(limits.memory_bytes, limits.processes)
            if self.cgroup is not None:
                leases().write(self._lease, self.uid, self.cgroup)
        return self.cgroup

    def memory_note(self) -> str | None:
        """Says so once when the kernel has killed processes of the attempt for its memory budget."""
        if self.cgroup is None or self._cgroup_limits is None:
            return None
        kills = self.cgroup.oom_kills()
        if kills <= self._oom_kills:
            return None
        new, self._oom_kills = kills - self._oom_kills, kills
        return (f"the task's processes reached their memory limit of {self._cgroup_limits.memory_bytes >> 20:,} MiB "
                f"together: the kernel killed {new} of them")

    def members(self, include_zombies: bool = False) -> list[int]:
        if self.uid is None:
            return []
        return [p.pid for p in processes() if p.uid == self.uid and (include_zombies or p.state != "Z")]

    def at_process_limit(self, limit: int) -> bool:
        """Whether this user may start no more processes.

        The attempt's control group counts exactly what the kernel counts. Without one, /proc
        settles it when it shows the user at its limit. It can show fewer than the kernel
        counts (processes outside this pid namespace, or a container's own cap on processes
        reached first), so a busy user is also asked the kernel's way: can a process of this
        uid, under this limit, fork?
        """
        if self.cgroup is not None:
            return self.cgroup.processes() >= limit - 2
        if self.uid is None:
            return False
        seen = len(self.members(include_zombies=True))
        if seen >= limit - 2:
            return True
        if seen < limit // 4:
            return False
        return self._as_user(lambda: _fork_refused(limit), on_refused=1) == 1

    def over_memory(self, limit: int, session: "SandboxedProcess") -> bool:
        """The fallback for a machine without control groups, checked during calls: whether the
        resident memory of the uid's processes (without a uid of its own: the calling
        session's tree) exceeds the attempt's limit."""
        if self.cgroup is not None:
            return False
        pids = self.members() if self.uid is not None else session.tree()
        return resident_bytes(pids) > limit

    def _as_user(self, action, on_refused: int = 0) -> int:
        return as_uid(self.uid, action, on_refused)

    def kill_all(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()
        if self.uid is not None:
            kill_uid(self.uid)

    def kill_strays(self, keep: set[int]) -> None:
        """Without a control group, what a session started outside its own tree (`setsid` and
        a double fork) is known only by uid: kill every process of the uid not in `keep`."""
        if self.uid is None:
            return
        kill_pids(lambda: [pid for pid in self.members() if pid not in keep])

    def renew(self) -> None:
        """Kill everything and move to a fresh uid and control group. Needed after a fork
        loop: orphans are reparented to PID 1, and where PID 1 does not reap (many containers),
        their zombies keep counting against the old uid's process limit (and the old group's) forever."""
        self.kill_all()
        if self.cgroup is not None:
            self.cgroup.close()
            self._cgroup_tried = False
            self._oom_kills = 0
            self.attempt_cgroup(self._cgroup_limits or Limits.from_env())
        if self.uid is None:
            return
        old, self.uid = self.uid, _free_uid()
        self.gid = self.uid
        leases().write(self._lease, self.uid, self.cgroup)
        hand_over(self._root, self.uid, self.gid, owned_by=old)

    def close(self) -> None:
        self.kill_all()
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None
        leases().release(self._lease)
        if self._owner is not None:
            hand_over(self._root, *self._owner, owned_by=self.uid, mode=self._mode)
            os.close(self._root)
            self._owner = None


def scrubbed_env(workspace: Path, interpreter: Interpreter, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Only what a program needs to run; nothing of the host's secrets."""
    env = {
        "PATH": f"{interpreter.bin_dir}:{SAFE_PATH}" if interpreter.bin_dir else SAFE_PATH,
        "HOME": str(workspace),
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
    }
    if interpreter.site_dirs:  # a substituted system Python still sees the environment's packages
        env["PYTHONPATH"] = os.pathsep.join(interpreter.site_dirs)
    env.update(extra or {})
    return env


def rlimits(limits: Limits, user: SandboxUser) -> dict[str, list[int]]:
    out = {
        "RLIMIT_AS": [limits.memory_bytes, limits.memory_bytes],
        "RLIMIT_CPU": [limits.cpu_seconds, limits.cpu_seconds + 5],
        "RLIMIT_FSIZE": [limits.file_bytes, limits.file_bytes],
        "RLIMIT_CORE": [0, 0],
    }
    if user.dedicated:
        out["RLIMIT_NPROC"] = [limits.processes, limits.processes]
    elif os.geteuid() != 0:  # counted over all of this user's processes, so leave room for them
        mine = sum(1 for p in processes() if p.uid == os.getuid())
        out["RLIMIT_NPROC"] = [mine + limits.processes, mine + limits.processes]
    return out


# Run first by every sandboxed child, before anything the model wrote.
LIMITS_PRELUDE = r"""
import os, json, resource
for _n, (_s, _h) in json.loads(os.environ.pop("TOOLSELF_RLIMITS")).items():
    _cs, _ch = resource.getrlimit(getattr(resource, _n))
    _h = _h if _ch == resource.RLIM_INFINITY else min(_h, _ch)
    resource.setrlimit(getattr(resource, _n), (min(_s, _h), _h))
del _n, _s, _h, _cs, _ch
if os.environ.pop("TOOLSELF_NO_NETWORK", "") == "1":
    # A new user and network namespace: only a loopback that is down. Then a seccomp filter
    # refusing Unix sockets, which reach the host through the filesystem. Fail closed.
    import ctypes
    _libc = ctypes.CDLL(None, use_errno=True)
    _filter = bytes.fromhex(os.environ.pop("TOOLSELF_SECCOMP", ""))
    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    if _libc.unshare(0x10000000 | 0x40000000) != 0:
        _why = "unshare: " + os.strerror(ctypes.get_errno())
    elif not _filter:
        _why = "no seccomp filter for this machine's architecture"
    elif (_libc.prctl(38, 1, 0, 0, 0) != 0  # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP, SECCOMP_MODE_FILTER
          or _libc.prctl(22, 2, ctypes.byref(_Prog(len(_filter) // 8, _filter)), 0, 0) != 0):
        _why = "seccomp: " + os.strerror(ctypes.get_errno())
    else:
        _why = ""
    if _why:
        os.write(2, ("toolself: cannot cut the network off (%s)\n" % _why).encode())
        os._exit(70)
    del _libc, _filter, _Prog, _why
"""


# output capture ----------------------------------------------------------------------------

class Capture:
    """One stream of one call: the head and the tail kept, the middle counted."""

    def __init__(self, cap_chars: int):
        self.head_cap = max(64, cap_chars * 3 // 4)
        self.tail_cap = max(64, cap_chars - self.head_cap)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.tail:
            return head
        tail = self.tail.decode("utf-8", errors="replace")
        if self.cut <= 0:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        return f"{head}\n[... {self.cut:,} bytes of output cut ({self.total:,} in all) ...]\n{tail}"


class _Stream:
    """Reads one pipe in a thread (which owns the descriptor and closes it at end of file)
    and files bytes under the current call until the end-of-call marker; what arrives after
    the marker (a background job still printing) is shown with the next call."""

    def __init__(self, fd: int, marker: bytes, cap_chars: int):
        self.fd = fd
        self.marker = marker
        self.cap_chars = cap_chars
        self.lock = threading.Lock()
        self.capture = Capture(cap_chars)
        self.between = Capture(cap_chars)
        self.ended = threading.Event()
        self.closed = threading.Event()
        self._carry = b""
        threading.Thread(target=self._pump, daemon=True).start()

    def begin(self) -> None:
        with self.lock:
            self.capture = Capture(self.cap_chars)
            if self.between.total:
                self.capture.add(self.between.text().encode())
            self.between = Capture(self.cap_chars)
            self.ended.clear()

    def _target(self) -> Capture:
        return self.between if self.ended.is_set() else self.capture

    def _pump(self) -> None:
        keep = len(self.marker) - 1
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:
                data = b""
            with self.lock:
                if not data:
                    if self._carry:
                        self._target().add(self._carry)
                        self._carry = b""
                    os.close(self.fd)
                    self.closed.set()
                    self.ended.set()
                    return
                data = self._carry + data
                while (at := data.find(self.marker)) >= 0:
                    self._target().add(data[:at])
                    self.ended.set()
                    data = data[at + len(self.marker):]
                if len(data) > keep:
                    self._target().add(data[:-keep])
                    data = data[-keep:]
                self._carry = data


@dataclass
class CallResult:
    """What a sandboxed call produced. `status`: ok | timeout | died | processes | memory | too_large."""

    status: str
    reply: str | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


TOO_LARGE = object()


class _Replies:
    """Reads the control pipe in a thread (which owns the descriptor and closes it at end of
    file) and passes on one line only: the first that carries the id of the call awaited.

    A reply line is `<call id> <reply>`, preceded by a newline of the child's own, so that
    bytes the session's code left in the pipe without a newline end before the reply does.
    Any other line (written by the session's code, or a reply that came after its call's
    timeout) is dropped, so nothing written to the pipe can answer a later call. A line longer
    than `cap` bytes is dropped while it arrives: the host never holds more than `cap` bytes of it.
    """

    def __init__(self, fd: int, cap: int):
        self.fd = fd
        self.cap = cap
        self.queue: queue.Queue[Any] = queue.Queue()
        self._expect: bytes | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def expect(self, call_id: str | None) -> None:
        with self._lock:
            self._expect = call_id.encode() if call_id else None
            while not self.queue.empty():
                if self.queue.get_nowait() is None:  # end of file stays known
                    self.queue.put(None)
                    break

    def _line(self, line: bytes, too_large: bool = False) -> None:
        call_id, _, reply = line.partition(b" ")
        with self._lock:
            if self._expect is None or call_id != self._expect:
                return
            self._expect = None
            self.queue.put(TOO_LARGE if too_large else reply.decode("utf-8", errors="replace"))

    def _pump(self) -> None:
        line = bytearray()
        dropping: bytes | None = None  # the start of an over-long line, while the rest is skipped
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                self.queue.put(None)
                os.close(self.fd)
                return
            pieces = data.split(b"\n")
            for i, piece in enumerate(pieces):
                ended = i < len(pieces) - 1
                if dropping is None:
                    line += piece
                    if len(line) > self.cap:
                        dropping = bytes(line[:64])
                        line.clear()
                if ended:
                    if dropping is not None:
                        self._line(dropping, too_large=True)
                        dropping = None
                    else:
                        self._line(bytes(line))
                    line.clear()


class SandboxedProcess:
    """A long-lived child (a Python REPL or a bash) driven one request at a time.

    The child reads requests from one pipe and answers each with one line on another, which
    carries the random id the host gave that call (see `_Replies`); its stdout and stderr are
    captured per call. A call that outlives its timeout, trips the process or memory limit, or
    whose child dies, ends with every process of the session killed (with a control group:
    every process the session started, `setsid` or not); the next call starts a fresh child
    and says so.

    The id is not a secret from the session's own code, which runs in the child and can read
    its memory: that code can choose the reply to its own call, as it chooses its own output.
    What it cannot do is answer any other call, or make a reply arrive out of turn.
    """

    def __init__(self, name: str, argv: list[str], user: SandboxUser, limits: Limits,
                 extra_env: dict[str, str] | None = None, reply_bytes: int = REPLY_BYTES):
        self.name = name
        self.argv = argv
        self.user = user
        self.limits = limits
        self.extra_env = extra_env or {}
        self.reply_bytes = reply_bytes
        self.proc: subprocess.Popen | None = None
        self.pending_notes: list[str] = []
        self.started_once = False
        self._lock = threading.Lock()
        self._cgroup: list[Path] = []
        self._cgroup_name = "session-" + secrets.token_hex(4)
        user.sessions.append(self)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self._peek_exit(0) is None

    def tree(self) -> list[int]:
        proc = self.proc
        return descendants(proc.pid, proc.pid) if proc is not None and proc.returncode is None else []

    def _peek_exit(self, wait_s: float) -> int | None:
        """The child's exit status (negative: the signal) without reaping it, so that its pid
        and process group cannot be reused by an unrelated process before `kill()` runs."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        deadline = time.monotonic() + wait_s
        while True:
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return proc.returncode if proc.returncode is not None else -1
            if info is not None and info.si_pid:
                return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def start(self) -> None:
        self.marker = b"\x1e\x1f" + secrets.token_hex(8).encode() + b"\x1f\n"
        cgroup = self.user.attempt_cgroup(self.limits)
        self._cgroup = cgroup.session(self._cgroup_name) if cgroup is not None else []
        seccomp = no_unix_sockets_filter() if not self.limits.network else None
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        env = scrubbed_env(self.user.workspace, self.user.interpreter, {
            **self.extra_env,
            "TOOLSELF_CTL_IN": str(to_child_r),
            "TOOLSELF_CTL_OUT": str(from_child_w),
            "TOOLSELF_MARK": self.marker.decode(),
            "TOOLSELF_RLIMITS": json.dumps(rlimits(self.limits, self.user)),
            **({} if self.limits.network else {"TOOLSELF_NO_NETWORK": "1", "TOOLSELF_SECCOMP": (seccomp or b"").hex()}),
        })
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                pass_fds=(to_child_r, from_child_w), cwd=self.user.workspace, env=env,
                start_new_session=True, bufsize=0, **self.user.popen_identity(),
            )
            # before the first request is written, so before any code the model wrote runs
            if self._cgroup:
                AttemptCgroup.enter(self._cgroup, self.proc.pid)
        except BaseException:
            if self.proc is not None:
                self.kill()
            for fd in (to_child_w, from_child_r, out_r, err_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise
        finally:
            for fd in (to_child_r, from_child_w, out_w, err_w):
                os.close(fd)
        os.set_blocking(to_child_w, False)
        self._ctl_w = os.fdopen(to_child_w, "wb", buffering=0)
        self._replies = _Replies(from_child_r, self.reply_bytes)
        self.stdout = _Stream(out_r, self.marker, self.limits.output_chars)
        self.stderr = _Stream(err_r, self.marker, max(2000, self.limits.output_chars // 2))
        if self.started_once:
            self.pending_notes.append(f"a fresh {self.name} was started; earlier state (variables, working directory) is gone")
        self.started_once = True

    def call(self, request: Callable[[str], bytes], timeout_s: float | None = None) -> CallResult:
        """Send `request(call_id)`, the session's framing of one request carrying that id."""
        with self._lock:  # one request at a time, even if two threads share an attempt
            return self._call(request, timeout_s)

    def _watched(self) -> str | None:
        """A limit of the attempt that its processes have reached, checked during long calls."""
        if (self.user.dedicated or self.user.cgroup is not None) and self.user.at_process_limit(self.limits.processes):
            return "processes"
        if self.user.over_memory(self.limits.memory_bytes, self):
            return "memory"
        return None

    def _call(self, request: Callable[[str], bytes], timeout_s: float | None) -> CallResult:
        timeout_s = self.limits.timeout_s if timeout_s is None else timeout_s
        notes: list[str] = []
        if self.user.at_process_limit(self.limits.processes):
            self._process_limit_hit(notes)
        if not self.alive:
            if self.proc is not None:
                self.kill()
            self.start()
        notes += self.pending_notes
        self.pending_notes = []
        self.stdout.begin()
        self.stderr.begin()
        call_id = secrets.token_hex(16)
        self._replies.expect(call_id)
        start = time.perf_counter()
        deadline = start + timeout_s
        try:
            sent = self._send(request(call_id), deadline)
        except OSError:  # the child is gone (BrokenPipeError)
            self.kill()
            return CallResult("died", notes=notes + [f"the {self.name} was not running; try again"])
        status, reply = self._await(start, deadline) if sent else ("timeout", None)
        self._replies.expect(None)
        if status in {"ok", "too_large"}:
            self.stdout.ended.wait(1.0)
            self.stderr.ended.wait(1.0)
        result = CallResult(status, reply, seconds=time.perf_counter() - start, notes=notes)
        if status == "timeout":
            self.kill()
            result.notes.append(f"timed out after {timeout_s:g} s: every process of the {self.name} was killed "
                                f"and its state was lost; the next call starts a fresh {self.name}")
        elif status == "too_large":
            result.notes.append(f"the {self.name}'s reply was over {self.reply_bytes:,} bytes and was dropped")
        elif status == "memory":
            self.kill()
            self.user.kill_all()
            result.notes.append(f"the task's processes held more than {self.limits.memory_bytes >> 20:,} MiB of memory "
                                "together: all of them were killed and the state was lost")
        elif status == "processes" or (status == "ok" and self.user.at_process_limit(self.limits.processes)):
            self._process_limit_hit(result.notes)  # what a finished command printed is still its own
        elif status == "died":
            code = self._peek_exit(2.0)
            self.kill()
            why = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            result.notes.append(f"the {self.name} exited ({why}); its state was lost and the next call starts a fresh one")
        if (note := self.user.memory_note()) is not None:
            result.notes.append(note)
        result.stdout = self.stdout.capture.text()
        result.stderr = self.stderr.capture.text()
        return result

    def _send(self, data: bytes, deadline: float) -> bool:
        """Write a request, waiting for the child to take it until `deadline` at most (False
        then): a session whose code stopped its driver from reading must not hold the host."""
        view = memoryview(data)
        while view:
            written = self._ctl_w.write(view)  # non-blocking: None when the pipe is full
            if written:
                view = view[written:]
                continue
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return False
            select.select([], [self._ctl_w], [], min(remaining, 0.25))
        return True

    def _await(self, start: float, deadline: float) -> tuple[str, str | None]:
        """The call's status and reply: the reply, or the first of timeout, end of file, a limit reached."""
        next_check = start + 0.5
        while True:
            now = time.perf_counter()
            if now >= deadline:
                return "timeout", None
            try:
                item = self._replies.queue.get(timeout=min(0.25, deadline - now))
            except queue.Empty:
                if time.perf_counter() >= next_check:
                    next_check += 0.5
                    if (reached := self._watched()) is not None:
                        return reached, None
                continue
            if item is None:
                return "died", None
            if item is TOO_LARGE:
                return "too_large", None
            return "ok", item

    def _process_limit_hit(self, notes: list[str]) -> None:
        self.kill()
        self.user.renew()
        notes.append(f"the task reached its limit of {self.limits.processes} processes (a fork loop?): all of "
                     "its processes were killed and its state was lost")

    def kill(self) -> None:
        """Kill every process of the session, then reap the child.

        With a control group that is everything in the session's group, wherever in the
        process tree it went. Without one: the child's process group and every descendant,
        and with a uid of its own, every process of the uid outside the other live sessions'
        trees (a daemon that left with `setsid` and a double fork is known only by its uid)."""
        proc = self.proc
        if proc is None:
            return
        if self._cgroup:
            kill_group(self._cgroup)
        if proc.returncode is None:  # not reaped: the pid and its group are still this session's
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            kill_pids(lambda: descendants(proc.pid, proc.pid))
        if not self._cgroup:
            others = [s for s in self.user.sessions if s is not self]
            self.user.kill_strays({pid for s in others for pid in s.tree()})
        try:
            proc.wait(timeout=5)  # reaped only now: until here its pid and group were ours
        except subprocess.TimeoutExpired:
            pass
        for stream in (getattr(self, "stdout", None), getattr(self, "stderr", None)):
            if stream is not None:
                stream.closed.wait(1.0)
        try:
            self._ctl_w.close()
        except (OSError, AttributeError):
            pass
        self.proc = None

    def close(self) -> None:
        self.kill()


def with_limits(ctx: Any, **changes: Any) -> Limits:
    """Convenience for tests and runners: set this attempt's limits."""
    limits = replace(limits_for(ctx), **changes)
    ctx.resources["limits"] = limits
    return limits
