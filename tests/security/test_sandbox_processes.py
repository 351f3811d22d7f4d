"""What an attempt's processes can take and how long they live (findings 6, 8 and 9 of issue 25).

The memory and process budgets hold for the attempt as a whole, not per process; no process
of an attempt outlives a call's timeout, the attempt's close, or a host killed with SIGKILL
(nor do the folders such a host made for its sandboxes); and an attempt started without a
network cannot reach the host's Unix sockets either.
Tests that need a uid of the attempt's own need a root host (CI runs as root).
"""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.cgroups import hierarchies
from toolself.tools.code import code_interpreter
from toolself.tools.sandbox import processes, with_limits
from toolself.tools.shell import execute_bash

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs a root host, which gives each attempt a uid of its own")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["cgroup", "no cgroup"])
def ctx(request, monkeypatch):
    """An attempt with a control group where the machine offers one, and one without (the fallback)."""
    if request.param == "cgroup" and not hierarchies():
        pytest.skip("this machine offers no control group with memory and pids controllers to this user")
    if request.param == "no cgroup":
        monkeypatch.setenv("TOOLSELF_SANDBOX_CGROUP", "none")
    context = ToolContext.temporary()
    with_limits(context, timeout_s=3, memory_bytes=512 << 20, processes=64)
    yield context
    context.close()


def py(ctx, code):
    return code_interpreter({"code": code}, ctx)


def sh(ctx, command):
    return execute_bash({"command": command}, ctx)


def alive(pid: int) -> bool:
    return any(p.pid == pid and p.state != "Z" for p in processes())


HOLDERS = """import os, time
for i in range(3):
    if os.fork() == 0:
        block = bytearray(256 << 20)
        for at in range(0, len(block), 4096):
            block[at] = 1
        time.sleep(1.5)
        open(f"held-{i}", "w").close()
        os._exit(0)
for _ in range(3):
    os.wait()
"""


def test_three_forked_children_cannot_each_hold_half_the_attempts_memory(ctx):
    """Three children of 256 MiB each under a limit of 512 MiB (per process, the old limit
    let each of them hold it): at least one of them does not get to keep its memory."""
    obs = py(ctx, HOLDERS)
    held = sorted(p.name for p in ctx.workspace.glob("held-*"))
    assert len(held) < 3, "all three children held 256 MiB under a 512 MiB limit"
    assert "memory limit of 512 MiB" in obs.content or "more than 512 MiB" in obs.content, obs.content
    assert "[value]\n'after'" in py(ctx, "'after'").content


@needs_root
def test_the_process_limit_counts_the_python_and_the_shell_sessions_together(ctx):
    sh(ctx, "for i in $(seq 25); do sleep 1000 & done")
    obs = py(ctx, "import subprocess\nkids = [subprocess.Popen(['sleep', '1000']) for _ in range(40)]")
    assert obs.is_error and ("limit of 64 processes" in obs.content or "BlockingIOError" in obs.content)


DAEMON = "setsid sh -c 'echo $$ > daemon.pid; exec sleep 1000' > /dev/null 2>&1 < /dev/null &"


@needs_root
def test_a_setsid_daemon_does_not_outlive_the_timeout_of_the_call_that_started_it(ctx):
    py(ctx, "kept = 'python session untouched'")
    obs = sh(ctx, DAEMON + " sleep 100")
    assert obs.is_error and "timed out" in obs.content
    daemon = int((ctx.workspace / "daemon.pid").read_text())
    assert not alive(daemon)
    assert py(ctx, "kept").content == "[value]\n'python session untouched'"


DOUBLE_FORK = """import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("daemon.pid", "w").write(str(os.getpid()))
        time.sleep(1000)
    os._exit(0)
time.sleep(0.5)
"""


@needs_root
def test_a_double_forked_daemon_of_the_python_session_does_not_outlive_close(ctx):
    py(ctx, DOUBLE_FORK)
    daemon = int((ctx.workspace / "daemon.pid").read_text())
    uid = ctx.resources["sandbox_user"].uid
    assert alive(daemon)
    ctx.close()
    assert not alive(daemon)
    assert not [p.pid for p in processes() if p.uid == uid and p.state != "Z"]


