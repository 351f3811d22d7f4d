"""SWE-bench scored the way its official harness scores it, using the `swebench` package's own
specs and log parsers (swebench 4.x: the last line that ships them; 5.x moved them into images).

The harness does not run the FAIL_TO_PASS / PASS_TO_PASS ids: it runs the repository's own test
command (`MAP_REPO_VERSION_TO_SPECS[repo][version]["test_cmd"]`) over the test files the
`test_patch` touches (`get_test_directives`: file paths, or dotted modules for Django), parses the
log with the repository's parser (`MAP_REPO_TO_PARSER`) into {test id: status}, and decides each
listed test from that map (`get_eval_tests_report`): resolved when every FAIL_TO_PASS and every
PASS_TO_PASS test passed. So ids the parser itself cuts at a space (`test_stem[png-w/`) match, no
`-k` expression is ever built from the ids, and sympy runs `bin/test` on a few files, not pytest
on the whole repository.

Each instance needs its own Python environment (the spec's `python` version and packages, the
repository installed in it); toolself never builds one. A check for an instance with an
official spec refuses to run without one (`SweBenchEnvironmentMissing`).

swebench's package `__init__`s import docker and modal; only the pure modules are loaded here
(`pip install --no-deps "swebench>=4,<5" python-dotenv unidiff`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
TEST_PATCH_FILE = ".toolself/test.patch"


class SweBenchUnavailable(RuntimeError):
    """The swebench package (4.x) is not importable here."""


class SweBenchEnvironmentMissing(RuntimeError):
    """An instance's Python environment was not given; its tests cannot run faithfully."""


@dataclass(frozen=True)
class Harness:
    specs: dict[str, dict[str, dict[str, Any]]]
    parsers: dict[str, Callable[..., dict[str, str]]]
    test_directives: Callable[[dict[str, Any]], list[str]]
    tests_report: Callable[..., dict[str, dict[str, list[str]]]]
    resolution: Callable[[dict[str, dict[str, list[str]]]], str]
    full: str
    version: str


