"""The test runner's own per-test report, sent to the host through a descriptor it opened.

This file is not imported by toolself: `checks` copies it into a private, host-owned folder
that goes first on the check's PYTHONPATH, with a `sitecustomize` that imports it, so every
Python the check starts loads it before any file of the workspace. It must stay standard
library only: the sandbox's Python may not be able to import toolself at all.

What it does, once per process, before the test command imports anything:
- takes the report descriptor named by TOOLSELF_CHECK_REPORT_FD (removing the variable, and
  moving the descriptor to a non-inheritable copy, so that processes the tests start never
  hold it) and writes one JSON line per test outcome and one `end` line per finished run;
- hooks unittest's `TestResult` (python -m unittest, Django's runner) and, named in
  PYTEST_PLUGINS, pytest's reports;
- imports unittest (and pytest, when asked) before the workspace is on sys.path, so that a
  planted `unittest.py` or `pytest.py` cannot stand in for the runner;
- remembers the assertion and reporting functions and, at the end of a run, reports any that
  were replaced, which the host treats as a failed check.

Code under test runs in this same process, so it can still forge this report if it knows
how; see docs/security.md for what that leaves open.

PYTEST_DONT_REWRITE (pytest loads this as a plugin after `sitecustomize` imported it)
"""

import json
import os
import sys

_FD = -1
_FD_NAME = "TOOLSELF_CHECK_REPORT_FD"


def _take_descriptor() -> int:
    text = os.environ.pop(_FD_NAME, "")
    if not text.isdigit():
        return -1
    original = int(text)
    try:
        copy = os.dup(original)  # descriptors made by dup are not inheritable (PEP 446)
        os.close(original)
    except OSError:
        return -1
    return copy


def emit(record: dict) -> None:
    if _FD < 0:
        return
    line = (json.dumps(record, ensure_ascii=True) + "\n").encode()
    try:
        os.write(_FD, line)  # one write per record: whole lines even with several writers
    except OSError:
        pass


_GUARDED: dict = {}


def _guard(owner: object, names: list) -> None:
    for name in names:
        value = owner.__dict__.get(name) if hasattr(owner, "__dict__") else None
        if value is not None:
            _GUARDED[(owner, name)] = value


def _tampered() -> list:
    changed = []
    for (owner, name), value in _GUARDED.items():
        if owner.__dict__.get(name) is not value:
            changed.append(f"{getattr(owner, '__name__', owner)}.{name}")
    return changed


def _end(runner: str) -> None:
    changed = _tampered()
    if changed:
        emit({"event": "tampered", "names": changed})
    emit({"event": "end", "runner": runner})


# unittest ------------------------------------------------------------------------------------

def _hook_unittest() -> None:
    import unittest
    import unittest.case
    import unittest.result

    result = unittest.result.TestResult
    outcomes = {"addSuccess": "passed", "addFailure": "failed", "addError": "error", "addSkip": "skipped",
                "addExpectedFailure": "xfailed", "addUnexpectedSuccess": "xpassed"}

    def wrap(name: str, outcome: str):
        original = getattr(result, name)

        def hooked(self, test, *args, **kwargs):
            emit({"id": _unittest_id(test), "outcome": outcome})
            return original(self, test, *args, **kwargs)

        hooked.__name__ = name
        return hooked

    for name, outcome in outcomes.items():
        setattr(result, name, wrap(name, outcome))
    original_subtest = result.addSubTest

    def addSubTest(self, test, subtest, err):
        if err is not None:
            emit({"id": _unittest_id(test), "outcome": "failed", "subtest": str(subtest)})
        return original_subtest(self, test, subtest, err)

    result.addSubTest = addSubTest
    original_stop = result.stopTestRun

    def stopTestRun(self):
        _end("unittest")
        return original_stop(self)

    result.stopTestRun = stopTestRun
    case = unittest.case.TestCase
    _guard(case, sorted(n for n in vars(case) if n.startswith(("assert", "fail")) or n in
                        ("run", "__call__", "_callTestMethod", "_callSetUp", "_callTearDown", "_addSkip")))
    _guard(result, [*outcomes, "addSubTest", "stopTestRun"])


def _unittest_id(test) -> str:
    try:
        return str(test.id())
    except Exception:
        return repr(test)


# pytest (registered through PYTEST_PLUGINS) --------------------------------------------------

def _pytest_outcome(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return report.outcome


def pytest_runtest_logreport(report) -> None:
    if report.when != "call" and report.outcome == "passed":
        return
    emit({"id": report.nodeid, "outcome": _pytest_outcome(report), "when": report.when})


def _preimport_pytest() -> None:
    try:
        import _pytest.python
        import _pytest.runner
        import pytest  # noqa: F401
    except ImportError:
        return
    _guard(_pytest.runner, ["call_and_report", "runtestprotocol", "pytest_runtest_makereport"])
    _guard(_pytest.python, ["pytest_pyfunc_call"])


def pytest_configure(config) -> None:
    """Also report each test as the innermost wrapper of the report hook sees it, and by how
    its call ended: a `conftest.py` wrapper that rewrites a failed report as passed runs outside
    this one, and the host keeps a failure from any of the records of a test."""
    import pytest

    class CallOutcomes:
        @pytest.hookimpl(hookwrapper=True, trylast=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            report = outcome.get_result()
            status = _pytest_outcome(report)
            raised = call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
            if raised and status == "passed":
                status = "failed"
            if call.when == "call" or status != "passed":
                emit({"id": report.nodeid, "outcome": status, "when": call.when, "seen": "inner"})

    config.pluginmanager.register(CallOutcomes(), "toolself_check_calls")


def pytest_sessionfinish(session, exitstatus) -> None:
    _end("pytest")


def _start() -> None:
    global _FD
    _FD = _take_descriptor()
    if _FD < 0:
        return
    _hook_unittest()
    if os.environ.pop("TOOLSELF_CHECK_PYTEST", "") == "1":
        _preimport_pytest()
    sys.dont_write_bytecode = True


_start()
