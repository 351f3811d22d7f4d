"""Tasks from a spec string: the paper's benchmarks from files the user gives, or a built-in suite.

    builtin:research|data|code|mixed[?key=value&...]   generated suites (split train|heldout, default heldout)
    gaia:PATH        metadata.jsonl / .parquet (or its folder); attachments resolved next to it
    frames:PATH      the FRAMES TSV / CSV / JSON(L)
    xbench:PATH      the official xbench-DeepSearch CSV; fields decrypted with each row's canary
    swebench:PATH[?repo=CLONE&envs=DIR]   SWE-bench (Lite) JSON / JSONL / parquet: the workspace holds the
                     clone's tree at base_commit; the check applies test_patch and runs the repository's
                     test command over the files it touches (see toolself.evals.rules.swebench)
    hotpotqa:PATH    HotpotQA (original JSON or the processed JSONL); paragraphs become the collection
    gsm8k:PATH       GSM8K JSONL; the answer is what follows `####`
    jsonl:PATH       plain JSONL with `question` and `answer` (optional: id, level, split, files next
                     to the JSONL, check_command with the check_tests it must report passed and the
                     check_files it restores, scorer, metadata)

Without a prefix the format is inferred from the file when its first row says so unambiguously.
Nothing is ever fetched: a path is read or the load fails with a message naming it. A malformed
row is skipped and reported with its file and line; the count is printed and kept on the
returned list (`LoadedTasks.skipped`), never hidden. A file none of whose rows is a task is
refused, not run as an empty benchmark: most often it is another benchmark's file.

Options common to file loaders: `collection=PATH` (a folder or JSONL the tasks' `search` reads),
`shuffle=1` (shuffle with the seed before `limit`), `scorer=NAME` (one of
`toolself.evals.rules.SCORERS`, e.g. the opt-in `gaia_lenient` or `gsm8k_strict`), and per
format: gaia `level=N`, `text_only=1` (GAIA(WS): rows without attachments); swebench `repo=PATH`
(a clone, or a folder of clones named `owner__name` or `name`), `envs=DIR` (each instance's Python
environment, `DIR/<instance_id>` or `DIR/<owner>__<name>__<version>`), and for repositories
without an official spec `test_cmd=...` (the test files are appended) and `log_parser=REPO`.

Each loader names the scorer of its benchmark's rules in `metadata["scorer"]`. Every loader reads
its rows through `task_rows`; SWE-bench's, which also reaches clones, environments and git, is
`swebench_tasks`.
"""

from __future__ import annotations

import ast
import base64
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl

from rich.console import Console
from rich.markup import escape

from toolself.evals.swebench_tasks import load_swebench
from toolself.evals.task import Task
from toolself.evals.task_rows import RowError, SkippedRow, each_row, read_rows, require_fields, split_for

_console = Console(stderr=True)


class LoadedTasks(list):
    """A list of tasks that also carries what was skipped while loading and from where."""

    def __init__(self, tasks: list[Task] = (), skipped: list[SkippedRow] | None = None, source: str = ""):
        super().__init__(tasks)
        self.skipped: list[SkippedRow] = list(skipped or [])
        self.source = source


@dataclass
class Spec:
    kind: str
    target: str
    options: dict[str, str]


KINDS = ("builtin", "gaia", "frames", "xbench", "swebench", "hotpotqa", "gsm8k", "jsonl")


def parse_spec(spec: str) -> Spec:
    body, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    kind, sep, target = body.partition(":")
    if sep and kind in KINDS:
        return Spec(kind, target, options)
    return Spec("", body, options)


