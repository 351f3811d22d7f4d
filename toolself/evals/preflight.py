"""Fail before work: every task's needs checked against what the run provides.

A run whose every search fails, or whose free-text answers are scored without the judge they
ask for, costs hours and reports a number that means nothing. So before the first attempt,
each task's needs (`TaskNeeds`: web search, page reading, a judge, attachments, a test
runner) are compared with what is configured (`Provided`: the pool's tools, the web
settings, the judge), and anything missing is one error that names, for each need, the tasks
that have it and the setting that provides it. `--allow-missing NEED` runs anyway; a judge
allowed missing is replaced by the declared fallback scorer (the benchmark's exact-match
rules), and the run says so in its warnings.

    check(tasks_by_spec, Provided.of(pool, web, judge=None), allow={"judge"})  # -> warnings
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, get_args

from toolself.tools.web.settings import WebSettings

Need = Literal["search", "read", "judge", "attachments", "tests"]
NEEDS: tuple[str, ...] = get_args(Need)

# The benchmarks whose questions are answered from the open web when a task has no collection.
WEB_FAMILIES = frozenset({"frames", "xbench", "gaia"})

WHAT = {"search": "web search", "read": "reading web pages", "judge": "an LLM judge for free-text answers",
        "attachments": "reading attached files", "tests": "a test runner"}
HOW = {
    "search": "choose a backend with --search searxng|serper|tavily|brave|jina and set its variable "
              "(SEARX_HOST, SERPER_API_KEY, TAVILY_API_KEY, BRAVE_API_KEY or JINA_API_KEY), and keep "
              "`search` in --tools",
    "read": "keep `visit` in --tools and allow the web: a search backend, --reader jina (JINA_READER_URL), "
            "or TOOLSELF_ONLINE=1",
    "judge": "pass --judge openai:NAME@URL",
    "attachments": "keep `file_analyzer` in --tools, check the task files exist, and give images a vision model "
                   "(--vision-model openai:NAME@URL)",
    "tests": "make the test runner available (see the task's message)",
}


@dataclass(frozen=True)
class TaskNeeds:
    """What one task needs from the run. `problems` holds what the loader already knows is
    missing for it (a SWE-bench environment that is not there)."""

    search: bool = False
    read: bool = False
    judge: bool = False
    attachments: tuple[str, ...] = ()
    tests: bool = False
    problems: tuple[str, ...] = ()

    def names(self) -> list[str]:
        return [n for n in NEEDS if getattr(self, n)]


def needs_of(task: Any) -> TaskNeeds:
    """A task's needs, from the record its loader made: its family, collection, files, check
    command and scorer, and `metadata["needs"]` for what a JSONL task declares itself."""
    metadata = getattr(task, "metadata", {}) or {}
    declared = set(metadata.get("needs") or ())
    unknown = declared - set(NEEDS)
    if unknown:
        raise ValueError(f"task {task.id}: unknown needs {sorted(unknown)}; known: {list(NEEDS)}")
    own_collection = task.documents is not None or task.collection_path is not None
    web = not own_collection and task.family in WEB_FAMILIES
    files = tuple(str(p) for p in task.files)
    refusal = getattr(task.setup, "refusal", None)
    return TaskNeeds(search=web or "search" in declared, read=web or "read" in declared,
                     judge=str(metadata.get("scorer") or "").endswith("judge") or "judge" in declared,
                     attachments=files if files or "attachments" in declared else (),
                     tests=bool(task.check_command) or "tests" in declared,
                     problems=(refusal,) if refusal else ())


@dataclass(frozen=True)
class Provided:
    """docs: the run has a document collection (`--docs`) for tasks without their own."""

    tools: frozenset[str]
    web: WebSettings
    judge: bool
    docs: bool = False

    @classmethod
    def of(cls, pool: Any, web: WebSettings, judge: Any, docs: Any = None) -> "Provided":
        return cls(frozenset(t.name for t in pool), web, judge is not None, docs is not None)


def unmet(needs: TaskNeeds, provided: Provided) -> dict[str, str]:
    """Need -> why it is not met, for this task."""
    out: dict[str, str] = {}
    if needs.search and ("search" not in provided.tools or provided.web.search is None and not provided.docs):
        out["search"] = "no web search backend" if "search" in provided.tools else "`search` is not in the pool"
    if needs.read and ("visit" not in provided.tools or not provided.web.web_allowed and not provided.docs):
        out["read"] = "the web is not allowed" if "visit" in provided.tools else "`visit` is not in the pool"
    if needs.judge and not provided.judge:
        out["judge"] = "no --judge"
    if needs.attachments:
        absent = [f for f in needs.attachments if not Path(f).exists()]
        if "file_analyzer" not in provided.tools:
            out["attachments"] = "`file_analyzer` is not in the pool"
        elif absent:
            out["attachments"] = f"missing file {absent[0]}"
        elif provided.web.vision_model is None and (images := [f for f in needs.attachments if _is_image(f)]):
            out["attachments"] = f"{images[0]} is an image and there is no --vision-model"
    if needs.tests and (needs.problems or shutil.which("bash") is None):
        out["tests"] = needs.problems[0] if needs.problems else "bash is not installed"
    return out


def _is_image(path: str) -> bool:
    """Whether an attachment is an image `file_analyzer` shows to the vision model (by its
    first bytes, as the tool decides)."""
    from toolself.tools.vision import SIGNATURE_BYTES, image_type

    try:
        with open(path, "rb") as handle:
            return image_type(handle.read(SIGNATURE_BYTES)) is not None
    except OSError:
        return False


def known_needs(names: Iterable[str]) -> set[str]:
    unknown = set(names) - set(NEEDS)
    if unknown:
        raise ValueError(f"--allow-missing {sorted(unknown)}: expected some of {list(NEEDS)}")
    return set(names)


class PreflightError(ValueError):
    """Tasks need what the run does not provide; nothing was run."""


def check(datasets: Mapping[str, Sequence[Any]], provided: Provided, allow: Iterable[str] = ()) -> list[str]:
    """Raise `PreflightError` naming every unmet need (except those in `allow`); return the
    warnings for needs allowed missing, for the run's header."""
    allow = known_needs(allow)
    found: dict[str, list[tuple[str, str, str]]] = {}
    for spec, tasks in datasets.items():
        for task in tasks:
            for need, why in unmet(needs_of(task), provided).items():
                found.setdefault(need, []).append((spec, task.id, why))
    errors, warnings = [], []
    for need in NEEDS:
        if need not in found:
            continue
        hits = found[need]
        specs = ", ".join(dict.fromkeys(spec for spec, _, _ in hits))
        line = (f"{WHAT[need]}: {len(hits)} task(s) of {specs} need it (first: {hits[0][1]}, {hits[0][2]}); "
                f"{HOW[need]}")
        if need in allow:
            fallback = " (answers scored by the declared fallback, exact_fallback: normalised exact match)" \
                if need == "judge" else ""
            warnings.append(f"allowed missing {line}{fallback}")
        else:
            errors.append(line)
    if errors:
        missing = ",".join(n for n in NEEDS if n in found and n not in allow)
        raise PreflightError("these tasks need what this run does not provide; nothing was run:\n"
                             + "\n".join(f"  - {e}" for e in errors)
                             + f"\nProvide it, or pass --allow-missing {missing} to run anyway.")
    return warnings



