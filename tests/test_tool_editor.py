"""`str_replace_editor`: view, create, str_replace, insert, undo; every path confined to the workspace."""

import os

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.editor import str_replace_editor


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside.txt").write_text("host file\n")
    context = ToolContext(workspace=tmp_path / "ws")
    yield context
    context.close()


def edit(ctx, **arguments):
    return str_replace_editor(arguments, ctx)


def test_create_then_view_with_line_numbers(ctx):
    assert not edit(ctx, command="create", path="pkg/mod.py", file_text="a = 1\nb = 2\n").is_error
    view = edit(ctx, command="view", path="pkg/mod.py").content
    assert "     1\ta = 1\n     2\tb = 2" in view
    assert "lines 1-2 of 2" in view


def test_view_range(ctx):
    edit(ctx, command="create", path="f.txt", file_text="".join(f"line {i}\n" for i in range(1, 11)))
    view = edit(ctx, command="view", path="f.txt", view_range=[3, 4]).content
    assert "     3\tline 3\n     4\tline 4" in view and "line 5" not in view
    assert "line 10" in edit(ctx, command="view", path="f.txt", view_range=[9, -1]).content
    bad = edit(ctx, command="view", path="f.txt", view_range=[5, 99])
    assert bad.is_error and "between 5 and 10" in bad.content


def test_directory_is_listed_two_levels_deep(ctx):
    for name in ["a/b/c/deep.txt", "a/top.txt", "root.txt", ".hidden/x.txt"]:
        edit(ctx, command="create", path=name, file_text="x")
    listing = edit(ctx, command="view", path=".").content
    assert "a/top.txt" in listing and "a/b/" in listing and "root.txt" in listing
    assert "deep.txt" not in listing and ".hidden" not in listing


def test_str_replace_exactly_once(ctx):
    edit(ctx, command="create", path="m.py", file_text="def f():\n    return 1\n")
    obs = edit(ctx, command="str_replace", path="m.py", old_str="return 1", new_str="return 2")
    assert not obs.is_error and "return 2" in obs.content
    assert (ctx.workspace / "m.py").read_text() == "def f():\n    return 2\n"


def test_str_replace_with_several_matches_names_their_lines(ctx):
    edit(ctx, command="create", path="m.py", file_text="x = 0\ny = 1\nx = 0\n")
    obs = edit(ctx, command="str_replace", path="m.py", old_str="x = 0", new_str="x = 9")
    assert obs.is_error and "2 times" in obs.content and "lines 1, 3" in obs.content
    assert (ctx.workspace / "m.py").read_text() == "x = 0\ny = 1\nx = 0\n"


def test_str_replace_without_match_points_at_whitespace(ctx):
    edit(ctx, command="create", path="m.py", file_text="if a:\n    go()\n")
    obs = edit(ctx, command="str_replace", path="m.py", old_str="if a:\n\tgo()", new_str="stop()")
    assert obs.is_error and "does not occur" in obs.content and "line(s) 1" in obs.content


def test_insert_after_a_line(ctx):
    edit(ctx, command="create", path="m.txt", file_text="one\ntwo\n")
    edit(ctx, command="insert", path="m.txt", insert_line=1, new_str="one and a half")
    assert (ctx.workspace / "m.txt").read_text() == "one\none and a half\ntwo\n"
    edit(ctx, command="insert", path="m.txt", insert_line=0, new_str="zero")
    assert (ctx.workspace / "m.txt").read_text().startswith("zero\none\n")
    assert edit(ctx, command="insert", path="m.txt", insert_line=9, new_str="x").is_error


def test_undo_reverts_edits_in_order_and_creation_last(ctx):
    edit(ctx, command="create", path="u.txt", file_text="v1\n")
    edit(ctx, command="str_replace", path="u.txt", old_str="v1", new_str="v2")
    edit(ctx, command="str_replace", path="u.txt", old_str="v2", new_str="v3")
    edit(ctx, command="undo_edit", path="u.txt")
    assert (ctx.workspace / "u.txt").read_text() == "v2\n"
    edit(ctx, command="undo_edit", path="u.txt")
    assert (ctx.workspace / "u.txt").read_text() == "v1\n"
    edit(ctx, command="undo_edit", path="u.txt")
    assert not (ctx.workspace / "u.txt").exists()
    assert edit(ctx, command="undo_edit", path="u.txt").is_error


def test_missing_arguments_are_named(ctx):
    assert "file_text" in edit(ctx, command="create", path="x").content
    bad = edit(ctx, command="delete", path="x")
    assert bad.is_error and "command" in bad.content


def test_parent_escape_is_refused_and_next_call_works(ctx, tmp_path):
    obs = edit(ctx, command="create", path="../outside.txt", file_text="pwned")
    assert obs.is_error and "outside the workspace" in obs.content
    assert (tmp_path / "outside.txt").read_text() == "host file\n"
    assert not edit(ctx, command="create", path="inside.txt", file_text="fine").is_error


def test_absolute_path_outside_is_refused(ctx, tmp_path):
    obs = edit(ctx, command="view", path=str(tmp_path / "outside.txt"))
    assert obs.is_error and "outside the workspace" in obs.content
    assert edit(ctx, command="view", path="/etc/passwd").is_error
    inside = edit(ctx, command="create", path=str(ctx.workspace / "abs.txt"), file_text="ok")
    assert not inside.is_error and (ctx.workspace / "abs.txt").exists()


def test_symlink_leading_out_is_refused(ctx, tmp_path):
    os.symlink(tmp_path / "outside.txt", ctx.workspace / "link.txt")
    os.symlink(tmp_path, ctx.workspace / "linkdir")
    for arguments in ({"command": "view", "path": "link.txt"},
                      {"command": "create", "path": "link.txt", "file_text": "pwned"},
                      {"command": "create", "path": "linkdir/new.txt", "file_text": "pwned"}):
        obs = edit(ctx, **arguments)
        assert obs.is_error and "symbolic link" in obs.content
    assert (tmp_path / "outside.txt").read_text() == "host file\n"
    assert not (tmp_path / "new.txt").exists()
    assert not edit(ctx, command="view", path=".").is_error


def test_symlink_inside_the_workspace_is_followed(ctx):
    edit(ctx, command="create", path="real.txt", file_text="content\n")
    os.symlink("real.txt", ctx.workspace / "alias.txt")
    assert "content" in edit(ctx, command="view", path="alias.txt").content


def test_binary_file_is_refused_for_view(ctx):
    (ctx.workspace / "b.bin").write_bytes(b"\x00\x01\x02")
    obs = edit(ctx, command="view", path="b.bin")
    assert obs.is_error and "file_analyzer" in obs.content
