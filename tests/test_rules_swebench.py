"""SWE-bench as its official harness scores it: the repository's own test command over the test
patch's files, the log parsed per test by swebench's own parser, each listed test decided from
that map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolself.evals.loaders import load_tasks
from toolself.evals.rules.swebench import decide, parse_test_log, selection, swebench_verdict
from toolself.evals.task import Task

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples" / "swebench_lite" / "test_sample.json"


def record(repo: str, version: str, files: list[str], fail_to_pass: list[str], pass_to_pass=()) -> dict:
    patch = "".join(f"diff --git a/{f} b/{f}\n--- a/{f}\n+++ b/{f}\n@@ -1 +1 @@\n-x\n+y\n" for f in files)
    return {"instance_id": f"{repo.replace('/', '__')}-1", "repo": repo, "version": version, "base_commit": "0" * 40,
            "problem_statement": "p", "test_patch": patch, "FAIL_TO_PASS": json.dumps(fail_to_pass),
            "PASS_TO_PASS": json.dumps(list(pass_to_pass))}


def load(tmp_path: Path, row: dict) -> Task:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return load_tasks(f"swebench:{path}")[0]


def test_sympy_runs_bin_test_on_the_patched_test_files_never_pytest_k_over_the_repository(tmp_path):
    task = load(tmp_path, record("sympy/sympy", "1.12", ["sympy/core/tests/test_numbers.py"], ["test_Float"]))
    assert "bin/test -C --verbose sympy/core/tests/test_numbers.py;" in task.check_command
    assert " -k " not in task.check_command and "pytest" not in task.check_command


def test_junk_test_ids_never_reach_the_command_line(tmp_path):
    task = load(tmp_path, record("pytest-dev/pytest", "4.5", ["testing/logging/test_reporting.py"],
                                 ["testing/logging/test_reporting.py::test_x"], ["[100%]", "["]))
    assert task.check_command.endswith("pytest -rA testing/logging/test_reporting.py; : '>>>>> End Test Output'; }")


def test_an_id_cut_at_a_space_by_the_parser_matches_the_same_cut_id_in_the_dataset():
    log = "PASSED lib/matplotlib/tests/test_axes.py::test_stem[png-w/ line collection]\n"
    statuses = parse_test_log("matplotlib/matplotlib", log)
    verdict = decide({"FAIL_TO_PASS": ["lib/matplotlib/tests/test_axes.py::test_stem[png-w/"]}, statuses)
    assert verdict.resolved


def test_a_listed_id_the_parser_also_produces_from_the_log_is_found():
    statuses = parse_test_log("pytest-dev/pytest", "PASSED [100%]\nPASSED testing/test_x.py::test_a\n")
    assert decide({"FAIL_TO_PASS": ["testing/test_x.py::test_a"], "PASS_TO_PASS": ["[100%]"]}, statuses).resolved


def test_only_the_output_between_the_harness_markers_is_parsed():
    log = ("test_a (m.C) ... FAIL\n>>>>> Start Test Output\ntest_a (m.C) ... ok\n>>>>> End Test Output\n"
           "test_b (m.C) ... ok\n")
    assert parse_test_log("django/django", log) == {"test_a (m.C)": "PASSED"}


@pytest.mark.parametrize("log, resolved, reason", [
    ("test_urlfield_clean_invalid (forms_tests.field_tests.test_urlfield.URLFieldTest) ... ok\n"
     "test_urlfield_clean_not_required (forms_tests.field_tests.test_urlfield.URLFieldTest) ... ok\n",
     True, "FAIL_TO_PASS 2/2"),
    ("test_urlfield_clean_invalid (forms_tests.field_tests.test_urlfield.URLFieldTest) ... ok\n"
     "test_urlfield_clean_not_required (forms_tests.field_tests.test_urlfield.URLFieldTest) ... FAIL\n",
     False, "FAIL_TO_PASS 1/2"),
    ("test_urlfield_clean_invalid (forms_tests.field_tests.test_urlfield.URLFieldTest) ... ok\n",
     False, "FAIL_TO_PASS 1/2"),                  # a listed test missing from the log has failed
])
def test_each_listed_test_is_decided_from_the_log(log, resolved, reason):
    task = load_tasks(f"swebench:{SAMPLE}", limit=1)[0]
    task.check_tests = {"FAIL_TO_PASS": task.check_tests["FAIL_TO_PASS"], "PASS_TO_PASS": []}
    verdict = swebench_verdict(task, log)
    assert verdict.correct is resolved and verdict.scorer == "swebench" and reason in verdict.reason


def test_a_django_test_outside_the_patched_modules_is_reported_unselected():
    row = record("django/django", "4.1", ["tests/forms_tests/field_tests/test_urlfield.py"],
                 ["test_a (forms_tests.field_tests.test_urlfield.URLFieldTest)", "test_b (admin_views.tests.T)"])
    found = selection(row)
    assert found.files == ["forms_tests.field_tests.test_urlfield"]
    assert found.unselected == ["test_b (admin_views.tests.T)"] and not found.selectable


def test_every_shared_sample_instance_has_all_its_tests_selected():
    rows = json.loads(SAMPLE.read_text())
    assert [selection(r).selectable for r in rows] == [True, True, True]


def test_a_repository_without_an_official_spec_needs_a_test_command(tmp_path):
    row = record("calc/calc", "1.0", ["test_calc.py"], ["test_calc.py::test_add"])
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="no official SWE-bench spec for calc/calc 1.0: give test_cmd="):
        load_tasks(f"swebench:{path}", quiet=True)