def load_tasks(spec: str, split: str | None = None, limit: int | None = None, seed: int = 0,
               quiet: bool = False) -> LoadedTasks:
    """Load tasks named by `spec` (see the module docs). Skipped rows are printed unless quiet."""
    parsed = parse_spec(spec)
    if parsed.kind == "builtin":
        from toolself.evals.suites import generate_suite

        tasks = generate_suite(parsed.target, split or "heldout", n=limit, seed=seed, **parsed.options)
        return LoadedTasks(tasks, [], spec)
    path = Path(parsed.target).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{spec}: no file or folder at {path}")
    kind = parsed.kind or infer_kind(path)
    loader = _LOADERS[kind]
    skipped: list[SkippedRow] = []
    tasks = loader(path, split, parsed.options, skipped)
    if not tasks and skipped:
        raise ValueError(_none_read(spec, kind, parsed.target, path, skipped))
    if parsed.options.get("collection"):
        collection = Path(parsed.options["collection"]).expanduser()
        if not collection.exists():
            raise FileNotFoundError(f"{spec}: no collection at {collection}")
        for task in tasks:
            if task.documents is None:
                task.collection_path = collection
    if parsed.options.get("scorer"):
        from toolself.evals.rules import SCORERS

        if parsed.options["scorer"] not in SCORERS:
            raise ValueError(f"{spec}: unknown scorer {parsed.options['scorer']!r} (known: {', '.join(SCORERS)})")
        for task in tasks:
            if not task.check_command:
                task.metadata["scorer"] = parsed.options["scorer"]
    if _flag(parsed.options, "shuffle"):
        random.Random(seed).shuffle(tasks)
    if limit is not None:
        tasks = tasks[:limit]
    if skipped and not quiet:
        _console.print(f"[yellow]{escape(spec)}: skipped {len(skipped)} malformed row(s)[/yellow]")
        for row in skipped[:20]:
            _console.print(f"  {row}", markup=False, highlight=False)
        if len(skipped) > 20:
            _console.print(f"  ... and {len(skipped) - 20} more", markup=False)
    return LoadedTasks(tasks, skipped, spec)


def _none_read(spec: str, kind: str, target: str, path: Path, skipped: list[SkippedRow]) -> str:
    """Why a file gave no task at all: every row failed the same way, most often because the
    file is another benchmark's (a wrong prefix); then the prefix its first row suggests."""
    message = f"{spec}: none of its {len(skipped)} row(s) is a {kind} task (first: {skipped[0]})"
    try:
        looks_like = infer_kind(path)
    except ValueError:
        return message
    if looks_like != kind:
        message += f"; the file looks like {looks_like}: try {looks_like}:{target}"
    return message


def _flag(options: dict[str, str], name: str) -> bool:
    return options.get(name, "").lower() in ("1", "true", "yes", "on")


# GAIA ----------------------------------------------------------------------------------------

