"""Running a task's check against an attempt's workspace, inside the attempt's sandbox.

The workspace is hostile material by the time a check runs: the model wrote its files and may
have planted links, test files, `conftest.py` or `.pth` files in it, and left processes
behind. So a check:

1. stops the attempt: its sessions are closed and every process of its uid is killed;
2. restores the grader's files from the task's own copy, relative to a descriptor of the
   workspace and never through a link: a link, FIFO or directory where a file or folder
   should be is removed and replaced, so a planted `tests -> /etc` cannot redirect a write;
3. runs the command as the attempt's uid, under its limits, with a scrubbed environment
   (`PYTHONNOUSERSITE`, a clean `PYTHONPATH`), in its own session, killed whole at the timeout;
4. decides from the test runner's own per-test report (`check_report`), sent through a
   descriptor the host opened, that every expected test ran and passed. The command's exit
   status is recorded but never decides: `os._exit(0)` in a planted file passes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from toolself.tools.leases import host_folder
from toolself.tools.sandbox import (
    LIMITS_PRELUDE, Capture, Limits, SandboxUser, descendants, kill_pids, limits_for, rlimits, scrubbed_env,
)

PASSED = ("passed", "xfailed")
REPORT_CAP_BYTES = 8 << 20
LOG_CAP_BYTES = 32 << 20
OUTPUT_CHARS = 4000
HOOKED_RUNNERS = ("pytest", "unittest", "runtests.py")


@dataclass
class CheckRun:
    """What one check produced: the runner's per-test outcomes and how the command ended."""

    exit_status: int | None  # None: killed at the timeout
    output: str
    seconds: float
    outcomes: dict[str, str] = field(default_factory=dict)
    finished: bool = False  # the runner reported the end of its run
    tampered: list[str] = field(default_factory=list)
    report_lines: int = 0
    log: str = ""  # the whole output up to LOG_CAP_BYTES, for log-based rules such as SWE-bench's


def reports_per_test(command: str) -> bool:
    """Whether the command runs a test runner `check_report` hooks (pytest, unittest, Django's
    runtests.py), so that a missing report means the tests did not pass. Decided from the
    command, never from the run: a run that silenced the reporter must not fall back to a log
    it printed itself."""
    return any(runner in command for runner in HOOKED_RUNNERS)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str
    missing: list[str] = field(default_factory=list)


def expected_ids(check_tests: dict[str, list[str]] | list[str]) -> list[str]:
    """Every test id a task expects to pass, once each, in order (kinds merged)."""
    ids = check_tests if isinstance(check_tests, list) else [t for group in check_tests.values() for t in group]
    return list(dict.fromkeys(ids))


_DJANGO_ID = re.compile(r"^(\w+) \(([\w.]+)\)$")


def _only(found: list[str]) -> str:
    return found[0] if len(found) == 1 else ("ambiguous" if found else "not run")


def status_of(test: str, outcomes: dict[str, str]) -> str:
    """The reported status of an expected test, however the benchmark spells its id: the runner's
    own id; Django's `name (module.Class)`; a bare name that exactly one reported id ends with
    (after `::` or `.`); or the start of exactly one reported id (SWE-bench's lists cut some
    parametrised ids at a space). `not run` when none matches, `ambiguous` when several do."""
    if test in outcomes:
        return outcomes[test]
    django = _DJANGO_ID.match(test.strip())
    if django:
        name, owner = django.groups()
        return outcomes.get(owner if owner.endswith("." + name) else f"{owner}.{name}", "not run")
    if re.fullmatch(r"[\w\[\]-]+", test):
        return _only([status for reported, status in outcomes.items() if re.split(r"::|\.", reported)[-1] == test])
    return _only([status for reported, status in outcomes.items() if reported.startswith(test)])


