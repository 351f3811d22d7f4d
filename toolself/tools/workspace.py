"""Where an attempt's workspace lives, and how the host touches it without following the attempt's links.

Everything in a workspace was put there or can be changed by code the model chose, running
as the attempt's own uid, while the host works on the same files with its own rights (often
root): the editor reads and writes them, `file_analyzer` reads them, the sandbox hands them
to the attempt's uid and back. So:

- a workspace is made only by `make_workspace`, inside a folder that only the host can
  change (its own 0711 folder in the system temporary folder, or a caller's folder that
  others cannot write). In a shared sticky folder such as /tmp the attempt's uid would own
  its workspace and could rename it and put a link to a host folder in its place;
- the host reaches the workspace through a directory descriptor taken when it was made
  (`ToolContext.root_fd`), never through its path again, and every file below it is opened
  component by component with O_NOFOLLOW relative to that descriptor: a link inside the
  workspace is followed only as far as it stays inside, by this module's own resolution;
- only regular files are read or written (opened with O_NONBLOCK, so a named pipe cannot
  stall the host before it is refused), and a file with other hard links that the attempt
  does not own is refused, since it may be a host file linked in;
- handing the tree to the attempt's uid and back walks it by descriptor and changes only
  what the walk finds inside, never through a link.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import stat
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from toolself.tools.errors import ToolError

PARENT_MODE = 0o711
MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}

_parents: dict[Path | None, Path] = {}
_parents_lock = threading.Lock()


def make_workspace(parent: Path | None = None, prefix: str = "toolself-ws-") -> Path:
    """A new, empty, private (0700) workspace: the only way toolself makes one.

    `parent` None puts it in a folder of this process's own (0711: the attempt's uid may pass
    through, not list or rename) in the system temporary folder, removed at exit. A given
    parent is used as it is when only its owner (this user or root) can write it; a parent
    others may write, such as /tmp, gets such a private folder of its own inside it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_safe_parent(parent)))


def remove_workspace(path: Path) -> None:
    """Delete a workspace made by `make_workspace`. Its parent cannot be changed by the
    attempt, and `shutil.rmtree` walks by descriptor and refuses a link at the top, so no
    link planted inside leads the deletion out."""
    shutil.rmtree(path, ignore_errors=True)


def _safe_parent(parent: Path | None) -> Path:
    key = None if parent is None else Path(parent).absolute()
    with _parents_lock:
        known = _parents.get(key)
        if known is not None and known.is_dir():
            return known
        if key is None:
            folder = _private_folder(Path(tempfile.gettempdir()))
        else:
            key.mkdir(parents=True, exist_ok=True)
            real = key.resolve()
            _refuse_unsticky_ancestors(real)
            folder = real if _only_owner_writes(real) else _private_folder(real)
        _parents[key] = folder
        return folder


def _private_folder(inside: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="toolself-workspaces-", dir=inside))
    os.chmod(folder, PARENT_MODE)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _only_owner_writes(folder: Path) -> bool:
    st = os.stat(folder)
    return st.st_uid in (os.geteuid(), 0) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _refuse_unsticky_ancestors(folder: Path) -> None:
    """Any user may rename entries of a world-writable folder without the sticky bit, so
    nothing below one is safe from the attempt."""
    for path in [folder, *folder.parents]:
        mode = os.stat(path).st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise ValueError(f"workspaces cannot be kept under {path}: every user may rename what is in it "
                             "(world-writable without the sticky bit)")


def open_directory(path: Path) -> int:
    """A descriptor of the directory `path` names, refused when its last component is a link."""
    return os.open(path, _DIR_FLAGS)


def hand_over(root_fd: int, uid: int, gid: int, *, owned_by: int | None = None, mode: int | None = None) -> None:
    """Give the workspace (by descriptor) and everything found in it to `uid`:`gid`.

    The walk never follows a link and links themselves are changed, not their targets.
    `owned_by` limits the change to what that uid owns (handing back: a file the attempt
    hard-linked in from elsewhere belongs to someone else and is left alone); without it a
    non-directory with other hard links is left alone, since handing it over would hand over
    its other names too. `mode` is set on the workspace folder itself."""
    if owned_by is None or os.fstat(root_fd).st_uid == owned_by:
        os.fchown(root_fd, uid, gid)
    if mode is not None:
        os.fchmod(root_fd, mode)
    for _, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd, follow_symlinks=False):
        for name in dirnames + filenames:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if owned_by is not None and st.st_uid != owned_by:
                    continue
                if owned_by is None and st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    continue
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                pass