def load_gaia(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    if path.is_dir():
        candidates = [path / "metadata.jsonl", path / "metadata.parquet"]
        found = next((c for c in candidates if c.exists()), None)
        if found is None:
            raise FileNotFoundError(f"{path}: no metadata.jsonl or metadata.parquet in this folder")
        path = found
    base = path.parent.resolve()
    split_name = split_for(path, split)
    level = options.get("level")
    text_only = _flag(options, "text_only") or _flag(options, "ws")

    def make(line: int, record: dict[str, Any]) -> Task | None:
        task_id, question = require_fields(record, "task_id", "Question")
        answer = record.get("Final answer")
        if answer is None:
            raise RowError("missing field 'Final answer'")
        answer = str(answer)
        file_name = (record.get("file_name") or "").strip()
        if text_only and file_name:
            return None
        if level and str(record.get("Level")) != level:
            return None
        files = []
        if file_name:
            attachment = base / file_name
            if not attachment.exists() and record.get("file_path"):
                attachment = base / Path(record["file_path"]).name
            if not attachment.exists():
                raise RowError(f"attachment {file_name!r} not found next to {path.name}")
            files.append(attachment)
        text = question
        if file_name:
            text += f"\n\nThe attached file is in your workspace: {file_name}"
        metadata = {"annotator": record.get("Annotator Metadata"), "file_name": file_name or None, "scorer": "gaia"}
        return Task(id=str(task_id), question=text, answer=None if answer == "?" else answer,
                    level=record.get("Level"), family="gaia", split=split_name, metadata=metadata, files=files)

    return each_row(path, skipped, make)


# FRAMES --------------------------------------------------------------------------------------

def _literal_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if not value:
        return []
    try:
        parsed = ast.literal_eval(str(value))
    except (ValueError, SyntaxError) as exc:
        raise RowError(f"wiki_links is not a list literal ({exc})") from None
    if not isinstance(parsed, (list, tuple)):
        raise RowError("wiki_links is not a list")
    return [str(v) for v in parsed]


def load_frames(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    split_name = split_for(path, split)

    def make(line: int, record: dict[str, Any]) -> Task:
        prompt, answer = require_fields(record, "Prompt", "Answer")
        index = record.get("Unnamed: 0") or record.get("") or record.get("id") or str(line)
        links = _literal_list(record.get("wiki_links"))
        if not links:
            links = [v for k, v in record.items() if k and k.startswith("wikipedia_link") and v]
        reasoning = record.get("reasoning_types") or ""
        return Task(id=f"frames-{index}", question=str(prompt).strip(), answer=str(answer).strip(),
                    family="frames", split=split_name,
                    metadata={"wiki_links": links, "reasoning_types": [r.strip() for r in str(reasoning).split("|") if r.strip()],
                              "scorer": "frames_judge"})

    return each_row(path, skipped, make)


# xbench-DeepSearch ---------------------------------------------------------------------------

def xbench_encrypt(plaintext: str, canary: str) -> str:
    """The official scheme: the UTF-8 plaintext XOR-ed with the canary as a repeating key, in base64."""
    key = canary.encode("utf-8")
    data = plaintext.encode("utf-8")
    return base64.b64encode(bytes(b ^ key[i % len(key)] for i, b in enumerate(data))).decode("ascii")


def xbench_decrypt(ciphertext: str, canary: str) -> str:
    key = canary.encode("utf-8")
    if not key:
        raise ValueError("empty canary")
    data = base64.b64decode(ciphertext, validate=True)
    return bytes(b ^ key[i % len(key)] for i, b in enumerate(data)).decode("utf-8")


def load_xbench(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    split_name = split_for(path, split)

    def make(line: int, record: dict[str, Any]) -> Task:
        row_id, prompt, answer, canary = require_fields(record, "id", "prompt", "answer", "canary")
        try:
            question = xbench_decrypt(prompt, canary)
            reference = xbench_decrypt(answer, canary)
            steps = xbench_decrypt(record["reference_steps"], canary) if record.get("reference_steps") else None
        except (ValueError, UnicodeDecodeError) as exc:
            raise RowError(f"cannot decrypt with the row's canary ({exc})") from None
        return Task(id=f"xbench-{row_id}", question=question.strip(), answer=reference.strip(), family="xbench",
                    split=split_name, metadata={"reference_steps": steps, "scorer": "xbench_judge"})

    return each_row(path, skipped, make)


# HotpotQA ------------------------------------------------------------------------------------

def _unique_locator(title: str, seen: set[str]) -> str:
    locator, n = title, 2
    while locator in seen:
        locator = f"{title} ({n})"
        n += 1
    seen.add(locator)
    return locator


def load_hotpotqa(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    split_name = split_for(path, split)

    def make(line: int, record: dict[str, Any]) -> Task:
        seen: set[str] = set()
        documents = []
        supporting: list[str] = []
        if "contexts" in record:  # the processed form: question_text, answers_objects, contexts
            qid, question, answers, contexts = require_fields(record, "question_id", "question_text",
                                                              "answers_objects", "contexts")
            spans = [s for a in answers for s in (a.get("spans") or []) if s]
            if not spans:
                raise RowError("answers_objects has no answer span")
            answer = spans[0]
            for paragraph in contexts:
                title = str(paragraph.get("title") or "untitled")
                locator = _unique_locator(title, seen)
                documents.append({"id": locator, "title": title, "text": str(paragraph.get("paragraph_text", ""))})
                if paragraph.get("is_supporting"):
                    supporting.append(locator)
            level = record.get("level")
        else:  # the original form: _id, question, answer, context [[title, [sentences]]]
            qid, question, answer, context = require_fields(record, "_id", "question", "answer", "context")
            facts = {title for title, _ in record.get("supporting_facts") or []}
            for item in context:
                if not (isinstance(item, (list, tuple)) and len(item) == 2):
                    raise RowError("context items must be [title, sentences]")
                title, sentences = item
                locator = _unique_locator(str(title), seen)
                documents.append({"id": locator, "title": str(title), "text": "".join(sentences)})
                if title in facts:
                    supporting.append(locator)
            level = record.get("level")
        if not documents:
            raise RowError("no context paragraphs")
        return Task(id=str(qid), question=str(question).strip(), answer=str(answer).strip(), level=level,
                    family="hotpotqa", split=split_name, documents=documents,
                    metadata={"supporting": supporting, "type": record.get("type"), "scorer": "hotpotqa_em"})

    return each_row(path, skipped, make)


# GSM8K and plain JSONL -----------------------------------------------------------------------

def load_gsm8k(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    split_name = split_for(path, split)

    def make(line: int, record: dict[str, Any]) -> Task:
        question, solution = require_fields(record, "question", "answer")
        if "####" not in str(solution):
            raise RowError("answer has no '####' final answer")
        final = str(solution).rsplit("####", 1)[1].strip().replace(",", "")
        if not final:
            raise RowError("nothing after '####'")
        return Task(id=str(record.get("id") or f"gsm8k-{line}"), question=str(question).strip(), answer=final,
                    family="gsm8k", split=split_name, metadata={"solution": solution, "scorer": "gsm8k_flexible"})

    return each_row(path, skipped, make)


def load_jsonl(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    split_name = split_for(path, split)

    def make(line: int, record: dict[str, Any]) -> Task:
        (question,) = require_fields(record, "question")
        answer = record.get("answer")
        check = record.get("check_command")
        if answer is None and not check:
            raise RowError("needs 'answer' (or 'check_command')")
        tests = record.get("check_tests") or {}
        if check and not tests:
            raise RowError("a check_command needs check_tests: the ids of the tests that must pass "
                           "(its exit status alone never decides; see toolself.evals.checks)")
        metadata = dict(record.get("metadata") or {})
        if record.get("scorer"):
            metadata["scorer"] = record["scorer"]
        files = [(path.parent / f) for f in record.get("files") or []]
        for file in files:
            if not file.exists():
                raise RowError(f"file {file.name!r} not found next to {path.name}")
        return Task(id=str(record.get("id") or f"{path.stem}-{line}"), question=str(question).strip(),
                    answer=None if answer is None else str(answer), level=record.get("level"), family="jsonl",
                    split=str(record.get("split") or split_name), metadata=metadata, files=files,
                    check_command=check, check_files=dict(record.get("check_files") or {}),
                    check_tests={"tests": [str(t) for t in tests]} if isinstance(tests, list) else dict(tests))

    return each_row(path, skipped, make)


_LOADERS: dict[str, Callable[[Path, str | None, dict[str, str], list[SkippedRow]], list[Task]]] = {
    "gaia": load_gaia, "frames": load_frames, "xbench": load_xbench, "swebench": load_swebench,
    "hotpotqa": load_hotpotqa, "gsm8k": load_gsm8k, "jsonl": load_jsonl,
}


def infer_kind(path: Path) -> str:
    """The format of a file from its first row; an error naming the candidates when unsure."""
    if path.is_dir():
        if (path / "metadata.jsonl").exists() or (path / "metadata.parquet").exists():
            return "gaia"
        raise ValueError(f"{path}: a folder is read as GAIA only when it holds metadata.jsonl; add a prefix")
    if path.name.startswith("metadata.") and path.suffix in (".jsonl", ".parquet"):
        return "gaia"
    first = next(read_rows(path, []), None)
    if first is None:
        raise ValueError(f"{path}: no readable rows to infer the format from; add a prefix such as jsonl:")
    keys = set(first[1])
    if {"prompt", "answer", "canary"} <= keys:
        return "xbench"
    if {"Prompt", "Answer"} <= keys:
        return "frames"
    if {"instance_id", "base_commit"} <= keys:
        return "swebench"
    if {"Question", "Final answer"} <= keys:
        return "gaia"
    if {"question_text", "contexts"} <= keys or {"question", "context", "supporting_facts"} <= keys:
        return "hotpotqa"
    if {"question", "answer"} <= keys:
        return "gsm8k" if "####" in str(first[1]["answer"]) else "jsonl"
    raise ValueError(f"{path}: cannot tell the format from the fields {sorted(keys)}; "
                     f"prefix the path with one of {', '.join(k + ':' for k in KINDS if k != 'builtin')}")
