"""Tables, plots and per-task comparisons from eval runs; the `eval` and `report` commands."""

from __future__ import annotations

import csv
import json

import pytest
import typer
from typer.testing import CliRunner

from http_fixtures import serving
from test_runner import POOL, number_in, policy, write_tasks
from toolself.evals.eval_cli import eval_command, report_command
from toolself.evals.records import AttemptRecord, MethodStore
from toolself.evals.report import aggregate, dataset_labels, short_dataset, write_report
from toolself.evals.runner import run_eval
from toolself.models.scripted import ScriptedModel, call

PNG = b"\x89PNG\r\n\x1a\n"


def rec(task_id, correct, method="m", dataset="builtin:research", repeat=0, **extra) -> AttemptRecord:
    return AttemptRecord(dataset=dataset, task_id=task_id, method=method, repeat=repeat, status="ok",
                         correct=correct, **extra)


def write_run(folder, records, methods=None):
    folder.mkdir(parents=True, exist_ok=True)
    methods = methods or list(dict.fromkeys(r.method for r in records))
    (folder / "run.json").write_text(json.dumps({"identity": {"model": "scripted", "split": "heldout", "repeats": 1},
                                                 "last_command": {"methods": methods}}))
    for m in methods:
        store = MethodStore.open(folder / m)
        for r in records:
            if r.method == m:
                store.commit(r, None)
        store.close()
    return folder


def commands() -> typer.Typer:
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("report")(report_command)
    return app


def test_dataset_names_are_short_unless_two_would_clash():
    assert short_dataset("builtin:research") == "research"
    assert short_dataset("builtin:code?n=5") == "code"
    assert short_dataset("gaia:/data/gaia/metadata.jsonl") == "gaia"
    assert short_dataset("jsonl:/data/my_questions.jsonl") == "my_questions"
    labels = dataset_labels(["frames:/a/frames.tsv", "frames:/b/frames.tsv", "builtin:data"])
    assert labels == {"frames:/a/frames.tsv": "frames:/a/frames.tsv", "frames:/b/frames.tsv": "frames:/b/frames.tsv",
                      "builtin:data": "data"}


def test_a_cell_is_the_mean_over_repeats_with_the_standard_error_across_them():
    records = [rec("a", True, repeat=0), rec("b", True, repeat=0), rec("a", True, repeat=1), rec("b", False, repeat=1)]
    cell = aggregate(records).cell("m", "builtin:research")
    assert cell.accuracy == pytest.approx(0.75)
    assert cell.stderr == pytest.approx(0.25)  # stdev([1.0, 0.5]) / sqrt(2)
    assert (cell.tasks, cell.attempts, cell.repeats) == (2, 4, 2)


def test_the_average_column_averages_datasets_within_each_repeat():
    records = [rec("a", True, dataset="d1", repeat=0), rec("a", False, dataset="d2", repeat=0),
               rec("b", True, dataset="d2", repeat=0), rec("c", False, dataset="d2", repeat=0),
               rec("a", True, dataset="d1", repeat=1), rec("a", True, dataset="d2", repeat=1),
               rec("b", True, dataset="d2", repeat=1), rec("c", True, dataset="d2", repeat=1)]
    average = aggregate(records).average("m")
    # repeat 0: (1 + 1/3) / 2; repeat 1: (1 + 1) / 2 -- not the pooled 6/8
    assert average.accuracy == pytest.approx(((1 + 1 / 3) / 2 + 1) / 2)
    assert average.stderr == pytest.approx(abs(1 - (1 + 1 / 3) / 2) / 2)


def test_timeouts_and_errors_count_as_wrong_and_are_counted(tmp_path):
    records = [rec("a", True), AttemptRecord("builtin:research", "b", "m", 0, status="timeout"),
               AttemptRecord("builtin:research", "c", "m", 0, status="error", error="Traceback ...")]
    cell = aggregate(records).cell("m", "builtin:research")
    assert cell.accuracy == pytest.approx(1 / 3)
    assert (cell.ok, cell.timeout, cell.error) == (1, 1, 1)


