"""`str_replace_editor`: view, create and edit files of the task's workspace.

Edits are exact string replacements because they are what a model can state unambiguously:
`str_replace` must match exactly once, and when it matches zero or several times the error
says why (the line numbers of each match, or where a near match differs only in whitespace)
so that the next call can be right. Every edit is kept in a per-file history for `undo_edit`.

The editor runs in the host process, with the host's rights, so every path is confined to
the workspace twice: lexically (no `..` or absolute path out of it) and physically (no
symbolic link that leads out). Files are then opened component by component with
O_NOFOLLOW from the workspace's own descriptor, so a link swapped in after the check by the
task's own code is refused rather than followed.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal

from toolself.tools.base import ToolContext, ToolError, Verbatim, tool

VIEW_CHARS = 16_000
SNIPPET_LINES = 4
MAX_FILE_BYTES = 20 * 1024 * 1024


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Workspace:
    """Paths of one workspace, refused when they lead out of it."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def resolve(self, path: str) -> Path:
        if not path or "\0" in path:
            raise ToolError("the path is empty or contains a NUL character")
        raw = Path(path).expanduser() if path.startswith("~") else Path(path)
        candidate = raw if raw.is_absolute() else self.root / raw
        lexical = Path(os.path.normpath(candidate))
        if not _within(lexical, self.root):
            raise ToolError(f"refused: {path!r} is outside the workspace. Use a path inside it "
                            f"(relative paths start at the workspace root, {self.root}).")
        real = lexical.resolve()
        if not _within(real, self.root):
            link = self._first_link_out(lexical)
            raise ToolError(f"refused: {path!r} leads outside the workspace through the symbolic link "
                            f"{self.display(link)} -> {os.readlink(link)}")
        return real

    def _first_link_out(self, lexical: Path) -> Path:
        current = self.root
        for part in lexical.relative_to(self.root).parts:
            current = current / part
            if current.is_symlink() and not _within(current.resolve(), self.root):
                return current
        return lexical

    def display(self, path: Path) -> str:
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return str(path)
        return str(rel) if str(rel) != "." else "."

    @contextmanager
    def _dir_fd(self, real: Path, create: bool) -> Iterator[int]:
        """A descriptor of `real`'s parent reached without following any link."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in real.relative_to(self.root).parts[:-1]:
                try:
                    next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ToolError(f"refused: {self.display(real)} changed under the editor (a link appeared)") from None
                    raise
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    def read_bytes(self, real: Path) -> bytes:
        with self._dir_fd(real, create=False) as parent:
            try:
                fd = os.open(real.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ToolError(f"refused: {self.display(real)} is a link") from None
                raise
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise ToolError(f"{self.display(real)} is not a regular file")
                data = handle.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ToolError(f"{self.display(real)} is larger than {MAX_FILE_BYTES >> 20} MB; use execute_bash to inspect it")
        return data

    def write_text(self, real: Path, text: str) -> list[Path]:
        """Write and return the directories and file created, for ownership hand-over."""
        created = [p for p in real.parents if _within(p, self.root) and not p.exists()]
        with self._dir_fd(real, create=True) as parent:
            try:
                fd = os.open(real.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ToolError(f"refused: {self.display(real)} is a link") from None
                raise
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                handle.write(text)
        return created + [real]

    def remove(self, real: Path) -> None:
        with self._dir_fd(real, create=False) as parent:
            os.unlink(real.name, dir_fd=parent)


class EditHistory:
    """Earlier contents per file (None: the file did not exist)."""

    def __init__(self) -> None:
        self.versions: dict[Path, list[str | None]] = {}

    def push(self, path: Path, previous: str | None) -> None:
        self.versions.setdefault(path, []).append(previous)

    def pop(self, path: Path) -> str | None:
        stack = self.versions.get(path)
        if not stack:
            raise ToolError("no edit to undo for this file")
        return stack.pop()


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _read_text(ws: Workspace, real: Path) -> str:
    data = ws.read_bytes(real)
    if b"\0" in data[:8192]:
        raise ToolError(f"{ws.display(real)} looks binary; use file_analyzer to read it")
    return data.decode("utf-8", errors="replace")


def _view(ws: Workspace, real: Path, view_range: list[int] | None) -> str:
    if real.is_dir():
        if view_range:
            raise ToolError("view_range only applies to files")
        lines = [f"Files and directories up to 2 levels deep in {ws.display(real)} (hidden ones left out):"]
        base_depth = len(real.parts)
        for dirpath, dirnames, filenames in os.walk(real):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            depth = len(Path(dirpath).parts) - base_depth
            if depth >= 2:
                dirnames[:] = []
            for name in dirnames:
                lines.append(ws.display(Path(dirpath) / name) + "/")
            for name in sorted(f for f in filenames if not f.startswith(".")):
                lines.append(ws.display(Path(dirpath) / name))
            if len(lines) > 2000:
                lines.append("[... listing cut at 2000 entries ...]")
                break
        return "\n".join(lines)
    text = _read_text(ws, real)
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
    return f"Here is {ws.display(real)} (lines {start}-{end} of {len(lines)}):\n{shown}"


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


def _adopt(ctx: ToolContext, paths: list[Path]) -> None:
    user = ctx.resources.get("sandbox_user")
    if user is not None:
        for path in paths:
            user.adopt(path)


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
    ws = Workspace(ctx.workspace)
    real = ws.resolve(path)
    shown = ws.display(real)
    history: EditHistory = ctx.resources.setdefault("editor_history", EditHistory())

    if command == "view":
        if not real.exists():
            raise ToolError(f"{shown} does not exist")
        return _view(ws, real, view_range)

    if command == "create":
        if file_text is None:
            raise ToolError("create needs file_text (the whole content of the file)")
        if real.is_dir():
            raise ToolError(f"{shown} is a directory")
        previous = _read_text(ws, real) if real.exists() else None
        _adopt(ctx, ws.write_text(real, file_text))
        history.push(real, previous)
        verb = "Overwrote" if previous is not None else "Created"
        return f"{verb} {shown} ({len(file_text.splitlines())} lines)."

    if command == "undo_edit":
        previous = history.pop(real)
        if previous is None:
            ws.remove(real)
            return f"Undid the creation of {shown}; the file is removed."
        _adopt(ctx, ws.write_text(real, previous))
        return f"Reverted the last edit of {shown}:\n{_snippet(previous, 1, 0) if len(previous) < 2000 else '(file restored)'}"

    if not real.is_file():
        raise ToolError(f"{shown} is not an existing file" + ("; use create to make it" if not real.exists() else ""))
    text = _read_text(ws, real)

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
        _adopt(ctx, ws.write_text(real, updated))
        history.push(real, text)
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
        _adopt(ctx, ws.write_text(real, updated))
        history.push(real, text)
        return f"Inserted {len(new_lines)} line(s) after line {insert_line} of {shown}:\n{_snippet(updated, insert_line + 1, len(new_lines))}"

    raise ToolError(f"unknown command {command!r}")
