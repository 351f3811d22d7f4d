"""What a hostile or careless tool call can do, and what it cannot.

Each case ends in a clear error observation, the next call works, and the host and the other
attempts' workspaces are untouched. Write containment needs the host to run as root (the
sandbox then gives each attempt its own unprivileged uid); without root it is not claimed
(see docs/security.md) and those tests are skipped.
"""

import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.code import code_interpreter
from toolself.tools.editor import str_replace_editor
from toolself.tools.sandbox import processes, with_limits
from toolself.tools.shell import execute_bash

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="write containment needs a root host that can give attempts their own uid")


@pytest.fixture
def ctx():
    context = ToolContext.temporary()
    with_limits(context, timeout_s=2, processes=64, memory_bytes=2 << 30)
    yield context
    context.close()


@pytest.fixture
def host_dir():
    """A folder of the host next to the workspaces, as most host folders are: readable, not writable by others."""
    path = Path(tempfile.mkdtemp(prefix="toolself-host-"))
    path.chmod(0o755)
    (path / "precious.txt").write_text("original\n")
    (path / "precious.txt").chmod(0o644)
    yield path
    shutil.rmtree(path)


def py(ctx, code):
    return code_interpreter({"code": code}, ctx)


def sh(ctx, command):
    return execute_bash({"command": command}, ctx)


def alive(pids):
    table = {p.pid: p for p in processes()}
    return [pid for pid in pids if pid in table and table[pid].state != "Z"]


def test_infinite_loop_in_python_times_out_and_the_session_restarts(ctx):
    obs = py(ctx, "while True:\n    pass")
    assert obs.is_error and "timed out after 2 s" in obs.content and "state was lost" in obs.content
    assert py(ctx, "2 + 2").content.startswith("[value]\n4")


def test_infinite_loop_in_bash_times_out_and_kills_its_children(ctx):
    sh(ctx, "true")
    pgid = ctx.resources["bash"].process.proc.pid
    obs = sh(ctx, "sleep 1000 & while :; do :; done")
    assert obs.is_error and "timed out" in obs.content
    assert not alive([p.pid for p in processes() if p.pgrp == pgid])
    assert sh(ctx, "echo alive").content.startswith("alive")


def test_ten_gigabyte_allocation_fails_inside_the_session(ctx):
    py(ctx, "kept = 'still here'")
    obs = py(ctx, "block = bytearray(10 * 1024 ** 3)")
    assert obs.is_error and "MemoryError" in obs.content
    assert py(ctx, "kept").content == "[value]\n'still here'"
    bash = sh(ctx, "python -c 'bytearray(10 * 1024 ** 3)'")
    assert bash.is_error and "MemoryError" in bash.content
    assert sh(ctx, "echo ok").content == "ok"


def test_fifty_megabytes_of_output_are_cut_with_a_note(ctx):
    obs = py(ctx, "print('x' * 50_000_000)")
    assert len(obs.content) < 20_000 and "bytes of output cut (50,000,001 in all)" in obs.content
    out = sh(ctx, "head -c 50000000 /dev/zero | tr '\\0' y")
    assert len(out.content) < 20_000 and "bytes of output cut (50,000,000 in all)" in out.content
    assert sh(ctx, "echo next").content == "next"


def test_fork_bomb_in_bash_is_stopped_and_reaped(ctx):
    sh(ctx, "true")
    bomb_group = ctx.resources["bash"].process.proc.pid
    user = ctx.resources["sandbox_user"]
    first_uid = user.uid
    bomb = sh(ctx, ":(){ :|:& };:")
    after = sh(ctx, "sleep 1; echo recovered")  # runs in the bomb's shell or, if caught first, a fresh one
    if ROOT:
        assert "limit of 64 processes" in bomb.content + after.content
        assert sh(ctx, "echo again").content.startswith("again")
    ctx.close()
    assert not alive([p.pid for p in processes() if p.pgrp == bomb_group])
    if ROOT:
        assert not alive([p.pid for p in processes() if p.uid in (first_uid, user.uid)])


def test_fork_loop_in_python_hits_the_process_limit(ctx):
    obs = py(ctx, "import os\nwhile True:\n    os.fork()")
    assert obs.is_error and ("BlockingIOError" in obs.content or "limit" in obs.content)
    assert "[value]\n3" in py(ctx, "1 + 2").content


@needs_root
def test_the_process_limit_is_asked_of_the_kernel_when_proc_shows_fewer(ctx, monkeypatch):
    sh(ctx, "for i in $(seq 20); do sleep 1000 & done")
    user = ctx.resources["sandbox_user"]
    assert len(user.members()) >= 21
    assert not user.at_process_limit(64)
    assert user.at_process_limit(22)  # 21 processes and the probe itself: the kernel refuses a 23rd
    monkeypatch.setattr(user, "members", lambda include_zombies=False: list(range(10)))  # hidden from /proc
    assert user.at_process_limit(22) and not user.at_process_limit(64)


@needs_root
def test_attempts_run_under_their_own_unprivileged_uid(ctx):
    uid = int(sh(ctx, "id -u").content)
    assert uid != 0 and uid == ctx.resources["sandbox_user"].uid
    assert py(ctx, "import os; os.getuid()").content == f"[value]\n{uid}"