def test_a_report_from_a_small_run_has_both_tables_in_markdown_and_csv_and_three_plots(tmp_path):
    spec = write_tasks(tmp_path / "questions.jsonl", 4)
    run_eval([spec], ["toolself", "vanilla"], ScriptedModel([], default=policy), tmp_path / "run", concurrency=2,
             timeout=30, repeats=2, progress=False, pool=POOL)
    files = write_report([tmp_path / "run"])
    text = files.markdown.read_text()
    assert "| Method | questions | Avg. |" in text
    assert "| toolself | 50.0 ± 0.0 | 50.0 ± 0.0 |" in text
    assert "Prompt tok." in text and "| vanilla | 4 | 8 |" in text
    for name in ("accuracy.png", "accuracy_vs_tokens.png", "stages.png"):
        data = (files.markdown.parent / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
        assert f"]({name})" in text
    rows = list(csv.DictReader(open(files.markdown.parent / "accuracy.csv")))
    assert {(r["method"], r["dataset"], r["accuracy"], r["repeats"]) for r in rows} == {
        ("toolself", "questions", "0.5", "2"), ("toolself", "average", "0.5", "2"),
        ("vanilla", "questions", "0.5", "2"), ("vanilla", "average", "0.5", "2")}
    efficiency = {r["method"]: r for r in csv.DictReader(open(files.markdown.parent / "efficiency.csv"))
                  if r["dataset"] == "average"}
    assert float(efficiency["toolself"]["stages"]) == 1.0 and float(efficiency["vanilla"]["steps"]) == 2.0
    assert float(efficiency["toolself"]["prompt_tokens"]) > float(efficiency["vanilla"]["prompt_tokens"])


def test_comparing_two_runs_lists_tasks_won_lost_and_same(tmp_path):
    base = write_run(tmp_path / "before", [rec("a", True), rec("b", False), rec("c", True), rec("d", False)])
    new = write_run(tmp_path / "after", [rec("a", True), rec("b", True), rec("c", False), rec("d", False)])
    files = write_report([base, new], tmp_path / "report")
    (comparison,) = files.comparisons
    assert comparison.won == [("builtin:research", "b")]
    assert comparison.lost == [("builtin:research", "c")]
    assert comparison.same == [("builtin:research", "a"), ("builtin:research", "d")]
    text = files.markdown.read_text()
    assert "won 1, lost 1, same 2" in text and "- won: research/b" in text and "- lost: research/c" in text
    rows = list(csv.DictReader(open(tmp_path / "report" / "comparison.csv")))
    assert [(r["task_id"], r["outcome"]) for r in rows] == [("a", "same"), ("b", "won"), ("c", "lost"), ("d", "same")]
    assert "| m [before] |" in text and "| m [after] |" in text


def test_comparing_methods_of_one_run_uses_the_first_as_baseline_and_repeats_as_fractions(tmp_path):
    records = [rec("a", True, method="vanilla"), rec("a", False, method="vanilla", repeat=1),
               rec("a", True, method="toolself"), rec("a", True, method="toolself", repeat=1),
               rec("b", True, method="vanilla"), rec("b", True, method="toolself")]
    run = write_run(tmp_path / "run", records, methods=["vanilla", "toolself"])
    files = write_report([run], compare_runs=True)
    (comparison,) = files.comparisons
    assert (comparison.baseline, comparison.challenger) == ("vanilla", "toolself")
    assert comparison.counts() == {"won": 1, "lost": 0, "same": 1}


def test_eval_and_report_commands_run_a_served_model_end_to_end(tmp_path):
    config = json.dumps({"subgoal": "answer", "strategy": "Answer directly.", "toolbox": ["search"],
                         "knowledge": "none", "context_mode": "basic"})

    def answer(messages, tools):
        if not tools:
            return config
        return call("terminate", answer=str(2 * number_in(messages)))

    app = commands()
    spec = write_tasks(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out"
    with serving(ScriptedModel([], default=answer)) as url:
        args = ["eval", "--tasks", spec, "--methods", "toolself,vanilla", "--model", f"openai:scripted@{url}",
                "--out", str(out), "--concurrency", "3", "--timeout", "60"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "ran 6 attempts (6 ok, 0 timeout, 0 error)" in result.output
        assert (out / "report" / "report.md").exists() and json.loads((out / "summary.json").read_text())["ran"] == 6
        again = CliRunner().invoke(app, args + ["--no-report"])
        assert "ran 0 attempts" in again.output and "skipped 6 finished earlier" in again.output
        changed = CliRunner().invoke(app, args[:-1] + ["30", "--no-report"])
        assert changed.exit_code == 2 and "other settings" in changed.output
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r"), "--compare"])
    assert result.exit_code == 0, result.output
    assert "| toolself | 100.0 | 100.0 |" in result.output
    assert "won 0, lost 0, same 3" in result.output


def test_the_commands_fail_with_a_message_for_an_unknown_method_or_a_missing_folder(tmp_path):
    app = commands()
    spec = write_tasks(tmp_path / "tasks.jsonl", 1)
    result = CliRunner().invoke(app, ["eval", "--tasks", spec, "--methods", "toolself,nonesuch", "--model", "expert",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "unknown method 'nonesuch'" in result.output
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no eval output folder" in result.output


def test_a_report_of_a_run_still_being_written_ignores_its_torn_last_line(tmp_path):
    run = write_run(tmp_path / "run", [rec("a", True), rec("b", False)])
    with open(run / "m" / "results.jsonl", "a") as f:
        f.write(rec("c", True).to_json()[:40])
    files = write_report([run])
    assert files.table.cell("m", "builtin:research").attempts == 2


def test_a_report_says_how_many_attempts_failed_and_ran_again_and_how_many_still_count_as_wrong(tmp_path):
    from test_runner import failing, run

    spec = write_tasks(tmp_path / "tasks.jsonl", 3)
    run(tmp_path, spec, model=ScriptedModel([], default=failing), methods=("vanilla",), limit=2)
    run(tmp_path, spec, model=ScriptedModel([], default=failing), methods=("vanilla",))  # the 2 again, and the third
    result = CliRunner().invoke(commands(), ["report", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "2 attempt(s) of `vanilla` ended in an error on an earlier run and ran again" in result.output
    assert "3 attempt(s) ended in an error and count as wrong" in result.output
    markdown = (tmp_path / "out" / "report" / "report.md").read_text()
    assert "their records are in `vanilla/errors.jsonl`" in markdown


def test_a_clean_run_has_no_error_lines_in_its_report(tmp_path):
    files = write_report([write_run(tmp_path / "run", [rec("a", True), rec("b", False)])])
    assert files.runs[0].history == [] and "attempt(s)" not in files.markdown.read_text()


def test_identical_set_aside_records_left_by_a_crash_count_once(tmp_path):
    from toolself.evals.records import count_set_aside

    line = AttemptRecord("builtin:research", "a", "m", 0, status="error", error="x").to_json()
    (tmp_path / "errors.jsonl").write_text(line + "\n" + line + "\n" + line[:20])
    assert count_set_aside(tmp_path) == 1
