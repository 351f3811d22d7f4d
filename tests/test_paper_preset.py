"""The `paper` preset: the authors' setting, pinned value by value so that it cannot drift
(docs/paper.md has the side-by-side table)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from http_fixtures import serving
from test_agent import lookup, shout
from toolself.agent import Agent, AgentSettings
from toolself.cli import app
from toolself.context import BasicMode, TruncationMode
from toolself.evals.rules import SCORERS
from toolself.evals.rules.paper import JUDGE, parse_yes_no, within_tolerance
from toolself.evals.scorers import Score
from toolself.evals.task import Task
from toolself.models.base import Message
from toolself.models.protocol import PAPER, parse_tool_calls_text, to_text_messages
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool
from toolself.trajectory import Conversation
from toolself.variants import load_run_preset, settings_for
from web_fakes import FakeService, Reply

PAPER_PRESET = load_run_preset("paper")


POOL = ToolPool([lookup, shout])


def paper_settings(**changes) -> AgentSettings:
    return settings_for("toolself", **{**PAPER_PRESET.settings(), **changes})


def official_config(subgoal="find a", knowledge="", toolbox=("lookup", "shout"), mode="basic") -> str:
    return json.dumps({"subgoal": subgoal, "strategy": "Look a up.", "toolbox": list(toolbox),
                       "knowledge": knowledge, "context_mode": mode})


# budgets and sampling ---------------------------------------------------------------------------

def test_the_budgets_are_the_authors():
    s = paper_settings()
    assert (s.max_stages, s.max_steps_per_stage, s.config_attempts) == (30, 200, 200)
    assert s.max_total_tokens is None and s.max_tokens_per_call == 4096
    assert PAPER_PRESET.timeout == 1800 and s.answer_on_timeout is False and s.crash_retries == 1


def test_sampling_protocol_and_tokenizer_of_a_served_policy():
    options = PAPER_PRESET.model_options("openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
    assert options == {"temperature": 0.6, "extra_body": {"top_p": 0.95}, "tool_protocol": "text",
                       "text_protocol": "paper", "tokenizer": "Qwen/Qwen3-8B"}
    assert PAPER_PRESET.model_options("embedded") == {"temperature": 0.6, "top_p": 0.95, "text_protocol": "paper"}


def test_the_tools_and_the_scorer_are_the_authors():
    assert (PAPER_PRESET.tools.search_results, PAPER_PRESET.tools.search_dates, PAPER_PRESET.tools.visit_max_chars,
            PAPER_PRESET.tools.file_max_chars) == (10, True, 150_000, 100_000)
    assert PAPER_PRESET.scorer == "paper" and PAPER_PRESET.judge_temperature == 0


def test_the_paper_preset_is_a_run_preset_not_a_static_method():
    from toolself.variants import methods, presets

    assert "static:paper" not in [m.name for m in methods()]
    assert [m.name for m in presets()] == ["--preset paper"]


# context ---------------------------------------------------------------------------------------

def test_context_is_pruned_above_80_percent_of_31k_tokens():
    s = paper_settings()
    assert s.context_limit == 31_000 and s.context_budget == int(0.8 * 31_000)
    assert s.modes == (BasicMode(window=12), TruncationMode(window=12, keep_last=10, max_chars=0,
                                                            message_max_chars=10_000))


def stage(turns: int, observation: str = "x" * 40) -> list[Message]:
    messages = [Message("system", "sys"), Message("user", "task")]
    for i in range(turns):
        messages += [call("lookup", key=str(i)), Message("tool", f"{i}:{observation}")]
    return messages


def costs(messages):
    return [len(m.content) + 10 for m in messages]


def test_below_the_threshold_nothing_is_pruned():
    messages = stage(20)
    assert BasicMode(window=12).view(messages, costs(messages), budget=10**6) == [[i, None] for i in range(42)]


def test_above_the_threshold_the_stage_keeps_system_first_user_and_last_12_messages():
    messages = stage(20)
    view = [i for i, _ in BasicMode(window=12).view(messages, costs(messages), budget=sum(costs(messages)) - 1)]
    assert view[:3] == [0, 1, -1] and view[3:] == list(range(30, 42))


def test_after_a_pruning_the_context_grows_again_until_the_next_one():
    messages = stage(20)
    tokens = costs(messages)
    budget = sum(tokens[:30])  # the call after 14 turns is the first over the budget
    view = [i for i, _ in BasicMode(window=12).view(messages, tokens, budget)]
    assert view[:3] == [0, 1, -1] and view[3:] == list(range(20, 42))  # cut to 12 at message 32, grown since


def test_truncation_stubs_observations_older_than_the_last_10_and_cuts_any_message_over_10000():
    messages = stage(12, observation="y" * 20_000)
    mode = paper_settings().modes[1]
    cuts = dict((i, keep) for i, keep in mode.view(messages, costs(messages), budget=10**9))
    tools = [i for i, m in enumerate(messages) if m.role == "tool"]
    assert [cuts[i] for i in tools[:2]] == [0, 0] and all(cuts[i] == 10_000 for i in tools[2:])
    stub = Conversation(messages).render([[tools[0], 0]])[0].content
    assert "\n" not in stub and "20,002" not in stub and "removed" in stub


def test_at_the_context_limit_the_policy_is_asked_for_its_final_answer():
    long = "z" * 4_000  # each shout adds ~1,000 tokens to a ~850-token prompt
    model = ScriptedModel([official_config(), call("shout", text=long), call("shout", text=long),
                           call("terminate", status="success", result="done", summary="s")])
    trajectory = Agent(model, POOL, paper_settings(context_limit=2_000, context_budget=1_600)).run("say it")
    assert trajectory.end_reason == "budget:context" and trajectory.answer == "done"
    assert [c.kind for c in trajectory.stages[0].conversation.calls] == ["action", "action", "final"]


# text protocol ------------------------------------------------------------------------------------

TWO_CALLS = ('<think>look a up first</think>\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "lookup", "arguments": {"key": "b"}}\n</tool_call>')


def test_only_the_first_call_of_a_reply_is_parsed():
    assert [c.arguments for c in parse_tool_calls_text(TWO_CALLS, PAPER).tool_calls] == [{"key": "a"}]
    assert len(parse_tool_calls_text(TWO_CALLS).tool_calls) == 2


def test_think_stays_in_context_and_results_come_back_as_user_turns():
    reply = parse_tool_calls_text(TWO_CALLS, PAPER)
    messages = [Message("system", "sys"), Message("user", "task"), reply, Message("tool", "alpha")]
    wire = to_text_messages(messages, [lookup.schema], PAPER)
    assert wire[0]["content"] == "sys"  # the tools travel in the stage's user turn, not here
    assert wire[2]["content"].startswith("<think>\nlook a up first\n</think>")
    assert wire[3] == {"role": "user", "content": "<tool_response>\nalpha\n</tool_response>"}


# argument names ---------------------------------------------------------------------------------

OFFICIAL_RUN = [
    official_config(),
    call("lookup", key="a"),
    call("reconfigure", execution_summary="a is alpha", update_reason="sub-goal done", new_sub_goal="find b",
         additional_details={"toolbox": "lookup"}),
    official_config(subgoal="find b", knowledge="ALL"),
    call("terminate", status="success", result="alpha, beta", summary="looked both up"),
]


@pytest.mark.parametrize("dialect", ["toolself", "official"])
def test_the_official_argument_names_are_accepted_in_either_dialect(dialect):
    configs = OFFICIAL_RUN if dialect == "official" else [
        json.dumps({**json.loads(OFFICIAL_RUN[0]), "knowledge": "none"}), *OFFICIAL_RUN[1:3],
        json.dumps({**json.loads(OFFICIAL_RUN[3]), "knowledge": "history"}), OFFICIAL_RUN[4]]
    trajectory = Agent(ScriptedModel(list(configs)), POOL, AgentSettings(dialect=dialect)).run("find a and b")
    assert trajectory.end_reason == "terminate" and trajectory.answer == "alpha, beta"
    second = trajectory.stages[1]
    assert second.request["next_subgoal"] == "find b" and second.request["toolbox_request"] == "lookup"
    assert second.configuration.knowledge == "history"


def test_a_trajectory_records_the_call_as_written_and_in_toolself_names():
    trajectory = Agent(ScriptedModel(list(OFFICIAL_RUN)), POOL, AgentSettings(dialect="official")).run("find a, b")
    reconfigure = trajectory.stages[0].steps[-1]
    assert reconfigure.arguments["execution_summary"] == "a is alpha"
    assert reconfigure.canonical["summary"] == "a is alpha" and reconfigure.canonical["reason"] == "sub-goal done"
    assert trajectory.stages[1].steps[-1].canonical == {"answer": "alpha, beta"}
    assert trajectory.history[0]["summary"] == "a is alpha"


def test_an_invalid_official_call_is_explained_in_its_own_names():
    model = ScriptedModel([official_config(), call("terminate", status="success"),
                           call("terminate", status="success", result="alpha", summary="")])
    trajectory = Agent(model, POOL, AgentSettings(dialect="official")).run("find a")
    assert "result: Field required" in trajectory.stages[0].steps[0].observation
    assert trajectory.answer == "alpha"


# prompts ----------------------------------------------------------------------------------------

def test_the_stage_and_spec_prompts_are_the_authors():
    model = ScriptedModel([official_config(), call("terminate", status="success", result="a", summary="")])
    Agent(model, POOL, paper_settings()).run("find a")
    spec = model.calls[0]["messages"][-1].content
    assert lookup.description in spec and '"required": ["key"]' in spec and '"execution_summary"' in spec
    assert "at least two tools" in spec and "strict subset" in spec and '"ALL"' in spec
    system, user = model.calls[1]["messages"][:2]
    assert "Focus only on this sub-goal" in system.content and "Context mode: basic" in system.content
    assert "<tools>" in user.content and "<tool_call>" in user.content and '"name": "lookup"' in user.content
    assert model.calls[1]["tools"][-1]["function"]["parameters"]["required"] == ["status", "result"]


# attempts -----------------------------------------------------------------------------------------

def test_a_timeout_ends_the_attempt_without_an_answer():
    def slow(messages, tools):
        time.sleep(0.3)
        return call("lookup", key="a")

    model = ScriptedModel([official_config()], default=slow)
    trajectory = Agent(model, POOL, paper_settings(time_limit=0.5)).run("find a")
    assert trajectory.end_reason == "budget:time" and trajectory.answer is None


def test_a_crashed_attempt_is_run_once_more():
    def crash(messages, tools):
        raise RuntimeError("the server fell over")

    model = ScriptedModel([crash, official_config(), call("terminate", status="success", result="a", summary="")])
    trajectory = Agent(model, POOL, paper_settings()).run("find a")
    assert trajectory.answer == "a" and "the server fell over" in trajectory.metadata["crashed_before"][0]
    twice = ScriptedModel([crash, crash, official_config()])
    assert Agent(twice, POOL, paper_settings()).run("find a").end_reason == "error"


# the evaluator chain --------------------------------------------------------------------------------

class RecordingJudge:
    def __init__(self, verdict: bool):
        self.verdict, self.asked = verdict, []

    def judge(self, question, reference, prediction, protocol=None):
        self.asked.append((prediction, protocol))
        return Score(self.verdict, "llm_judge", "judged")


def paper_score(prediction, reference, judge):
    return SCORERS["paper"](Task("t", "What?", reference), prediction, judge)


@pytest.mark.parametrize("prediction, reference, step", [
    ("Jane Ballou", "Jane Ballou", "exact"),
    ("jane  ballou.", "Jane Ballou", "normalised"),
    ("about 37.3 floors", "37", "numeric"),
])
def test_the_chain_stops_at_the_first_step_that_matches(prediction, reference, step):
    judge = RecordingJudge(False)
    verdict = paper_score(prediction, reference, judge)
    assert verdict.correct and verdict.details["step"] == step and judge.asked == []


def test_the_judge_is_the_last_step_and_extra_context_may_pass_it():
    judge = RecordingJudge(True)
    verdict = paper_score("It was Jane Ballou, named after both mothers.", "Jane Ballou", judge)
    assert verdict.correct and verdict.scorer == "paper" and verdict.details["step"] == "judge"
    assert judge.asked[0][1] is JUDGE and "Extra context" in JUDGE.prompt


@pytest.mark.parametrize("prediction, ok", [("101", True), ("99.0", True), ("101.5", False), ("98", False)])
def test_the_numeric_step_allows_one_percent(prediction, ok):
    assert within_tolerance(prediction, "100") is ok


def test_the_judge_answers_yes_or_no():
    assert parse_yes_no("YES") is True and parse_yes_no("No.") is False
    assert parse_yes_no("Maybe") is None and parse_yes_no("YES or NO") is None


def test_without_a_judge_the_verdict_says_so():
    verdict = paper_score("Jane", "Jane Ballou", None)
    assert not verdict.correct and verdict.scorer == "paper_without_judge"


# end to end -------------------------------------------------------------------------------------

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples"
GAIA_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gaia" / "2023" / "validation"
ANSWERS = {  # what the scripted policy answers, and the step of the chain that should accept it
    "future wife": ("Her name would be Jane Ballou, after both mothers.", "judge"),
    "Bronte tower": ("37th", "exact"),
    "fruit items": ("12.0", "numeric"),
    "chemical elements": ("Hydrogen, Oxygen.", "normalised"),
}


def tool_call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def scripted_policy(messages, tools) -> str:
    """Configures, searches and reads (or analyses the attachment), then terminates, in the
    authors' text protocol and argument names; each first call comes with a second, wrong
    `terminate` that only a first-call-only parser ignores."""
    last = messages[-1].content
    if last.startswith("Please process the following content"):
        evidence = last.split("## Content", 1)[1][:400]
        return json.dumps({"rational": "the passage names it", "evidence": evidence, "summary": "found it"})
    if last.startswith("# Configuration request"):
        return json.dumps({"subgoal": "answer the question", "strategy": "1. search 2. read 3. terminate",
                           "toolbox": ["search", "visit", "file_analyzer"], "knowledge": "",
                           "context_mode": "basic"})
    task = messages[1].content
    answer = next(text for key, (text, _) in ANSWERS.items() if key in task)
    done = sum(m.role == "user" and m.content.startswith("<tool_response>") for m in messages)
    if "attached file" in task:
        steps = [tool_call("file_analyzer", path="7f3c1e2a-inventory.csv", goal="count the fruit items")]
    else:
        steps = [tool_call("search", query="the facts the question needs"),
                 tool_call("visit", url=["https://en.wikipedia.org/wiki/Jane_Eyre"], goal="the facts")]
    if done < len(steps):
        return "<think>one step at a time</think>\n" + steps[done] + "\n" + tool_call(
            "terminate", status="success", result="WRONG", summary="")
    return tool_call("terminate", status="success", result=answer, summary="read it")


def completion(text: str) -> dict:
    return {"id": "c", "object": "chat.completion", "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}


def gaia_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "gaia"
    folder.mkdir()
    rows = [json.loads(line) for line in (GAIA_FIXTURE / "metadata.jsonl").read_text().splitlines()[:2]]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(GAIA_FIXTURE / "7f3c1e2a-inventory.csv", folder)
    return folder


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_eval_with_the_paper_preset_on_frames_and_gaia_samples_end_to_end(tmp_path, monkeypatch):
    frames = SAMPLES / "frames" / "test_sample.tsv"
    if not frames.exists():
        pytest.skip(f"the benchmark samples are not at {SAMPLES} (expected next to the repository, in shared/)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOOLSELF_CACHE", str(tmp_path / "cache"))
    hits = [{"url": f"https://en.wikipedia.org/wiki/Page_{i}", "title": f"Page {i}", "content": f"snippet {i}",
             "publishedDate": f"2024-01-{i + 1:02d}"} for i in range(12)]
    search = FakeService([], default=Reply(200, {"results": hits}))
    reader = FakeService([], default=Reply(200, {"code": 200, "data": {
        "title": "Jane Eyre", "url": "https://en.wikipedia.org/wiki/Jane_Eyre",
        "content": "Jane Eyre was published in 1847; its Dewey class is 823.8."}}))
    judge = FakeService([], default=Reply(200, completion("YES")))
    out = tmp_path / "out"
    with serving(ScriptedModel([], default=scripted_policy)) as policy_url, search.running() as search_url, \
            reader.running() as reader_url, judge.running() as judge_url:
        result = CliRunner().invoke(app, [
            "eval", "--preset", "paper", "-t", f"frames:{frames}", "-t", f"gaia:{gaia_folder(tmp_path)}",
            "--limit", "2", "--methods", "toolself", "-m", f"openai:Qwen/Qwen3-8B@{policy_url}",
            "--judge", f"openai:judge@{judge_url}/v1", "--search", "searxng", "--search-url", search_url,
            "--reader", "jina", "--reader-url", reader_url, "--concurrency", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    records = [json.loads(line) for line in (out / "toolself" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["correct"] and r["scorer"] == "paper" for r in records)
    assert sorted(r["reason"] for r in records) == sorted(f"correct at the {s} step" if s != "judge"
                                                          else "the judge said CORRECT"
                                                          for _, s in ANSWERS.values())
    assert len(judge.requests) == 1 and judge.requests[0]["body"]["temperature"] == 0
    assert "Answer with exactly one word: YES" in judge.requests[0]["body"]["messages"][0]["content"]
    assert reader.requests and reader.requests[0]["path"] == "/https://en.wikipedia.org/wiki/Jane_Eyre"
    identity = json.loads((out / "run.json").read_text())["identity"]
    assert identity["timeout"] == 1800 and identity["model_options"]["temperature"] == 0.6
    assert identity["settings"]["max_stages"] == 30 and identity["settings"]["dialect"] == "official"
    trajectories = [json.loads(line) for line in (out / "toolself" / "trajectories.jsonl").read_text().splitlines()]
    searched = [s for t in trajectories for st in t["stages"] for s in st["steps"] if s["tool"] == "search"]
    assert "\n10. " in searched[0]["observation"] and "\n11. " not in searched[0]["observation"]
    assert "date: 2024-01-10" in searched[0]["observation"]
    assert "paper" in next((out / "report").glob("*.md")).read_text()