@functools.cache
def harness() -> Harness:
    """swebench's specs, parsers and grading, without running its package `__init__`s."""
    spec = importlib.util.find_spec("swebench")
    if spec is None or not spec.submodule_search_locations:
        raise SweBenchUnavailable('SWE-bench scoring needs the swebench package: '
                                  'pip install --no-deps "swebench>=4,<5" python-dotenv unidiff')
    root = Path(list(spec.submodule_search_locations)[0])
    for name, path in (("swebench", root), ("swebench.harness", root / "harness")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    try:
        constants = importlib.import_module("swebench.harness.constants")
        parsers = importlib.import_module("swebench.harness.log_parsers")
        python_spec = importlib.import_module("swebench.harness.test_spec.python")
        grading = importlib.import_module("swebench.harness.grading")
        specs, parser_map = constants.MAP_REPO_VERSION_TO_SPECS, parsers.MAP_REPO_TO_PARSER
    except (ImportError, AttributeError) as exc:
        raise SweBenchUnavailable(f"the installed swebench cannot provide specs and log parsers ({exc}); "
                                  'pip install --no-deps "swebench>=4,<5" python-dotenv unidiff') from exc
    version = (root / "__init__.py").read_text(encoding="utf-8").split('__version__ = "', 1)[-1].split('"')[0]
    return Harness(specs, parser_map, python_spec.get_test_directives, grading.get_eval_tests_report,
                   grading.get_resolution_status, grading.ResolvedStatus.FULL.value, version)


def instance_spec(repo: str, version: str | None) -> dict[str, Any] | None:
    """The official spec of (repo, version): test_cmd, python, install, ... or None."""
    return harness().specs.get(repo, {}).get(str(version))


def test_files(repo: str, test_patch: str) -> list[str]:
    """What the official harness passes its test command: the test files of the test patch."""
    return list(harness().test_directives({"repo": repo, "test_patch": test_patch}))


def _exports(spec: dict[str, Any]) -> list[str]:
    return [c for c in spec.get("eval_commands", []) if c.startswith("export ")]


def swebench_test_command(task: Any) -> str:
    """The shell command that runs an instance's tests: the spec's test command (or the loader's
    `test_cmd`) over the test files, between the harness's start and end markers."""
    meta = task.metadata
    spec = instance_spec(meta["repo"], meta.get("version")) or {}
    command = meta.get("test_cmd") or spec.get("test_cmd")
    if not command:
        raise ValueError(f"{task.id}: no SWE-bench spec for {meta['repo']} {meta.get('version')}; "
                         "give test_cmd= (and log_parser=) in the spec")
    files = " ".join(shlex.quote(d) for d in test_files(meta["repo"], meta["test_patch"]))
    steps = _exports(spec) + [f": '{START}'", f"{command} {files}", f": '{END}'"]
    return "; ".join(steps)


def swebench_check_command(task: Any) -> str:
    """Restore the files the test patch touches, apply it, then run the tests (the harness's
    order, so an attempt cannot pass by editing the tests). Exits with the test command's status;
    the verdict comes from the log (`swebench_verdict`)."""
    restore = []
    for match in re.finditer(r"^diff --git a/(\S+) b/(\S+)\n((?:(?!diff --git).*\n)*)", task.metadata["test_patch"],
                             re.MULTILINE):
        path, header = match.group(2), match.group(3)
        if re.search(r"^new file mode", header, re.MULTILINE):
            restore.append(f"rm -f -- {shlex.quote(path)}")
        else:
            restore.append(f"git checkout -q HEAD -- {shlex.quote(path)}")
    prefix = task.metadata.get("environment")
    path = [f"export PATH={shlex.quote(str(Path(prefix) / 'bin'))}:\"$PATH\""] if prefix else []
    steps = path + restore + [f"git apply --whitespace=nowarn {TEST_PATCH_FILE}"]
    return " && ".join(steps) + f" && {{ {swebench_test_command(task)}; }}"


def _between_markers(log: str) -> str:
    if START in log and END in log.split(START, 1)[1]:
        return log.split(START, 1)[1].split(END, 1)[0]
    return log.split(START, 1)[1] if START in log else log


def parse_test_log(repo: str, log: str, parser: str | None = None) -> dict[str, str]:
    """{test id: PASSED | FAILED | SKIPPED | ERROR | XFAIL} from a test log, by the repository's
    official parser (or the one named: a repository key of `MAP_REPO_TO_PARSER`)."""
    parsers = harness().parsers
    name = parser or repo
    if name not in parsers:
        raise ValueError(f"no SWE-bench log parser for {name!r} (known: {', '.join(sorted(parsers))})")
    return parsers[name](_between_markers(log), None)


@dataclass
class Verdict:
    resolved: bool
    report: dict[str, dict[str, list[str]]]

    def counts(self) -> str:
        return ", ".join(f"{kind} {len(self.report[kind]['success'])}/"
                         f"{len(self.report[kind]['success']) + len(self.report[kind]['failure'])}"
                         for kind in ("FAIL_TO_PASS", "PASS_TO_PASS"))


def decide(tests: dict[str, list[str]], statuses: dict[str, str]) -> Verdict:
    """The harness's decision: every FAIL_TO_PASS and PASS_TO_PASS test passed (or xfailed)."""
    h = harness()
    report = h.tests_report(statuses, {"FAIL_TO_PASS": tests.get("FAIL_TO_PASS", []),
                                       "PASS_TO_PASS": tests.get("PASS_TO_PASS", [])})
    return Verdict(h.resolution(report) == h.full, report)


def swebench_verdict(task: Any, log: str) -> Any:
    """A `Score` named `swebench` for one test log of one attempt at an instance."""
    from toolself.evals.judge import Score

    statuses = parse_test_log(task.metadata["repo"], log, task.metadata.get("log_parser"))
    verdict = decide(task.check_tests, statuses)
    report = verdict.report
    metrics = {kind.lower(): (len(report[kind]["success"]) / total if (total := len(report[kind]["success"]) +
                                                                       len(report[kind]["failure"])) else 1.0)
               for kind in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    reason = ("resolved: " if verdict.resolved else "not resolved: ") + verdict.counts() + " tests passed"
    return Score(verdict.resolved, "swebench", reason, {"report": report, "parsed_tests": len(statuses)},
                 metrics=metrics)


def require_environment(task: Any) -> None:
    """Refuse, with what is needed, an instance with an official spec but no environment."""
    meta = task.metadata
    if meta.get("environment") or meta.get("test_cmd"):
        return
    raise SweBenchEnvironmentMissing(
        f"{task.id}: {meta['repo']} {meta.get('version')} runs its tests in its own environment "
        f"({environment_needs(meta['repo'], meta.get('version'))}) and none was given: add envs=DIR to the "
        f"spec, with DIR/{task.id}/bin/python or DIR/{environment_name(meta['repo'], meta.get('version'))}/bin/python")


def environment_needs(repo: str, version: str | None) -> str:
    """What the official spec asks of an instance's environment, in words."""
    spec = instance_spec(repo, version) or {}
    needs = [f"Python {spec.get('python', '?')}"]
    if spec.get("packages"):
        needs.append(f"packages: {spec['packages']}")
    if spec.get("pip_packages"):
        needs.append("pip: " + " ".join(spec["pip_packages"]))
    needs.append(f"the repository installed with `{spec.get('install', 'pip install -e .')}`")
    return ", ".join(needs)


def environment_name(repo: str, version: str | None) -> str:
    return f"{repo.replace('/', '__')}__{version}"


@dataclass
class Selection:
    """Whether the official selection (the test patch's files) covers an instance's tests."""

    instance_id: str
    repo: str
    files: list[str]
    unselected: list[str]
    reason: str

    @property
    def selectable(self) -> bool:
        return not self.reason and not self.unselected


def _test_location(repo: str, test: str) -> str | None:
    """The file (or Django module) a test id names, when the id says; None for bare names."""
    if "::" in test:
        return test.split("::", 1)[0]
    match = re.match(r"^\S+ \(([\w.]+)\)", test)
    if match and repo == "django/django":
        return match.group(1)
    return None


def selection(record: dict[str, Any]) -> Selection:
    """For counting and for the docs: the files an instance's tests would run, and which listed
    tests lie outside them (by the id's own file or module; ids without one, such as sympy's bare
    names or Django's docstring-named tests, are taken as inside a selected file)."""
    import json

    repo, version = str(record["repo"]), str(record.get("version"))
    tests = [t for key in ("FAIL_TO_PASS", "PASS_TO_PASS")
             for t in (json.loads(record[key]) if isinstance(record[key], str) else record[key])]
    if instance_spec(repo, version) is None:
        return Selection(str(record["instance_id"]), repo, [], [], f"no official spec for {repo} {version}")
    files = test_files(repo, str(record["test_patch"]))
    if not files:
        return Selection(str(record["instance_id"]), repo, [], [], "the test patch touches no test file")
    unselected = []
    for test in tests:
        where = _test_location(repo, test)
        if where is None:
            continue
        inside = where in files if repo != "django/django" else any(
            where == f or where.startswith(f + ".") for f in files)
        if not inside:
            unselected.append(test)
    return Selection(str(record["instance_id"]), repo, files, unselected, "")