@needs_root
def test_python_cannot_write_outside_the_workspace(ctx, host_dir):
    obs = py(ctx, f"open({str(host_dir / 'precious.txt')!r}, 'w').write('pwned')")
    assert obs.is_error and "PermissionError" in obs.content
    assert "PermissionError" in py(ctx, f"open({str(host_dir / 'new.txt')!r}, 'w')").content
    assert "PermissionError" in py(ctx, "open('/etc/toolself-test', 'w')").content
    assert (host_dir / "precious.txt").read_text() == "original\n"
    assert not (host_dir / "new.txt").exists() and not Path("/etc/toolself-test").exists()
    assert not py(ctx, "open('inside.txt', 'w').write('fine')").is_error


@needs_root
def test_bash_cannot_write_outside_the_workspace(ctx, host_dir):
    obs = sh(ctx, f"echo pwned > {host_dir}/precious.txt; touch {host_dir}/new.txt; rm -f {host_dir}/precious.txt")
    assert obs.is_error and "Permission denied" in obs.content
    assert (host_dir / "precious.txt").read_text() == "original\n"
    assert not (host_dir / "new.txt").exists()
    assert sh(ctx, "echo fine > inside.txt && cat inside.txt").content == "fine"


@needs_root
def test_other_attempts_workspaces_are_neither_readable_nor_writable(ctx):
    other = ToolContext.temporary()
    try:
        str_replace_editor({"command": "create", "path": "secret.txt", "file_text": "other task\n"}, other)
        sh(other, "echo also-mine > shell-made.txt")  # the other attempt has its own sandbox user now
        target = other.workspace.resolve()
        assert sh(ctx, f"cat {target}/secret.txt").is_error
        assert sh(ctx, f"echo pwned > {target}/secret.txt").is_error
        assert "PermissionError" in py(ctx, f"open({str(target / 'shell-made.txt')!r}, 'a').write('x')").content
        assert (target / "secret.txt").read_text() == "other task\n"
        assert (target / "shell-made.txt").read_text() == "also-mine\n"
    finally:
        other.close()


@needs_root
def test_processes_that_leave_the_group_are_killed_at_the_end(ctx):
    sh(ctx, "setsid sleep 1000 > /dev/null 2>&1 & disown")
    uid = ctx.resources["sandbox_user"].uid
    assert any(p.uid == uid and p.state != "Z" for p in processes())
    ctx.close()
    assert not alive([p.pid for p in processes() if p.uid == uid])


@needs_root
def test_workspace_is_given_back_to_its_owner_at_the_end(ctx):
    sh(ctx, "echo x > made-by-sandbox.txt")
    ws = Path(tempfile.mkdtemp(prefix="toolself-keep-"))
    ws.chmod(0o751)
    mode = stat.S_IMODE(ws.stat().st_mode)
    kept = ToolContext(workspace=ws)
    try:
        sh(kept, "echo x > f.txt")
        assert (ws / "f.txt").stat().st_uid != 0
        kept.close()
        assert (ws / "f.txt").stat().st_uid == 0 and ws.stat().st_uid == 0
        assert stat.S_IMODE(ws.stat().st_mode) == mode
    finally:
        shutil.rmtree(ws)


def test_editor_files_are_writable_by_the_sandboxed_code(ctx):
    sh(ctx, "true")
    str_replace_editor({"command": "create", "path": "dir/made.py", "file_text": "x = 1\n"}, ctx)
    assert not sh(ctx, "echo 'y = 2' >> dir/made.py && touch dir/other.py").is_error
    assert (ctx.workspace / "dir" / "made.py").read_text() == "x = 1\ny = 2\n"


@needs_root
def test_unreachable_workspace_falls_back_to_root_with_a_warning(tmp_path, caplog):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    context = ToolContext(workspace=private / "ws")
    try:
        assert sh(context, "id -u").content == "0"
        assert not context.resources["sandbox_user"].dedicated
        assert "not contained" in caplog.text and str(private) in caplog.text
    finally:
        context.close()


def test_sandbox_user_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TOOLSELF_SANDBOX_USER", "none")
    context = ToolContext.temporary()
    try:
        assert sh(context, "id -u").content == str(os.geteuid())
    finally:
        context.close()


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


CONNECT = """import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    print("connected")
except OSError as e:
    print(e)
"""


def test_network_is_reachable_by_default(ctx, listener):
    assert "connected" in py(ctx, CONNECT.format(port=listener)).content


def test_network_can_be_cut_off(listener):
    context = ToolContext.temporary()
    with_limits(context, network=False)
    try:
        obs = py(context, CONNECT.format(port=listener))
        if "cannot cut the network off" in obs.content:
            pytest.skip("this kernel does not allow a user and network namespace here")
        assert "connected" not in obs.content and "unreachable" in obs.content.lower()
        assert "connected" not in sh(context, f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected").content
        assert sh(context, "echo still works > f.txt && cat f.txt").content == "still works"
    finally:
        context.close()