def decide(expected: list[str], run: CheckRun) -> Verdict:
    """Passed only when the runner finished, was not tampered with, and reported every expected
    test as passed (xfail counts, as in SWE-bench's harness); anything else names why not."""
    if run.exit_status is None:
        return Verdict(False, "the check timed out")
    if run.tampered:
        return Verdict(False, "the test runner's assertion or reporting functions were replaced during the run: "
                              + ", ".join(run.tampered[:5]))
    if not expected:
        return Verdict(False, "the task names no expected tests, so no report can show it solved")
    if not run.finished:
        return Verdict(False, "the test runner never reported the end of its run (exit status "
                              f"{run.exit_status}, {len(run.outcomes)} test outcomes reported)")
    statuses = {t: status_of(t, run.outcomes) for t in expected}
    missing = [t for t, status in statuses.items() if status not in PASSED]
    if missing:
        shown = ", ".join(f"{t} ({statuses[t]})" for t in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        return Verdict(False, f"{len(missing)} of {len(expected)} expected tests did not pass: {shown}{more}", missing)
    return Verdict(True, f"all {len(expected)} expected tests passed")


# 1. stopping the attempt ---------------------------------------------------------------------

def stop_attempt(ctx: Any) -> SandboxUser:
    """Close the attempt's sessions and kill every process of its uid; the sandbox user (made
    now if the attempt never ran code) is what the check runs as."""
    user = SandboxUser.for_context(ctx)
    for name, resource in list(ctx.resources.items()):
        if resource is user or not callable(getattr(resource, "close", None)):
            continue
        try:
            resource.close()
        except Exception:  # a session that fails to close is killed below with the rest
            pass
        ctx.resources.pop(name, None)
    user.kill_all()
    return user


# 2. restoring the grader's files -------------------------------------------------------------

def _parts(relative: str) -> tuple[str, ...]:
    path = PurePosixPath(relative)
    if path.is_absolute() or not path.parts or any(p in ("", ".", "..") for p in path.parts):
        raise ValueError(f"check file {relative!r} is not a plain relative path")
    return path.parts


def _remove_entry(dirfd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dirfd)
    else:
        os.unlink(name, dir_fd=dirfd)


def _enter(dirfd: int, name: str, user: SandboxUser | None) -> int:
    """A descriptor of the real directory `name` under `dirfd`, made if absent; a link or
    anything else in its place is removed first."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dirfd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        _remove_entry(dirfd, name)
    os.mkdir(name, 0o755, dir_fd=dirfd)
    fd = os.open(name, flags, dir_fd=dirfd)
    if user is not None and user.dedicated:
        os.fchown(fd, user.uid, user.gid)
    return fd


def _replace_file(dirfd: int, name: str, data: bytes, user: SandboxUser | None) -> None:
    """Write a new file beside `name` and rename it over whatever is there: a rename replaces
    a link (or a hard link to another file) instead of writing through it."""
    st = None
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    if st is not None and stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dirfd)
    temporary = f".{name[:100]}.toolself-{secrets.token_hex(6)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                 dir_fd=dirfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if user is not None and user.dedicated:
            os.fchown(fd, user.uid, user.gid)
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.rename(temporary, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)


def restore_files(workspace: Path | int, files: dict[str, str | bytes], user: SandboxUser | None = None) -> None:
    """Put the grader's copy of each file in place, never following a link (see the module).
    `workspace`: a descriptor of it (the context's, taken before the attempt ran) or its path."""
    if isinstance(workspace, int):
        root = os.dup(workspace)
    else:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for relative, content in files.items():
            parts = _parts(relative)
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            dirfd = os.dup(root)
            try:
                for part in parts[:-1]:
                    inner = _enter(dirfd, part, user)
                    os.close(dirfd)
                    dirfd = inner
                _replace_file(dirfd, parts[-1], data, user)
            finally:
                os.close(dirfd)
    finally:
        os.close(root)


# 3. running the command ----------------------------------------------------------------------

_REPORTER: dict[str, str] = {}
_REPORTER_LOCK = threading.Lock()


def reporter_folder() -> str:
    """A private, host-owned, world-readable folder holding the reporter and a `sitecustomize`
    that loads it; made once per host process (never reused from a shared temporary folder,
    where another user could have planted one); see `leases.host_folder`."""
    with _REPORTER_LOCK:
        folder = _REPORTER.get("folder")
        if folder is None:
            folder = host_folder("toolself-check-")
            source = resources.files("toolself.evals").joinpath("check_report.py").read_text(encoding="utf-8")
            files = {"toolself_check_report.py": source, "sitecustomize.py": "import toolself_check_report\n"}
            for name, text in files.items():
                with open(os.path.join(folder, name), "x", encoding="utf-8") as handle:
                    handle.write(text)
                os.chmod(os.path.join(folder, name), 0o644)
            _REPORTER["folder"] = folder
        return folder


def _bash() -> str:
    return shutil.which("bash", path="/usr/bin:/bin:/usr/local/bin") or "/bin/bash"


def check_env(user: SandboxUser, limits: Limits, report_fd: int, command: str) -> dict[str, str]:
    env = scrubbed_env(user.workspace, user.interpreter, {
        "PYTHONNOUSERSITE": "1",  # HOME is the workspace: no .pth files from ~/.local
        "TOOLSELF_CHECK_REPORT_FD": str(report_fd),
        "TOOLSELF_RLIMITS": json.dumps(rlimits(limits, user)),
        "PYTEST_PLUGINS": "toolself_check_report",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        **({"TOOLSELF_CHECK_PYTEST": "1"} if "pytest" in command else {}),
        **({} if limits.network else {"TOOLSELF_NO_NETWORK": "1"}),
    })
    env["PYTHONPATH"] = os.pathsep.join(p for p in (reporter_folder(), env.get("PYTHONPATH", "")) if p)
    return env


def _pump(fd: int, sink: Any) -> threading.Thread:
    def run() -> None:
        try:
            while data := os.read(fd, 1 << 16):
                sink(data)
        except OSError:
            pass
        finally:
            os.close(fd)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether the child exited within `timeout`, without reaping it: until it is reaped its
    pid and process group cannot be reused by an unrelated process."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None and info.si_pid:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def run_command(command: str, user: SandboxUser, limits: Limits, timeout: float) -> CheckRun:
    """Run `command` with bash in the workspace as the sandbox user and collect its report."""
    report_r, report_w = os.pipe()
    out_r, out_w = os.pipe()
    env = check_env(user, limits, report_w, command)
    launcher = LIMITS_PRELUDE + "os.execv(%r, ['bash', '--noprofile', '--norc', '-c', %r])" % (_bash(), command)
    start = time.perf_counter()
    try:
        proc = subprocess.Popen([user.interpreter.executable, "-S", "-c", launcher], stdin=subprocess.DEVNULL,
                                stdout=out_w, stderr=out_w, pass_fds=(report_w,), cwd=user.workspace, env=env,
                                start_new_session=True, **user.popen_identity())
    except BaseException:
        os.close(report_r)
        os.close(out_r)
        raise
    finally:
        os.close(report_w)
        os.close(out_w)
    output = Capture(OUTPUT_CHARS)
    log = bytearray()
    report = bytearray()

    def keep(buffer: bytearray, cap: int):
        def add(data: bytes) -> None:
            if len(buffer) < cap:
                buffer.extend(data[: cap - len(buffer)])
        return add

    def keep_output(data: bytes) -> None:
        output.add(data)
        keep_log(data)

    keep_log = keep(log, LOG_CAP_BYTES)
    readers = [_pump(out_r, keep_output), _pump(report_r, keep(report, REPORT_CAP_BYTES))]
    finished = _exited(proc, timeout)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever the check left running goes too
    except (ProcessLookupError, PermissionError):
        pass
    kill_pids(lambda: descendants(proc.pid, proc.pid))
    user.kill_all()
    code = proc.wait()
    for reader in readers:
        reader.join(2.0)
    run = CheckRun(code if finished else None, output.text(), time.perf_counter() - start,
                   log=log.decode("utf-8", errors="replace"))
    _read_report(bytes(report), run)
    return run


def _read_report(data: bytes, run: CheckRun) -> None:
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        run.report_lines += 1
        if record.get("event") == "end":
            run.finished = True
        elif record.get("event") == "tampered":
            run.tampered += [str(n) for n in record.get("names") or []]
        elif isinstance(record.get("id"), str) and isinstance(record.get("outcome"), str):
            test, outcome = record["id"], record["outcome"]
            if run.outcomes.get(test, "passed") in PASSED:  # a failure in any phase is final
                run.outcomes[test] = outcome


def check_attempt(ctx: Any, command: str, files: dict[str, str | bytes], expected: list[str],
                  timeout: float, limits: Limits | None = None) -> tuple[Verdict, CheckRun]:
    """Stop the attempt, restore the grader's files, run the command in its sandbox, decide."""
    user = stop_attempt(ctx)
    restore_files(ctx.root_fd if hasattr(ctx, "root_fd") else Path(ctx.workspace), files, user)
    run = run_command(command, user, limits or limits_for(ctx), timeout)
    return decide(expected, run), run
