"""The trajectory viewer's data: loading runs, diffing configurations, and writing a safe page.

Trajectories come from the real agent loop with scripted decisions (toolself.viewer.sample);
what the browser does with the page is specified in test_viewer_browser.py.
"""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from toolself.agent import Agent
from toolself.config import Configuration
from toolself.evals.records import RESULTS, TRAJECTORIES
from toolself.models.scripted import ScriptedModel
from toolself.tools.base import ToolPool, tool
from toolself.trajectory import write_jsonl
from toolself.variants import settings_for
from toolself.viewer.build import build_report, data_script
from toolself.viewer.cli import view_command
from toolself.viewer.digest import attempt_detail, attempt_row, config_change, json_for_script, summarize
from toolself.viewer.load import load_attempts
from toolself.viewer.sample import TASKS, config, say, write_sample_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_sample_run(tmp_path_factory.mktemp("run"))


def by_task(attempts, task_id, method):
    [attempt] = [a for a in attempts if a.task_id == task_id and a.method == method]
    return attempt


def run_data(path) -> dict:
    """The run object a written page defines, read back from its script."""
    text = path.read_text(encoding="utf-8")
    match = re.search(r"window\.TOOLSELF_RUN=(.*?);\nwindow\.TOOLSELF_DETAILS=", text, re.S)
    assert match, "the page defines TOOLSELF_RUN"
    return json.loads(match.group(1))


# -- configuration diffs ----------------------------------------------------------------------

def cfg(**change) -> Configuration:
    base = dict(subgoal="find a", strategy="look it up", toolbox=["search", "visit"], knowledge="none",
                knowledge_summary="", context_mode="basic")
    return Configuration(**{**base, **change})


def test_first_stage_has_no_changes_and_keeps_every_tool():
    change = config_change(None, cfg())
    assert change.changed == [] and change.kept == ["search", "visit"] and change.added == change.removed == []


def test_toolbox_diff_names_added_removed_and_kept_tools():
    change = config_change(cfg(), cfg(toolbox=["visit", "code_interpreter"]))
    assert change.added == ["code_interpreter"] and change.removed == ["search"] and change.kept == ["visit"]
    assert change.changed == ["toolbox"]


def test_changed_fields_carry_their_previous_values():
    change = config_change(cfg(), cfg(subgoal="find b", knowledge="history", context_mode="truncation"))
    assert change.changed == ["subgoal", "knowledge", "context_mode"]
    assert change.previous == {"subgoal": "find a", "knowledge": "none", "context_mode": "basic"}


def test_reordering_the_toolbox_is_not_a_change():
    assert config_change(cfg(), cfg(toolbox=["visit", "search"])).changed == []


# -- loading runs -----------------------------------------------------------------------------

def test_a_run_folder_joins_each_trajectory_to_its_result(run_dir):
    attempts = load_attempts([run_dir])
    assert len(attempts) == 2 * len(TASKS)
    assert all(a.trajectory is not None and a.record is not None for a in attempts)
    for a in attempts:
        assert a.record.trajectory_id == a.trajectory.id
    assert by_task(attempts, "lumen-founder-town", "toolself").outcome == "correct"
    assert by_task(attempts, "lumen-founder-town", "vanilla").outcome == "wrong"


def test_a_bare_trajectories_file_without_results_is_unscored(tmp_path, run_dir):
    lone = tmp_path / "runs.jsonl"
    lone.write_text((run_dir / "toolself" / TRAJECTORIES).read_text())
    attempts = load_attempts([lone])
    assert len(attempts) == len(TASKS) and {a.outcome for a in attempts} == {"unscored"}
    assert {a.task_id for a in attempts} == {t.id for t in TASKS}


def test_a_trajectories_file_finds_the_results_beside_it(run_dir):
    attempts = load_attempts([run_dir / "vanilla" / TRAJECTORIES])
    assert {a.outcome for a in attempts} == {"correct", "wrong"}


def test_a_result_without_a_trajectory_is_still_a_row(tmp_path, run_dir):
    folder = tmp_path / "toolself"
    folder.mkdir()
    (folder / RESULTS).write_text((run_dir / "toolself" / RESULTS).read_text())
    lines = (run_dir / "toolself" / TRAJECTORIES).read_text().splitlines()
    (folder / TRAJECTORIES).write_text("\n".join(lines[1:]) + "\n")
    attempts = load_attempts([tmp_path])
    missing = [a for a in attempts if a.trajectory is None]
    assert len(attempts) == len(TASKS) and len(missing) == 1
    row = attempt_row(0, missing[0])
    assert row["has_detail"] is False and row["task_id"] == TASKS[0].id and attempt_detail(missing[0]) is None