@dataclass(frozen=True)
class Location:
    """A path of the workspace after its links were followed inside it: `parts` from the root,
    and what was found there (None: nothing yet)."""

    parts: tuple[str, ...]
    st: os.stat_result | None

    @property
    def shown(self) -> str:
        return "/".join(self.parts) or "."

    @property
    def kind(self) -> str:
        if self.st is None:
            return "missing"
        if stat.S_ISREG(self.st.st_mode):
            return "file"
        if stat.S_ISDIR(self.st.st_mode):
            return "dir"
        return "other"


def kind_of(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class Workspace:
    """A workspace as the host sees it: paths resolved and files opened relative to the
    workspace's descriptor. `owner`, the attempt's uid and gid when it has its own, receives
    what the host creates, and is the only owner whose hard-linked files are touched."""

    def __init__(self, root: Path, root_fd: int, owner: tuple[int, int] | None = None):
        self.root = Path(root)
        self.fd = root_fd
        self.owner = owner

    @classmethod
    def of(cls, ctx: Any) -> "Workspace":
        user = ctx.resources.get("sandbox_user")
        owner = (user.uid, user.gid) if user is not None and user.dedicated else None
        return cls(ctx.workspace, ctx.root_fd, owner)

    # paths -------------------------------------------------------------------------------

    def locate(self, path: str) -> Location:
        """Where `path` (relative to the root, or absolute inside it) leads, refused when it
        or a link on its way leads out of the workspace."""
        if not path or "\0" in path:
            raise ToolError("the path is empty or contains a NUL character")
        raw = os.path.expanduser(path) if path.startswith("~") else path
        parts = self._inside(raw)
        if parts is None:
            raise ToolError(f"refused: {path!r} is outside the workspace. Use a path inside it "
                            f"(relative paths start at the workspace root, {self.root}).")
        return self._follow(parts, path)

    def _inside(self, raw: str) -> tuple[str, ...] | None:
        root = str(self.root.absolute())
        candidate = os.path.normpath(raw if os.path.isabs(raw) else os.path.join(root, raw))
        for spelling in (root, os.path.realpath(root)) if os.path.isabs(raw) else (root,):
            if candidate == spelling:
                return ()
            if candidate.startswith(spelling.rstrip("/") + "/"):
                return tuple(candidate[len(spelling.rstrip("/")) + 1:].split("/"))
        return None

    def _follow(self, parts: tuple[str, ...], asked: str) -> Location:
        """Resolve `parts` one component at a time from the root descriptor, following links
        by reading them (never by opening through them)."""
        resolved: list[str] = []
        fds: list[int] = []
        pending = list(parts)
        links = 0
        last_link = ""
        try:
            while pending:
                part = pending.pop(0)
                if part in ("", "."):
                    continue
                if part == "..":
                    if not resolved:
                        raise self._link_out(asked, last_link)
                    resolved.pop()
                    os.close(fds.pop())
                    continue
                at = fds[-1] if fds else self.fd
                try:
                    st = os.stat(part, dir_fd=at, follow_symlinks=False)
                except FileNotFoundError:
                    rest = os.path.normpath("/".join([part, *pending]))
                    if rest == ".." or rest.startswith("../"):
                        raise self._link_out(asked, last_link) from None
                    if rest == ".":
                        return Location(tuple(resolved), os.fstat(at))
                    return Location(tuple(resolved) + tuple(rest.split("/")), None)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAX_LINKS:
                        raise ToolError(f"refused: {asked!r} goes through more than {MAX_LINKS} symbolic links")
                    target = os.readlink(part, dir_fd=at)
                    last_link = f"{'/'.join([*resolved, part])} -> {target}"
                    if os.path.isabs(target):
                        inside = self._inside(target)
                        if inside is None:
                            raise self._link_out(asked, last_link)
                        for fd in fds:
                            os.close(fd)
                        fds.clear()
                        resolved.clear()
                        pending = list(inside) + pending
                    else:
                        pending = target.split("/") + pending
                    continue
                resolved.append(part)
                if not pending:
                    return Location(tuple(resolved), st)
                if not stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{'/'.join(resolved)} is not a directory")
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=at))
            return Location(tuple(resolved), os.fstat(fds[-1]) if fds else os.fstat(self.fd))
        finally:
            for fd in fds:
                os.close(fd)

    @staticmethod
    def _link_out(asked: str, link: str) -> ToolError:
        return ToolError(f"refused: {asked!r} leads outside the workspace through the symbolic link {link}")

    # files -------------------------------------------------------------------------------

    @contextmanager
    def _directory(self, parts: tuple[str, ...], create: bool = False) -> Iterator[int]:
        """A descriptor of the directory at `parts`, reached without following any link."""
        fd = os.dup(self.fd)
        try:
            for part in parts:
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise ToolError(f"{'/'.join(parts)} does not exist") from None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    if self.owner is not None:
                        os.fchown(next_fd, *self.owner)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ToolError(f"refused: {'/'.join(parts)} changed while it was being opened "
                                        "(a link appeared)") from None
                    raise
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    def _checked(self, fd: int, loc: Location) -> os.stat_result:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ToolError(f"refused: {loc.shown} is {kind_of(st.st_mode)}; only regular files are read or written")
        if st.st_nlink > 1 and self.owner is not None and st.st_uid != self.owner[0]:
            os.close(fd)
            raise ToolError(f"refused: {loc.shown} has other hard links and does not belong to the task")
        return st

    def _open(self, parent: int, loc: Location, flags: int, mode: int = 0o644) -> int:
        try:
            return os.open(loc.parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(f"refused: {loc.shown} is a symbolic link") from None
            if exc.errno == errno.ENXIO:
                raise ToolError(f"refused: {loc.shown} is not a regular file") from None
            raise

    @contextmanager
    def open_file(self, loc: Location) -> Iterator[tuple[BinaryIO, os.stat_result]]:
        """The regular file at `loc`, opened for reading, with its status."""
        if not loc.parts:
            raise ToolError(". is a directory")
        with self._directory(loc.parts[:-1]) as parent:
            fd = self._open(parent, loc, os.O_RDONLY)
        st = self._checked(fd, loc)
        with os.fdopen(fd, "rb") as handle:
            yield handle, st

    def read_bytes(self, loc: Location, limit: int) -> bytes:
        with self.open_file(loc) as (handle, st):
            data = handle.read(limit + 1) if st.st_size <= limit else b""
        if st.st_size > limit or len(data) > limit:
            raise ToolError(f"{loc.shown} is larger than {limit >> 20} MB; use execute_bash to inspect it")
        return data

    def write_bytes(self, loc: Location, data: bytes) -> None:
        """Replace the file's content (creating it and its folders, handed to `owner`)."""
        if not loc.parts:
            raise ToolError(". is a directory")
        with self._directory(loc.parts[:-1], create=True) as parent:
            try:
                fd = self._open(parent, loc, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                created = True
            except FileExistsError:
                fd = self._open(parent, loc, os.O_WRONLY)
                created = False
        self._checked(fd, loc)
        with os.fdopen(fd, "wb") as handle:
            if created and self.owner is not None:
                os.fchown(fd, *self.owner)
            handle.truncate(0)
            handle.write(data)

    def remove(self, loc: Location) -> None:
        with self._directory(loc.parts[:-1]) as parent:
            os.unlink(loc.parts[-1], dir_fd=parent)

    def listing(self, loc: Location, depth: int = 2, limit: int = 2000) -> list[str]:
        """Files and folders below `loc`, `depth` levels deep, hidden ones left out, walked by
        descriptor without entering linked folders."""
        lines: list[str] = []
        with self._directory(loc.parts) as top:
            for dirpath, dirnames, filenames, _ in os.fwalk(".", dir_fd=top):
                below = Path(dirpath).parts
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                if len(below) >= depth:
                    dirnames[:] = []
                prefix = [*loc.parts, *below]
                lines += ["/".join([*prefix, name]) + "/" for name in dirnames]
                lines += ["/".join([*prefix, name]) for name in sorted(f for f in filenames if not f.startswith("."))]
                if len(lines) > limit:
                    lines.append(f"[... listing cut at {limit} entries ...]")
                    break
        return lines
