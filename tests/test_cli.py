"""The command line, end to end over a real OpenAI-compatible server on loopback."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from http_fixtures import serving
from toolself.cli import DEMO_ANSWER, app, demo_docs
from toolself.models.scripted import ScriptedModel, call
from toolself.trajectory import read_jsonl

runner = CliRunner()


def research_config(**change) -> str:
    return json.dumps({"subgoal": "find the maker", "strategy": "search, then visit", "toolbox": ["search", "visit"],
                       "knowledge": "none", "context_mode": "basic", **change})


def test_run_shows_stages_and_actions_prints_the_answer_and_writes_the_trajectory(tmp_path):
    model = ScriptedModel([
        research_config(),
        call("search", query="Lumen kettle maker"),
        call("visit", locator="lumen-kettle.md"),
        call("reconfigure", summary="Brightwater Appliances makes the Lumen kettle", reason="maker found",
             next_subgoal="find the founder's birthplace"),
        research_config(subgoal="find the founder's birthplace", knowledge="history"),
        call("terminate", answer=DEMO_ANSWER),
    ])
    out = tmp_path / "t.jsonl"
    with serving(model) as url:
        result = runner.invoke(app, ["run", "Where was the founder born?", "--model", f"openai:scripted@{url}",
                                     "--docs", str(demo_docs()), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "stage 1" in result.output and "stage 2" in result.output and "1. search" in result.output
    assert "search" in result.output and "maker found" in result.output
    assert f"answer: '{DEMO_ANSWER}'" in result.output
    [trajectory] = read_jsonl(out)
    assert trajectory.answer == DEMO_ANSWER and len(trajectory.stages) == 2
    visit = trajectory.stages[0].steps[1]
    assert not visit.is_error and "Brightwater Appliances" in visit.observation


def test_an_unknown_method_is_a_clear_error():
    result = runner.invoke(app, ["run", "x", "--method", "telepathy"])
    assert result.exit_code == 2 and "unknown method 'telepathy'" in result.output


def test_a_missing_docs_folder_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["run", "x", "--docs", str(tmp_path / "nope"), "--model", "openai:x@http://127.0.0.1:9/v1"])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())


def test_methods_lists_every_variant_and_ablation():
    result = runner.invoke(app, ["methods"])
    for name in ("toolself", "vanilla", "static:research", "static:general", "static:swe", "decoupled",
                 "toolself-freeze:knowledge"):
        assert name in result.output
