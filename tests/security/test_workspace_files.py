"""What the host-side file tools do with the files an attempt leaves them (findings 7 and 12 of issue 25).

The editor and `file_analyzer` run in the host process with its rights. A named pipe must not
stall them, a device or socket is not read, a host file hard-linked into the workspace is
neither read nor written, and an edit never changes bytes the model did not touch.
"""

import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from toolself.tools.editor import str_replace_editor
from toolself.tools.files import MAX_BYTES, file_analyzer
from toolself.tools.shell import execute_bash
from toolself.tools.workspace import Workspace

pytestmark = pytest.mark.timeout(60)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the attempt has a uid of its own only on a root host")
LATIN1 = "caf\xe9 = 1\nna\xefve = 2\n".encode("latin-1")


@pytest.fixture
def sandbox_timeout():
    return 10


def edit(ctx, **arguments):
    return str_replace_editor(arguments, ctx)


def analyze(ctx, path):
    return file_analyzer({"path": path}, ctx)


def every_call(path):
    return [("view", {"command": "view", "path": path}),
            ("create", {"command": "create", "path": path, "file_text": "x\n"}),
            ("str_replace", {"command": "str_replace", "path": path, "old_str": "a", "new_str": "b"}),
            ("insert", {"command": "insert", "path": path, "insert_line": 0, "new_str": "x"})]


def test_a_named_pipe_is_refused_at_once_by_every_tool(ctx):
    os.mkfifo(ctx.workspace / "pipe")
    for name, arguments in every_call("pipe"):
        started = time.monotonic()
        obs = str_replace_editor(arguments, ctx)
        assert obs.is_error and "named pipe" in obs.content, name
        assert time.monotonic() - started < 2, name
    assert analyze(ctx, "pipe").is_error
    assert stat.S_ISFIFO((ctx.workspace / "pipe").lstat().st_mode)


def test_a_file_swapped_for_a_pipe_after_the_check_is_refused_without_waiting(ctx):
    (ctx.workspace / "data.txt").write_text("a\n")
    ws = Workspace.of(ctx)
    loc = ws.locate("data.txt")
    (ctx.workspace / "data.txt").unlink()
    os.mkfifo(ctx.workspace / "data.txt")
    started = time.monotonic()
    with pytest.raises(Exception, match="named pipe"):
        ws.read_bytes(loc, 1 << 20)
    with pytest.raises(Exception, match="not a regular file"):
        ws.write_bytes(loc, b"x")
    assert time.monotonic() - started < 2


def test_a_socket_is_refused(ctx):
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(ctx.workspace / "sock"))
        for name, arguments in every_call("sock"):
            obs = str_replace_editor(arguments, ctx)
            assert obs.is_error and "socket" in obs.content, name
        assert analyze(ctx, "sock").is_error
    finally:
        server.close()


@needs_root
def test_a_device_is_refused(ctx):
    try:
        os.mknod(ctx.workspace / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("this machine does not allow making device nodes")
    for name, arguments in every_call("zero"):
        obs = str_replace_editor(arguments, ctx)
        assert obs.is_error and "device" in obs.content, name
    assert analyze(ctx, "zero").is_error


@needs_root
def test_a_host_file_hard_linked_into_the_workspace_is_neither_read_nor_written_nor_handed_over(ctx):
    """Possible where fs.protected_hardlinks is off; played here by linking as root."""
    host = Path(tempfile.mkdtemp(prefix="toolself-host-"))
    try:
        secret = host / "secret.txt"
        secret.write_text("root only\n")
        secret.chmod(0o600)
        os.link(secret, ctx.workspace / "linked.txt")  # before the attempt's uid exists
        execute_bash({"command": "true"}, ctx)
        assert secret.stat().st_uid == 0
        os.link(secret, ctx.workspace / "later.txt")
        for path in ("linked.txt", "later.txt"):
            for name, arguments in every_call(path):
                obs = str_replace_editor(arguments, ctx)
                assert obs.is_error and "root only" not in obs.content, (path, name)
            assert "root only" not in analyze(ctx, path).content
        ctx.close()
        assert secret.read_text() == "root only\n"
        st = secret.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    finally:
        shutil.rmtree(host)


def test_str_replace_refuses_a_file_that_is_not_utf8_and_leaves_it_byte_for_byte(ctx):
    (ctx.workspace / "legacy.py").write_bytes(LATIN1)
    for arguments in ({"command": "str_replace", "path": "legacy.py", "old_str": "= 1", "new_str": "= 3"},
                      {"command": "insert", "path": "legacy.py", "insert_line": 0, "new_str": "# header"}):
        obs = edit(ctx, **arguments)
        assert obs.is_error and "not UTF-8" in obs.content and "execute_bash" in obs.content
    assert (ctx.workspace / "legacy.py").read_bytes() == LATIN1


def test_view_shows_a_file_that_is_not_utf8_and_says_it_will_not_be_edited(ctx):
    (ctx.workspace / "legacy.py").write_bytes(LATIN1)
    obs = edit(ctx, command="view", path="legacy.py")
    assert not obs.is_error and "caf\ufffd = 1" in obs.content and "will not edit" in obs.content


def test_an_edit_keeps_every_byte_it_did_not_touch(ctx):
    original = "\ufeffa = 1\r\nb = '\u00e9\u4e2d\U0001f600'\r\n\x0cc = 3".encode("utf-8")
    (ctx.workspace / "m.py").write_bytes(original)
    assert not edit(ctx, command="str_replace", path="m.py", old_str="a = 1", new_str="a = 2").is_error
    assert (ctx.workspace / "m.py").read_bytes() == original.replace(b"a = 1", b"a = 2")
    assert not edit(ctx, command="undo_edit", path="m.py").is_error
    assert (ctx.workspace / "m.py").read_bytes() == original


def test_undo_of_create_restores_the_exact_bytes_it_overwrote(ctx):
    (ctx.workspace / "legacy.py").write_bytes(LATIN1)
    assert not edit(ctx, command="create", path="legacy.py", file_text="new = 1\n").is_error
    assert not edit(ctx, command="undo_edit", path="legacy.py").is_error
    assert (ctx.workspace / "legacy.py").read_bytes() == LATIN1


def test_file_analyzer_reads_files_up_to_50_mb_as_documented(ctx):
    assert MAX_BYTES == 50 * 1024 * 1024
    with open(ctx.workspace / "big.txt", "wb") as handle:
        handle.write(b"row of data\n" * (30 * 1024 * 1024 // 12))
    obs = analyze(ctx, "big.txt")
    assert not obs.is_error and "row of data" in obs.content
    with open(ctx.workspace / "huge.txt", "wb") as handle:
        handle.truncate(MAX_BYTES + 1)
    obs = analyze(ctx, "huge.txt")
    assert obs.is_error and "up to 50 MB" in obs.content
