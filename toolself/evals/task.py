"""A task and the private environment each attempt at it runs in.

A `Task` is a plain record: the question, the reference answer (or a check command), and a
description of what the environment needs: files to place in a workspace, a document collection
for `search` / `visit`, a command that decides success. `Task.environment()` builds that
environment fresh for one attempt and `close()` removes it, so nothing an attempt writes, edits
or executes can leak into another attempt at the same or another task.

Documents are kept as plain dicts (`{"id", "title", "text"}`) rather than as an index, so that a
task stays cheap to generate and to pickle to a worker process; the search index is built when
an environment opens and cached per document set, because many tasks of a split share one
read-only collection.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from toolself.tools.base import ToolContext
from toolself.tools.workspace import make_workspace, remove_workspace

Family = Literal["research", "data", "code", "mixed", "gaia", "frames", "xbench", "swebench", "hotpotqa",
                 "gsm8k", "jsonl"]

FAMILIES: tuple[str, ...] = ("research", "data", "code", "mixed", "gaia", "frames", "xbench", "swebench",
                             "hotpotqa", "gsm8k", "jsonl")


@dataclass
class Task:
    """One evaluation or training task.

    files: paths copied into the workspace (a directory's contents are copied, a file keeps its
    name). inline_files: relative path -> text or bytes written into the workspace (how the
    generated suites ship their data without touching disk until an attempt starts).
    setup: a picklable callable given the workspace after files are placed (a SWE-bench checkout,
    a generated spreadsheet). documents / collection_path: the collection `search` and `visit`
    read; documents are shared by reference between tasks of a split and must not be mutated.
    check_command: for code tasks, the shell command that runs the tests (see `checks`: it runs
    in the attempt's sandbox once the attempt's processes are gone).
    check_files: the grader's own copy of the tests (and of whatever else they import that the
    attempt must not change), restored into the workspace without following links just before
    the check runs, so that an attempt cannot pass by editing or replacing them.
    check_tests: the tests that must be reported passed, by kind (SWE-bench: {"FAIL_TO_PASS":
    [...], "PASS_TO_PASS": [...]}; the built-in suites: {"tests": [...]}). An id is what the test
    runner calls the test: a pytest node id (`tests/test_x.py::TestX::test_y`), a unittest id
    (`tests.test_x.TestX.test_y`, also Django's `test_y (tests.test_x.TestX)`), or a bare test
    name that exactly one reported test ends with. The statuses come from the runner's own
    per-test report (see `checks`), never from its printed log or its exit status, so a task with
    a check command and no expected tests can never be solved.
    """

    id: str
    question: str
    answer: str | None = None
    level: int | str | None = None
    family: str = "jsonl"
    split: str = "test"
    metadata: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    inline_files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    documents: Sequence[dict[str, Any]] | None = None
    collection_path: Path | None = None
    check_command: str | None = None
    check_timeout: float = 120.0
    check_files: dict[str, str] = field(default_factory=dict)
    check_tests: dict[str, list[str]] = field(default_factory=dict)

    def environment(self, root: Path | None = None, model: Any = None) -> "TaskEnvironment":
        """A fresh private environment for one attempt (a context manager)."""
        return TaskEnvironment(self, root=root, model=model)

    def summary(self) -> dict[str, Any]:
        """The task as a JSON-able record, for trajectories and listings."""
        return {"id": self.id, "question": self.question, "answer": self.answer, "level": self.level,
                "family": self.family, "split": self.split, "metadata": self.metadata,
                "files": [str(p) for p in self.files] + sorted(self.inline_files),
                "documents": len(self.documents) if self.documents is not None else None,
                "collection_path": str(self.collection_path) if self.collection_path else None,
                "check_command": self.check_command, "check_tests": self.check_tests}


class TaskEnvironment:
    """The workspace, collection and tool context of one attempt.

    The workspace is made by `make_workspace` under `root` (or in a folder of the process's
    own); `close()` closes the context's resources (Python and shell sessions) and deletes the
    directory.
    """

    def __init__(self, task: Task, root: Path | None = None, model: Any = None):
        self.task = task
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in task.id)[:60]
        self.workspace = make_workspace(root, prefix=f"toolself-{safe}-").resolve()
        try:
            _place_files(task, self.workspace)
            if task.setup is not None:
                task.setup(self.workspace)
            collection = _collection_for(task)
        except BaseException:
            remove_workspace(self.workspace)
            raise
        self.context = ToolContext(workspace=self.workspace, collection=collection, model=model)
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.context.close()
        remove_workspace(self.workspace)

    def __enter__(self) -> "TaskEnvironment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _place_files(task: Task, workspace: Path) -> None:
    for source in task.files:
        source = Path(source)
        if not source.exists():
            raise FileNotFoundError(f"task {task.id}: file {source} does not exist")
        if source.is_dir():
            shutil.copytree(source, workspace, dirs_exist_ok=True)
        else:
            shutil.copy2(source, workspace / source.name)
    for relative, content in task.inline_files.items():
        target = (workspace / relative).resolve()
        if workspace not in target.parents:
            raise ValueError(f"task {task.id}: inline file {relative!r} escapes the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")


_COLLECTIONS: dict[Any, tuple[Any, Any]] = {}
_COLLECTIONS_LOCK = threading.Lock()
_MAX_CACHED = 64


def _collection_for(task: Task) -> Any:
    """The task's collection, built and indexed once per document set, then shared read-only
    (indexed here, under the lock, so that concurrent attempts never race to build it)."""
    if task.documents is None and task.collection_path is None:
        return None
    from toolself.tools.collection import Collection

    if task.documents is not None:
        key: Any = ("docs", id(task.documents))
        source: Any = task.documents
    else:
        key = ("path", str(Path(task.collection_path).resolve()))
        source = key[1]
    with _COLLECTIONS_LOCK:
        cached = _COLLECTIONS.get(key)
        # The source is kept with the entry so that an id() cannot be reused while cached.
        if cached is not None and (cached[0] is source or key[0] == "path"):
            return cached[1]
        if task.documents is not None:
            collection = Collection.from_documents(list(task.documents))
        else:
            collection = Collection.from_path(Path(task.collection_path))
        getattr(collection, "index", None)
        if len(_COLLECTIONS) >= _MAX_CACHED:
            _COLLECTIONS.pop(next(iter(_COLLECTIONS)))
        _COLLECTIONS[key] = (source, collection)
    return collection
