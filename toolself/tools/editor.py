"""`str_replace_editor`: view, create and edit files of the task's workspace.

Edits are exact string replacements because they are what a model can state unambiguously:
`str_replace` must match exactly once, and when it matches zero or several times the error
says why (the line numbers of each match, or where a near match differs only in whitespace)
so that the next call can be right. Every edit is kept in a per-file history for `undo_edit`.

The editor runs in the host process, with the host's rights, so every path is confined to
the workspace (`toolself.tools.workspace`): lexically, then link by link, and every file is
opened from the workspace's own descriptor with O_NOFOLLOW, only when it is a regular file.
An edit rewrites the whole file, so it is made only to files that decode as UTF-8 and hence
encode back to the same bytes: a file in another encoding is shown, never rewritten, since
every line the model did not touch would change too.
"""

from __future__ import annotations

from typing import Literal

from toolself.tools.base import ToolContext, ToolError, Verbatim, tool
from toolself.tools.workspace import Location, Workspace, kind_of

VIEW_CHARS = 16_000
SNIPPET_LINES = 4
MAX_FILE_BYTES = 20 * 1024 * 1024


class EditHistory:
    """Earlier contents per file, as bytes so that an undo restores them exactly (None: the
    file did not exist)."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, ...], list[bytes | None]] = {}

    def push(self, path: tuple[str, ...], previous: bytes | None) -> None:
        self.versions.setdefault(path, []).append(previous)

    def pop(self, path: tuple[str, ...]) -> bytes | None:
        stack = self.versions.get(path)
        if not stack:
            raise ToolError("no edit to undo for this file")
        return stack.pop()


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _read(ws: Workspace, loc: Location) -> bytes:
    data = ws.read_bytes(loc, MAX_FILE_BYTES)
    if b"\0" in data[:8192]:
        raise ToolError(f"{loc.shown} looks binary; use file_analyzer to read it")
    return data


def _editable(data: bytes, loc: Location) -> str:
    """The file's text, refused unless writing it back gives the same bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"refused: {loc.shown} is not UTF-8 text (byte {exc.start + 1} is {data[exc.start:exc.start + 1]!r}), "
                        "so the editor cannot write it back unchanged outside your edit. Edit it with execute_bash "
                        "(sed, or iconv to convert it to UTF-8 first).") from None


def _view(ws: Workspace, loc: Location, view_range: list[int] | None) -> str:
    if loc.kind == "dir":
        if view_range:
            raise ToolError("view_range only applies to files")
        lines = [f"Files and directories up to 2 levels deep in {loc.shown} (hidden ones left out):"]
        return "\n".join(lines + ws.listing(loc))
    data = _read(ws, loc)
    try:
        text, note = data.decode("utf-8"), ""
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        note = " (not UTF-8: undecodable bytes are shown as \ufffd; the editor will not edit this file)"
    lines = _lines(text)
    start, end = 1, len(lines)
    if view_range is not None:
        if len(view_range) != 2:
            raise ToolError("view_range must be two numbers: [first_line, last_line] (last_line -1 means the end)")
        start, end = view_range
        end = len(lines) if end == -1 else end
        if not 1 <= start <= len(lines):
            raise ToolError(f"view_range starts at {start}, but the file has {len(lines)} lines")
        if end < start or end > len(lines):
            raise ToolError(f"view_range ends at {end}; it must be between {start} and {len(lines)} (or -1)")
    shown = _numbered(lines[start - 1:end], start)
    if len(shown) > VIEW_CHARS:
        cut = shown[:VIEW_CHARS]
        last = start + cut.count("\n") - 1
        return (f"{cut[: cut.rfind(chr(10))]}\n[output cut after line {last} of {len(lines)}; "
                f"use view_range=[{last + 1}, -1] to see the rest]")
    return f"Here is {loc.shown} (lines {start}-{end} of {len(lines)}){note}:\n{shown}"


def _snippet(text: str, first_changed: int, changed_lines: int) -> str:
    lines = text.split("\n")
    start = max(1, first_changed - SNIPPET_LINES)
    end = min(len(lines), first_changed + changed_lines - 1 + SNIPPET_LINES)
    return _numbered(lines[start - 1:end], start)


def _match_lines(text: str, needle: str) -> list[int]:
    lines, at = [], text.find(needle)
    while at >= 0:
        lines.append(text.count("\n", 0, at) + 1)
        at = text.find(needle, at + 1)
    return lines


def _no_match_hint(text: str, old: str) -> str:
    stripped = [line.strip() for line in old.split("\n") if line.strip()]
    if not stripped:
        return ""
    candidates = [i + 1 for i, line in enumerate(text.split("\n")) if line.strip() == stripped[0]]
    if candidates:
        return (f" Its first line appears (ignoring indentation) at line(s) {', '.join(map(str, candidates[:10]))}: "
                "check whitespace and indentation, and view those lines.")
    return " View the file to copy the exact text."