HOST = f"""import sys, time
from toolself.tools.base import ToolContext
from toolself.tools.shell import execute_bash
ctx = ToolContext.temporary()
execute_bash({{"command": {DAEMON!r} + " sleep 0.5"}}, ctx)
print(ctx.workspace, ctx.resources["sandbox_user"].uid, flush=True)
time.sleep(1000)
"""


HOST_WITH_A_FOLDER = """
import os, signal, sys, time
from toolself.tools.leases import host_folder
print(host_folder("toolself-python-"), flush=True)
if sys.argv[1] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(1000)
"""


def test_the_folders_of_a_host_killed_with_sigkill_go_when_the_next_host_makes_its_own():
    from toolself.tools.leases import host_folder

    hosts = {how: subprocess.Popen([sys.executable, "-c", HOST_WITH_A_FOLDER, how], stdout=subprocess.PIPE, text=True,
                                   cwd=Path(__file__).resolve().parents[2]) for how in ("killed", "alive")}
    left, live = (Path(hosts[how].stdout.readline().strip()) for how in ("killed", "alive"))
    assert hosts["killed"].wait(timeout=60) == -signal.SIGKILL
    mine = None
    try:
        assert left.is_dir()  # nothing ran at its exit
        mine = Path(host_folder("toolself-python-"))
        assert not left.exists() and live.is_dir() and mine.is_dir()
    finally:
        hosts["alive"].kill()
        hosts["alive"].wait()
        for folder in (left, live, mine):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_processes_left_by_a_host_killed_with_sigkill_are_reaped_when_the_next_sandbox_starts():
    host = subprocess.Popen([sys.executable, "-c", HOST], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    workspace, uid = host.stdout.readline().split()
    daemon = int(Path(workspace, "daemon.pid").read_text())
    host.send_signal(signal.SIGKILL)
    host.wait()
    try:
        assert alive(daemon), "the daemon should have survived its host, or this test shows nothing"
        nxt = ToolContext.temporary()
        try:
            sh(nxt, "true")
        finally:
            nxt.close()
        assert not alive(daemon)
        assert not [p.pid for p in processes() if p.uid == int(uid) and p.state != "Z"]
    finally:
        if alive(daemon):
            os.kill(daemon, signal.SIGKILL)
        folder = Path(workspace).parent  # the dead host's own folder of workspaces, which it could not remove
        shutil.rmtree(folder if folder.name.startswith("toolself-") else workspace, ignore_errors=True)


@pytest.fixture
def host_unix_socket():
    """A Unix socket of the host that anyone may connect to (mode 0777, folder 0755)."""
    folder = Path(tempfile.mkdtemp(prefix="toolself-sock-"))
    folder.chmod(0o755)
    path = folder / "service.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(8)
    server.setblocking(False)
    yield path, server
    server.close()
    shutil.rmtree(folder)


CONNECT_UNIX = """import socket
try:
    socket.socket(socket.AF_UNIX).connect({path!r})
    print("connected")
except OSError as e:
    print("refused:", e)
"""


def no_network_context() -> ToolContext:
    context = ToolContext.temporary()
    with_limits(context, timeout_s=10, network=False)
    return context


def test_without_network_a_host_unix_socket_cannot_be_reached(host_unix_socket):
    path, server = host_unix_socket
    context = no_network_context()
    try:
        obs = py(context, CONNECT_UNIX.format(path=str(path)))
        if "cannot cut the network off" in obs.content:
            pytest.skip("this kernel does not allow a user and network namespace here")
        assert obs.content.startswith("refused:"), obs.content
        shell = sh(context, "python -c " + shlex.quote(CONNECT_UNIX.format(path=str(path))))
        assert shell.content.startswith("refused:"), shell.content
        with pytest.raises(BlockingIOError):
            server.accept()
        assert py(context, "import socket; len(socket.socketpair())").content == "[value]\n2"
    finally:
        context.close()


def test_with_network_the_same_unix_socket_is_reached(host_unix_socket):
    """The counterpart: the socket above is reachable from the sandbox, so its refusal is the filter's doing."""
    path, server = host_unix_socket
    context = ToolContext.temporary()
    try:
        assert py(context, CONNECT_UNIX.format(path=str(path))).content == "connected"
        time.sleep(0.1)
        server.accept()[0].close()
    finally:
        context.close()
