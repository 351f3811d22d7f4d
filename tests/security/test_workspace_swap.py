"""Workspaces the attempt cannot swap for a link to a host folder (finding 3 of issue 25).

The attack: from the shell tool, `mv $WS $WS.moved && ln -s /victim $WS`, then let the
host-side tools (the editor, `file_analyzer`, closing the attempt) work on "the workspace".
Workspaces toolself makes sit in a folder the attempt's uid cannot change, so the move
fails; a workspace a caller put in a shared folder can be swapped, and then the host still
works through the descriptor it took before the attempt ran, so nothing outside changes.
"""

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from toolself.evals.task import Task
from toolself.tools.base import ToolContext
from toolself.tools.editor import str_replace_editor
from toolself.tools.files import file_analyzer
from toolself.tools.sandbox import with_limits
from toolself.tools.shell import execute_bash
from toolself.tools.workspace import make_workspace

pytestmark = pytest.mark.timeout(60)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the attempt has a uid of its own only on a root host")
SWAP = 'cd / && mv "{ws}" "{ws}.moved" && ln -s "{victim}" "{ws}" && echo swapped'


@pytest.fixture
def victim():
    """A host folder the attempt must never reach: a root-only secret and a file of another user."""
    path = Path(tempfile.mkdtemp(prefix="toolself-victim-"))
    path.chmod(0o755)
    (path / "secret.txt").write_text("root only\n")
    (path / "secret.txt").chmod(0o600)
    (path / "notes.txt").write_text("x = 1\n")
    (path / "notes.txt").chmod(0o644)
    if ROOT:
        os.chown(path / "notes.txt", 4321, 4321)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def shared():
    """A folder every user may write, with the sticky bit, as /tmp is."""
    path = Path(tempfile.mkdtemp(prefix="toolself-shared-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def state(folder: Path) -> dict[str, tuple[int, int, int, bytes]]:
    out = {}
    for path in [folder, *folder.iterdir()]:
        st = path.lstat()
        out[path.name] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), path.read_bytes() if path.is_file() else b"")
    return out


def sh(ctx, command):
    return execute_bash({"command": command}, ctx)


def edit(ctx, **arguments):
    return str_replace_editor(arguments, ctx)


def test_a_temporary_workspace_sits_in_a_folder_only_the_host_can_change():
    ctx = ToolContext.temporary()
    try:
        parent = ctx.workspace.parent.stat()
        assert parent.st_uid == os.geteuid()
        assert stat.S_IMODE(parent.st_mode) == 0o711
        assert ctx.workspace.parent != Path(tempfile.gettempdir())
        assert stat.S_IMODE(ctx.workspace.stat().st_mode) == 0o700
    finally:
        ctx.close()
    assert not ctx.workspace.exists()


def test_a_task_environment_without_a_root_is_made_the_same_way():
    """The expert teacher's path: `task.environment()` with no root."""
    ctx = ToolContext.temporary()
    try:
        with Task(id="t/1", question="q").environment() as env:
            assert env.workspace.parent == ctx.workspace.parent.resolve()
    finally:
        ctx.close()


def test_a_shared_folder_gets_a_private_folder_of_the_host_for_its_workspaces(shared):
    with Task(id="t", question="q").environment(root=shared) as env:
        assert env.workspace.parent.parent == shared.resolve()
        parent = env.workspace.parent.stat()
        assert parent.st_uid == os.geteuid() and stat.S_IMODE(parent.st_mode) == 0o711


def test_a_folder_only_its_owner_writes_holds_workspaces_as_it_is(tmp_path):
    runs = tmp_path / "run" / "workspaces"
    assert make_workspace(runs).parent == runs.resolve()


def test_no_workspace_is_kept_under_a_folder_anyone_may_rename_in(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(ValueError, match="without the sticky bit"):
        make_workspace(open_folder / "workspaces")


@needs_root
def test_the_attempt_cannot_move_its_workspace_aside(victim):
    ctx = ToolContext.temporary()
    with_limits(ctx, timeout_s=10)
    try:
        obs = sh(ctx, SWAP.format(ws=ctx.workspace, victim=victim))
        assert "swapped" not in obs.content and "Permission denied" in obs.content
        assert ctx.workspace.is_dir() and not ctx.workspace.is_symlink()
    finally:
        ctx.close()


@needs_root
def test_a_caller_workspace_swapped_for_a_link_leads_no_host_side_tool_out(shared, victim):
    """The workspace of `toolself run --workspace` in a shared folder: the attempt owns it and
    can swap it; the editor, file_analyzer and close still touch only the real one."""
    ws = shared / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("x = 1\n")
    before = state(victim)
    ctx = ToolContext(workspace=ws)
    with_limits(ctx, timeout_s=10)
    try:
        assert "swapped" in sh(ctx, SWAP.format(ws=ws, victim=victim)).content
        assert ws.is_symlink()
        seen = edit(ctx, command="view", path="secret.txt")
        assert "root only" not in seen.content and seen.is_error
        assert "root only" not in file_analyzer({"path": "secret.txt"}, ctx).content
        assert "x = 1" in edit(ctx, command="view", path="notes.txt").content  # the real workspace's own file
        assert not edit(ctx, command="str_replace", path="notes.txt", old_str="x = 1", new_str="x = 2").is_error
        assert not edit(ctx, command="create", path="new.txt", file_text="made\n").is_error
    finally:
        ctx.close()
    assert state(victim) == before
    moved = Path(f"{ws}.moved")
    assert (moved / "notes.txt").read_text() == "x = 2\n" and (moved / "new.txt").exists()
    assert moved.stat().st_uid == 0 and (moved / "new.txt").stat().st_uid == 0


def test_a_workspace_swapped_after_the_context_was_made_is_still_the_one_the_host_reads(tmp_path, victim):
    """The same swap done by a process of the same user (a host without a uid per attempt)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")
    before = state(victim)
    ctx = ToolContext(workspace=ws)
    try:
        ws.rename(tmp_path / "ws.moved")
        ws.symlink_to(victim)
        assert "root only" not in edit(ctx, command="view", path="secret.txt").content
        assert "root only" not in edit(ctx, command="view", path=str(ws / "secret.txt")).content
        assert "mine" in edit(ctx, command="view", path="notes.txt").content
        edit(ctx, command="create", path="notes.txt", file_text="pwned\n")
    finally:
        ctx.close()
    assert state(victim) == before