@tool
def str_replace_editor(
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"],
    path: str,
    ctx: ToolContext,
    file_text: Verbatim | None = None,
    old_str: Verbatim | None = None,
    new_str: Verbatim | None = None,
    insert_line: int | None = None,
    view_range: list[int] | None = None,
) -> str:
    """View, create and edit files in the task's workspace (view, create, str_replace, insert, undo_edit).

    `view` shows a file with line numbers (or lists a directory two levels deep); `create` writes a
    file; `str_replace` replaces text that occurs exactly once; `insert` adds text after a line;
    `undo_edit` reverts the last edit of a file.

    Args:
        command: One of view, create, str_replace, insert, undo_edit.
        path: File or directory, relative to the workspace root (or absolute inside the workspace).
        file_text: For create: the whole content of the file.
        old_str: For str_replace: the exact text to replace; it must occur exactly once.
        new_str: For str_replace: the replacement (empty deletes). For insert: the text to insert.
        insert_line: For insert: the line after which to insert (0 inserts at the top).
        view_range: For view: [first_line, last_line], 1-based; last_line -1 means the end of the file.
    """
    if ctx is None:
        raise ToolError("str_replace_editor needs a task context (a workspace)")
    ws = Workspace.of(ctx)
    loc = ws.locate(path)
    shown = loc.shown
    history: EditHistory = ctx.resources.setdefault("editor_history", EditHistory())
    if loc.kind == "other":
        raise ToolError(f"refused: {shown} is {kind_of(loc.st.st_mode)}; the editor works on regular files")

    if command == "view":
        if loc.kind == "missing":
            raise ToolError(f"{shown} does not exist")
        return _view(ws, loc, view_range)

    if command == "create":
        if file_text is None:
            raise ToolError("create needs file_text (the whole content of the file)")
        if loc.kind == "dir":
            raise ToolError(f"{shown} is a directory")
        previous = ws.read_bytes(loc, MAX_FILE_BYTES) if loc.kind == "file" else None
        ws.write_bytes(loc, file_text.encode("utf-8"))
        history.push(loc.parts, previous)
        verb = "Overwrote" if previous is not None else "Created"
        return f"{verb} {shown} ({len(file_text.splitlines())} lines)."

    if command == "undo_edit":
        previous = history.pop(loc.parts)
        if previous is None:
            ws.remove(loc)
            return f"Undid the creation of {shown}; the file is removed."
        ws.write_bytes(loc, previous)
        restored = previous.decode("utf-8", errors="replace")
        return f"Reverted the last edit of {shown}:\n{_snippet(restored, 1, 0) if len(restored) < 2000 else '(file restored)'}"

    if loc.kind != "file":
        raise ToolError(f"{shown} is not an existing file" + ("; use create to make it" if loc.kind == "missing" else ""))
    data = _read(ws, loc)
    text = _editable(data, loc)

    if command == "str_replace":
        if old_str is None or old_str == "":
            raise ToolError("str_replace needs old_str: the exact, non-empty text to replace")
        replacement = new_str or ""
        matches = _match_lines(text, old_str)
        if not matches:
            raise ToolError(f"no replacement made: old_str does not occur in {shown}." + _no_match_hint(text, old_str))
        if len(matches) > 1:
            raise ToolError(f"no replacement made: old_str occurs {len(matches)} times in {shown}, at lines "
                            f"{', '.join(map(str, matches))}. Include more surrounding lines to make it unique.")
        updated = text.replace(old_str, replacement, 1)
        ws.write_bytes(loc, updated.encode("utf-8"))
        history.push(loc.parts, data)
        return (f"Edited {shown}. The changed region:\n"
                f"{_snippet(updated, matches[0], replacement.count(chr(10)) + 1)}\n"
                "Check that it is as intended; undo_edit reverts it.")

    if command == "insert":
        if insert_line is None or new_str is None:
            raise ToolError("insert needs insert_line and new_str")
        lines = text.splitlines(keepends=True)
        if not 0 <= insert_line <= len(lines):
            raise ToolError(f"insert_line must be between 0 and {len(lines)} (the file has {len(lines)} lines)")
        if lines and insert_line == len(lines) and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += "\n"
        block = new_str if new_str.endswith("\n") or insert_line == len(lines) and not text.endswith("\n") else new_str + "\n"
        new_lines = _lines(block)
        updated = "".join(lines[:insert_line] + [block] + lines[insert_line:])
        ws.write_bytes(loc, updated.encode("utf-8"))
        history.push(loc.parts, data)
        return f"Inserted {len(new_lines)} line(s) after line {insert_line} of {shown}:\n{_snippet(updated, insert_line + 1, len(new_lines))}"

    raise ToolError(f"unknown command {command!r}")
