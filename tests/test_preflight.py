"""Fail before work: a task's needs (web search, page reading, a judge, attachments, a test
runner) are checked against what the run provides before the first attempt, with one error
naming the setting that provides each; `--allow-missing` runs anyway and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from http_fixtures import serving
from toolself.cli import app
from toolself.evals.preflight import PreflightError, Provided, TaskNeeds, check, needs_of
from toolself.evals.task import Task
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.registry import default_pool
from toolself.tools.web.settings import WebSettings
from web_fakes import FakeService, Reply

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples"
FRAMES = SAMPLES / "frames" / "test_sample.tsv"
WEB_VARIABLES = ("SEARX_HOST", "SERPER_API_KEY", "TAVILY_API_KEY", "BRAVE_API_KEY", "JINA_API_KEY", "JINA_KEY",
                 "JINA_READER_URL", "TOOLSELF_SEARCH", "TOOLSELF_READER", "TOOLSELF_ONLINE", "TOOLSELF_WEB_CACHE",
                 "VISIT_LLM_MODEL", "VISIT_LLM_API_BASE_URL")
runner = CliRunner()


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    for name in WEB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOOLSELF_CACHE", str(tmp_path / "cache"))


def frames_task(**extra) -> Task:
    return Task(id="frames-0", question="Who?", answer="Jane Ballou", family="frames",
                metadata={"scorer": "frames_judge"}, **extra)


def provided(search=None, judge=False, tools=("search", "visit", "file_analyzer")) -> Provided:
    return Provided(frozenset(tools), WebSettings(search=search), judge)


def test_a_web_benchmark_task_needs_search_reading_and_a_judge():
    assert needs_of(frames_task()).names() == ["search", "read", "judge"]


def test_a_task_with_its_own_collection_needs_no_web():
    assert needs_of(frames_task(documents=[{"id": "a", "title": "A", "text": "x"}])).names() == ["judge"]


def test_a_code_task_needs_a_test_runner_and_a_gaia_task_its_files(tmp_path):
    assert needs_of(Task(id="c", question="fix", check_command="pytest -q", family="code")).tests
    attached = needs_of(Task(id="g", question="q", answer="1", family="gaia", files=[tmp_path / "a.xlsx"]))
    assert attached.attachments == (str(tmp_path / "a.xlsx"),)


def test_a_jsonl_task_declares_its_needs_and_an_unknown_need_is_refused():
    assert needs_of(Task(id="j", question="q", answer="a", metadata={"needs": ["search"]})).search
    with pytest.raises(ValueError, match="unknown needs"):
        needs_of(Task(id="j", question="q", answer="a", metadata={"needs": ["telepathy"]}))


def test_every_unmet_need_is_one_line_naming_the_setting_that_provides_it():
    with pytest.raises(PreflightError) as caught:
        check({"frames:F": [frames_task()]}, provided())
    message = str(caught.value)
    assert "nothing was run" in message
    assert "web search: 1 task(s) of frames:F" in message and "SERPER_API_KEY" in message
    assert "--judge openai:NAME@URL" in message
    assert "--allow-missing search,read,judge" in message


def test_allowed_missing_needs_become_warnings_and_the_judge_names_its_fallback():
    warnings = check({"frames:F": [frames_task()]}, provided(search="serper"), allow={"judge"})
    assert len(warnings) == 1 and "exact_fallback" in warnings[0]


def test_a_search_tool_left_out_of_the_pool_is_named():
    with pytest.raises(PreflightError, match="`search` is not in the pool"):
        check({"frames:F": [frames_task()]}, provided(search="serper", judge=True, tools=("visit",)))


def test_missing_attachments_are_named(tmp_path):
    task = Task(id="g", question="q", answer="1", family="gaia", files=[tmp_path / "gone.xlsx"],
                documents=[{"id": "a", "title": "A", "text": "x"}])
    with pytest.raises(PreflightError, match="gone.xlsx"):
        check({"gaia:G": [task]}, provided())


def test_a_loader_refusal_is_the_test_runner_message():
    class Setup:
        refusal = "no SWE-bench environment for astropy 4.3: build it with ..."

    task = Task(id="s", question="fix", check_command="pytest", family="swebench", setup=Setup())
    assert needs_of(task) == TaskNeeds(tests=True, problems=(Setup.refusal,))
    with pytest.raises(PreflightError, match="no SWE-bench environment"):
        check({"swebench:S": [task]}, provided())


def test_a_tools_config_with_an_unknown_key_names_the_key_and_the_file(tmp_path):
    config = tmp_path / "tools.json"
    config.write_text(json.dumps({"include": ["search"], "mcpservers": {}}))
    with pytest.raises(ValueError, match=r"tools\.json: unknown key 'mcpservers'"):
        default_pool(config=config)


# the FRAMES sample, end to end through `toolself eval` ---------------------------------------

needs_samples = pytest.mark.skipif(not FRAMES.exists(), reason=f"the FRAMES sample is not at {FRAMES}")


@needs_samples
def test_eval_on_frames_without_search_or_judge_stops_before_the_first_attempt(tmp_path):
    policy = ScriptedModel([], default=call("terminate", answer="x"))
    with serving(policy) as url:
        result = runner.invoke(app, ["eval", "--tasks", f"frames:{FRAMES}", "--model", f"openai:p@{url}",
                                     "--out", str(tmp_path / "run"), "--limit", "2"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "nothing was run" in text and "web search: 2 task(s)" in text and "--judge openai:NAME@URL" in text
    assert policy.calls == []
    assert not list((tmp_path / "run").rglob("results.jsonl"))


def _organic(query):
    return {"organic": [{"title": "Harriet Lane", "link": "https://example.org/harriet-lane",
                         "snippet": "Jane Buchanan; Eliza Ballou was the mother of James Garfield.", "position": 1}]}


@needs_samples
def test_eval_on_frames_with_search_and_judge_runs_and_is_judged(tmp_path, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "serper-secret-key")
    config = json.dumps({"subgoal": "find the name", "strategy": "Search, then answer.", "toolbox": ["search"],
                         "knowledge": "none", "context_mode": "basic"})
    policy = ScriptedModel([config, call("search", query="15th first lady mother"),
                            call("terminate", answer="Jane Ballou")], default=call("terminate", answer="Jane Ballou"))
    judge = ScriptedModel([], default="The answer names the same person.\nDecision: TRUE")
    search = FakeService([], default=Reply(200, _organic("q")))
    out = tmp_path / "run"
    with serving(policy) as policy_url, serving(judge) as judge_url, search.running() as search_url:
        result = runner.invoke(app, ["eval", "--tasks", f"frames:{FRAMES}", "--model", f"openai:p@{policy_url}",
                                     "--judge", f"openai:j@{judge_url}", "--search", "serper",
                                     "--search-url", search_url, "--out", str(out), "--limit", "1",
                                     "--concurrency", "1", "--no-report"])
    assert result.exit_code == 0, result.output
    [record] = [json.loads(line) for line in (out / "toolself" / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "ok" and record["answer"] == "Jane Ballou"
    assert record["scorer"] == "frames_judge" and record["correct"] is True
    assert search.requests[0]["body"]["q"] == "15th first lady mother"
    trajectories = (out / "toolself" / "trajectories.jsonl").read_text()
    assert "Harriet Lane" in trajectories and "serper-secret-key" not in trajectories
    assert list((out / "web_cache").rglob("*.json"))


@needs_samples
def test_eval_with_the_judge_allowed_missing_warns_and_scores_by_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "k")
    policy = ScriptedModel([], default=call("terminate", answer="Jane Ballou"))
    search = FakeService([], default=Reply(200, _organic("q")))
    out = tmp_path / "run"
    with serving(policy) as url, search.running() as search_url:
        result = runner.invoke(app, ["eval", "--tasks", f"frames:{FRAMES}", "--model", f"openai:p@{url}",
                                     "--search", "serper", "--search-url", search_url, "--allow-missing", "judge",
                                     "--out", str(out), "--limit", "1", "--methods", "vanilla"])
    assert result.exit_code == 0, result.output
    assert "exact_fallback" in " ".join(result.output.split())
    assert "exact_fallback" in json.loads((out / "preflight.json").read_text())["warnings"][0]
    header = (out / "report" / "report.md").read_text().split("## Accuracy")[0]
    assert "**warning**: allowed missing an LLM judge" in header
    [record] = [json.loads(line) for line in (out / "vanilla" / "results.jsonl").read_text().splitlines()]
    assert record["scorer"] == "exact_fallback"


def test_run_with_search_asked_for_and_no_source_is_refused(tmp_path):
    result = runner.invoke(app, ["run", "who?", "--tools", "search", "--model", "openai:x@http://127.0.0.1:9/v1",
                                 "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and "no web backend" in " ".join(result.output.split())


def test_the_shared_options_are_the_same_on_every_agent_command():
    def options(*command):
        text = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        return {name for name in ("--docs", "--tools", "--user-tools", "--mcp", "--tools-config", "--search",
                                  "--search-url", "--reader", "--reader-url", "--visit-model", "--judge",
                                  "--allow-missing") if name in text}

    full = options("run")
    assert len(full) == 12
    assert options("eval") == options("train", "cat") == options("train", "study") == full


def test_tool_options_survive_a_saved_pipeline_state(monkeypatch, tmp_path):
    from toolself.tools.options import ToolOptions

    monkeypatch.setenv("SERPER_API_KEY", "never-saved")
    options = ToolOptions.parse(tools="search,visit", search="serper", search_url="http://127.0.0.1:9",
                                judge="openai:j@http://127.0.0.1:9/v1", allow_missing=["read"])
    saved = json.dumps(options.to_dict())
    assert "never-saved" not in saved
    assert ToolOptions.from_dict(json.loads(saved)) == options


@needs_samples
def test_train_cat_on_frames_without_search_or_judge_stops_before_any_work(tmp_path):
    out = tmp_path / "cat"
    result = runner.invoke(app, ["train", "cat", "--tasks", f"frames:{FRAMES}", "--out", str(out), "--limit", "1",
                                 "--teacher", "openai:t@http://127.0.0.1:9/v1"])
    assert result.exit_code == 2
    assert "nothing was run" in " ".join(result.output.split()) and not out.exists()


def test_an_unknown_need_to_allow_missing_is_refused_with_the_choices(tmp_path):
    result = runner.invoke(app, ["run", "x", "--allow-missing", "telepathy", "--out", str(tmp_path / "t.jsonl"),
                                 "--model", "openai:x@http://127.0.0.1:9/v1"])
    assert result.exit_code == 2 and "expected some of" in " ".join(result.output.split())


@needs_samples
def test_eval_on_frames_over_a_local_collection_needs_no_web(tmp_path):
    docs = tmp_path / "wiki"
    docs.mkdir()
    (docs / "harriet-lane.md").write_text("# Harriet Lane\n\nHarriet Lane's mother was Jane Buchanan.")
    config = json.dumps({"subgoal": "find the name", "strategy": "Search, then answer.", "toolbox": ["search"],
                         "knowledge": "none", "context_mode": "basic"})
    policy = ScriptedModel([config, call("search", query="Harriet Lane mother")],
                           default=call("terminate", answer="Jane Ballou"))
    judge = ScriptedModel([], default="Decision: TRUE")
    out = tmp_path / "run"
    with serving(policy) as policy_url, serving(judge) as judge_url:
        result = runner.invoke(app, ["eval", "--tasks", f"frames:{FRAMES}", "--model", f"openai:p@{policy_url}",
                                     "--judge", f"openai:j@{judge_url}", "--docs", str(docs), "--out", str(out),
                                     "--limit", "1", "--no-report"])
    assert result.exit_code == 0, result.output
    assert "Jane Buchanan" in (out / "toolself" / "trajectories.jsonl").read_text()