def test_a_torn_last_line_is_skipped_but_a_corrupt_middle_line_is_an_error(tmp_path, run_dir):
    lines = (run_dir / "toolself" / TRAJECTORIES).read_text().splitlines()
    torn = tmp_path / "torn.jsonl"
    torn.write_text("\n".join(lines[:2]) + "\n" + lines[2][:100])
    assert len(load_attempts([torn])) == 2
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text(lines[0] + "\n{not json\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match="corrupt.jsonl:2"):
        load_attempts([corrupt])


def test_two_runs_of_one_method_are_labelled_by_their_folder(tmp_path, run_dir):
    other = write_sample_run(tmp_path / "rerun", methods=("toolself",))
    methods = {a.method for a in load_attempts([run_dir, other])}
    assert methods == {"toolself", "vanilla", "toolself @ rerun"}


def test_a_missing_path_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_attempts([tmp_path / "nowhere"])


# -- what the page is given -------------------------------------------------------------------

def test_stage_tokens_add_up_to_the_trajectory_usage(run_dir):
    for attempt in load_attempts([run_dir]):
        detail = attempt_detail(attempt)
        spent = sum(s["tokens"]["prompt"] + s["tokens"]["completion"] for s in detail["stages"])
        assert spent == attempt.trajectory.usage.total_tokens, attempt.task_id


def test_stage_detail_holds_the_reconfigure_reason_summary_and_toolbox_diff(run_dir):
    detail = attempt_detail(by_task(load_attempts([run_dir]), "lumen-founder-town", "toolself"))
    first, second = detail["stages"]
    assert first["end"] == "reconfigure" and first["summary"].startswith("The Lumen kettle is made by Brightwater")
    assert "next hop is its founder" in first["reason"] and second["request"]["reason"] == first["reason"]
    assert second["change"]["added"] == ["visit"] and second["change"]["kept"] == ["search"]
    assert set(second["change"]["changed"]) == {"subgoal", "strategy", "toolbox", "knowledge", "context_mode"}
    steps = [e for e in first["events"] if e["kind"] == "step"]
    assert [e["tool"] for e in steps] == ["search", "visit", "reconfigure"]
    assert steps[1]["error"] and "no tool 'visit'" in steps[1]["observation"]
    assert steps[0]["thought"] == "First, who makes the Lumen kettle?" and steps[0]["tokens"]["prompt"] > 0


@tool
def echo(text: str) -> str:
    """Say a text back.

    Args:
        text: What to say.
    """
    return text


def test_a_reply_without_a_tool_call_is_shown_as_an_event():
    model = ScriptedModel([config("say hi", "echo it", ["echo"]), "I think I should just talk.",
                           say("", "echo", text="hi"), say("", "terminate", answer="hi")])
    trajectory = Agent(model, ToolPool([echo]), settings_for("toolself")).run("Say hi.")
    from toolself.viewer.load import Attempt

    events = attempt_detail(Attempt(trajectory, None))["stages"][0]["events"]
    assert [(e["kind"], e.get("tool")) for e in events] == [("text", None), ("step", "echo"), ("step", "terminate")]
    assert events[0]["thought"] == "I think I should just talk."


def test_long_observations_are_cut_in_the_report_with_a_note():
    model = ScriptedModel([config("say", "echo", ["echo"]), say("", "echo", text="x" * 5000),
                           say("", "terminate", answer="x")])
    trajectory = Agent(model, ToolPool([echo]), settings_for("toolself")).run("Echo.")
    from toolself.viewer.load import Attempt

    event = attempt_detail(Attempt(trajectory, None), max_observation=1000)["stages"][0]["events"][0]
    assert event["observation"].startswith("x" * 1000) and "4000 more characters" in event["observation"]


def test_summary_gives_accuracy_per_method_and_dataset_and_none_when_unscored():
    rows = [dict(method="m", dataset="d1", outcome="correct", tokens=10, steps=2, stages=1, reconfigurations=0, duration=1.0),
            dict(method="m", dataset="d2", outcome="error", tokens=30, steps=4, stages=2, reconfigurations=1, duration=3.0),
            dict(method="n", dataset="d1", outcome="unscored", tokens=5, steps=1, stages=1, reconfigurations=0, duration=1.0)]
    summary = {(s["method"], s["dataset"]): s for s in summarize(rows)}
    assert summary[("m", None)]["accuracy"] == 0.5 and summary[("m", None)]["errors"] == 1
    assert summary[("m", None)]["tokens"] == 20 and summary[("m", "d2")]["stages"] == 2
    assert summary[("n", None)]["accuracy"] is None


def test_script_json_cannot_close_its_script_element():
    text = json_for_script({"observation": "</script><script>alert(1)</script><!-- \u2028"})
    assert "</" not in text and "<!--" not in text and "\u2028" not in text
    assert json.loads(text)["observation"] == "</script><script>alert(1)</script><!-- \u2028"


# -- the page ---------------------------------------------------------------------------------

def test_the_report_is_one_file_with_nothing_fetched_from_the_network(tmp_path, run_dir):
    report = build_report([run_dir], tmp_path / "report.html")
    html = report.path.read_text(encoding="utf-8")
    assert report.data_path is None and not (tmp_path / "report.data.js").exists()
    assert report.attempts == 8 and report.tasks == 4
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "no remote resources"
    assert "<link" not in html and "@import" not in html and "fetch(" not in html
    assert "default-src 'none'" in html  # the page may not reach out even if asked to
    assert len(re.findall(r"<script[ >]", html)) == 2 and "</script>" in html


def test_the_report_holds_every_attempt_and_the_run_summary(tmp_path, run_dir):
    run = run_data(build_report([run_dir], tmp_path / "r.html").path)
    assert run["methods"] == ["toolself", "vanilla"] and run["datasets"] == ["demo"]
    assert len(run["rows"]) == 8 and {r["task_id"] for r in run["rows"]} == {t.id for t in TASKS}
    accuracy = {s["method"]: s["accuracy"] for s in run["summary"] if s["dataset"] is None}
    assert accuracy == {"toolself": 1.0, "vanilla": 0.5}


def test_a_hostile_title_is_escaped_in_the_page_head(tmp_path, run_dir):
    html = build_report([run_dir], tmp_path / "r.html", title="</title><script>x()</script>").path.read_text()
    assert "<title>&lt;/title&gt;&lt;script&gt;x()&lt;/script&gt; · toolself</title>" in html


def test_large_data_goes_to_a_script_file_beside_the_page(tmp_path, run_dir):
    report = build_report([run_dir], tmp_path / "r.html", split_data=True)
    html = report.path.read_text(encoding="utf-8")
    assert report.data_path == tmp_path / "r.data.js" and '<script src="r.data.js"></script>' in html
    assert report.data_path.read_text(encoding="utf-8").startswith("window.TOOLSELF_RUN=")
    assert "TOOLSELF_RUN=" not in html
    build_report([run_dir], tmp_path / "r.html", split_data=False)
    assert not report.data_path.exists(), "a stale data file would be confusing"


def test_data_script_details_are_json_strings_parsed_on_demand(run_dir):
    attempts = load_attempts([run_dir])
    script = data_script(attempts, "t", ["run"])
    details = json.loads(script.split("window.TOOLSELF_DETAILS=", 1)[1].rstrip().rstrip(";"))
    assert len(details) == len(attempts) and all(isinstance(d, str) for d in details)
    assert json.loads(details[0])["question"] == attempts[0].trajectory.task


def test_view_command_writes_the_report_and_says_where(tmp_path, run_dir):
    app = typer.Typer()
    app.command("view")(view_command)
    app.command("other")(lambda: None)
    out = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(app, ["view", str(run_dir), "--out", str(out), "--title", "Demo"])
    assert result.exit_code == 0, result.output
    assert out.exists() and "4 tasks, 8 attempts" in result.output
    assert run_data(out)["title"] == "Demo"


def test_view_command_fails_cleanly_on_a_folder_without_runs(tmp_path):
    app = typer.Typer()
    app.command("view")(view_command)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert result.exit_code == 2 and "no trajectories.jsonl" in result.output


def test_a_results_file_finds_the_trajectories_beside_it(run_dir):
    attempts = load_attempts([run_dir / "toolself" / RESULTS])
    assert len(attempts) == len(TASKS) and all(a.trajectory is not None for a in attempts)


def test_a_run_folder_is_searched_two_levels_deep_and_no_further(tmp_path, run_dir):
    import shutil

    shutil.copytree(run_dir, tmp_path / "suite" / "run")
    shutil.copytree(run_dir / "vanilla", tmp_path / "suite" / "run" / "workspaces" / "attempt" / "vanilla")
    assert len(load_attempts([tmp_path / "suite"])) == 2 * len(TASKS)


def test_a_trajectory_from_toolself_run_is_named_by_its_id(tmp_path):
    model = ScriptedModel([config("say", "echo", ["echo"]), say("", "terminate", answer="x")])
    trajectory = Agent(model, ToolPool([echo]), settings_for("toolself")).run("Echo.")
    write_jsonl(tmp_path / "runs.jsonl", [trajectory])
    [attempt] = load_attempts([tmp_path / "runs.jsonl"])
    assert attempt.task_id == trajectory.id and attempt.dataset == "" and attempt.outcome == "unscored"