def check_free_task(options: Any, pool: Any) -> list[str]:
    """`toolself run`'s check: a task in words declares no needs, so only a pool that was asked
    for `search` or `visit` by name (`--tools`) must have a source for them; the default pool
    gets a warning instead, since the task may need neither."""
    known_needs(options.allow_missing)
    provided = Provided.of(pool, options.web, options.judge)
    sourceless = options.docs is None
    missing = {}
    if sourceless and "search" in provided.tools and provided.web.search is None:
        missing["search"] = "`search` has no document collection (--docs) and no web backend"
    if sourceless and "visit" in provided.tools and not provided.web.web_allowed:
        missing["read"] = "`visit` can read no collection (--docs) and the web is not allowed"
    asked = set(options.tools or ())
    errors = [f"{why}; {HOW[need]}" for need, why in missing.items()
              if {"search": "search", "read": "visit"}[need] in asked and need not in options.allow_missing]
    if errors:
        raise PreflightError("\n".join(errors) + f"\nOr pass --allow-missing {','.join(missing)} to run anyway.")
    return [f"{why}; {HOW[need]}" for need, why in missing.items()]


@dataclass
class CheckingLoader:
    """A runner `loader` that checks each dataset's needs as it is loaded: the runner loads
    every dataset before it loads a model or starts an attempt, so an unmet need stops the
    run before any work. Warnings for needs allowed missing collect in `warnings`."""

    provided: Provided
    allow: frozenset[str] = frozenset()
    warnings: list[str] = field(default_factory=list)

    def __call__(self, spec: str, split: str, limit: int | None, seed: int) -> list[Any]:
        from toolself.evals.loaders import load_tasks

        tasks = load_tasks(spec, split=split, limit=limit, seed=seed)
        self.warnings.extend(check({spec: tasks}, self.provided, self.allow))
        return tasks


def check_specs(options: Any, specs: Sequence[tuple[str, str, int | None, int]]) -> list[str]:
    """Load each (spec, split, limit, seed) and check its tasks against `options` (a
    `ToolOptions`), for commands that hand the run to something else (a CAT pipeline)."""
    pool = options.pool()
    try:
        loader = CheckingLoader(Provided.of(pool, options.web, options.judge, options.docs), options.allow_missing)
        for spec, split, limit, seed in specs:
            loader(spec, split, limit, seed)
        return loader.warnings
    finally:
        pool.close()
