"""The agent loop, specified on a scripted model."""

from __future__ import annotations

import json
import time

import pytest

from toolself.agent import Agent, AgentSettings
from toolself.config import GENERIC_STRATEGY, Configuration
from toolself.models.base import Message
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool
from toolself.trajectory import Trajectory, read_jsonl, write_jsonl


@tool
def lookup(key: str) -> str:
    """Look a key up in a small table.

    Args:
        key: The key to look up.
    """
    return {"a": "alpha", "b": "beta"}.get(key, "no such key")


@tool
def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: What to shout.
    """
    return text.upper()


def config(subgoal="find a", toolbox=("lookup",), knowledge="none", mode="basic", **extra) -> str:
    return json.dumps({"subgoal": subgoal, "strategy": "Use lookup, then answer.", "toolbox": list(toolbox),
                       "knowledge": knowledge, "context_mode": mode, **extra})


def agent(replies, settings=None, **kwargs) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(replies, **kwargs)
    return Agent(model, ToolPool([lookup, shout]), settings or AgentSettings()), model


TWO_STAGES = [
    config(),
    call("lookup", key="a"),
    call("reconfigure", summary="a is alpha", reason="sub-goal done", next_subgoal="find b",
         toolbox_request="lookup"),
    config(subgoal="find b", knowledge="history", mode="truncation"),
    call("lookup", key="b"),
    call("terminate", answer="alpha, beta"),
]


def test_first_configuration_is_written_by_the_policy_from_the_spec_with_empty_history():
    a, model = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?")
    first = model.calls[0]
    assert first["response_schema"] is not None
    spec = first["messages"][-1].content
    assert "What are a and b?" in spec and "empty" in spec
    assert trajectory.stages[0].config_source == "policy"
    assert trajectory.stages[0].configuration.subgoal == "find a"


def test_reconfigure_archives_the_summary_in_the_history_pool():
    a, _ = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?")
    assert trajectory.history == [{"stage": 0, "subgoal": "find a", "summary": "a is alpha", "reason": "sub-goal done"}]
    assert trajectory.stages[0].summary == "a is alpha" and trajectory.stages[0].end == "reconfigure"


def test_reconfigure_returns_a_spec_with_task_catalogue_modes_history_and_request():
    a, model = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?")
    spec = trajectory.stages[0].conversation.messages[-2]
    assert spec.role == "tool"
    for expected in ("What are a and b?", "lookup(key: string)", "shout(text: string)", "basic:", "truncation:",
                     "a is alpha", "sub-goal done", "find b", "Toolbox requirement: lookup", '"subgoal"'):
        assert expected in spec.content


def test_the_same_model_in_the_same_context_writes_the_next_configuration():
    a, model = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?")
    writing_call = model.calls[3]
    assert writing_call["response_schema"] is not None
    seen = [m.content for m in writing_call["messages"]]
    assert any("alpha" == c for c in seen), "the configuration turn sees the stage's own observations"
    stage0 = trajectory.stages[0].conversation
    assert stage0.messages[-1].content == config(subgoal="find b", knowledge="history", mode="truncation")
    assert stage0.calls[-1].kind == "configure"


def test_next_stage_sees_only_its_configuration_and_the_knowledge_it_chose():
    a, model = agent(list(TWO_STAGES))
    a.run("What are a and b?")
    stage1_first_call = model.calls[4]["messages"]
    assert [m.role for m in stage1_first_call] == ["system", "user"]
    text = "\n".join(m.content for m in stage1_first_call)
    assert "find b" in text and "a is alpha" in text  # knowledge=history
    assert "alpha" not in text.replace("a is alpha", "")  # no raw observation of stage 0


def test_knowledge_none_carries_nothing_over():
    replies = list(TWO_STAGES)
    replies[3] = config(subgoal="find b", knowledge="none")
    a, model = agent(replies)
    a.run("What are a and b?")
    assert "a is alpha" not in "\n".join(m.content for m in model.calls[4]["messages"])


def test_knowledge_summary_carries_the_written_summary():
    replies = list(TWO_STAGES)
    replies[3] = config(subgoal="find b", knowledge="summary", knowledge_summary="remember: a=alpha")
    a, model = agent(replies)
    a.run("What are a and b?")
    assert "remember: a=alpha" in model.calls[4]["messages"][0].content


def test_terminate_ends_the_attempt_with_the_answer():
    a, _ = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?")
    assert trajectory.end_reason == "terminate" and trajectory.answer == "alpha, beta"
    assert trajectory.error is None and len(trajectory.stages) == 2


def test_the_toolbox_limits_what_a_stage_can_call():
    a, model = agent([config(toolbox=["lookup"]), call("shout", text="hi"), call("terminate", answer="x")])
    trajectory = a.run("task")
    step = trajectory.stages[0].steps[0]
    assert step.is_error and "no tool 'shout' in this stage" in step.observation
    assert "toolbox_request" in step.observation
    assert [t["function"]["name"] for t in model.calls[1]["tools"]] == ["lookup", "reconfigure", "terminate"]


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("not json at all", "not valid JSON"),
        (json.dumps({"subgoal": "s", "strategy": "x", "toolbox": ["lookup"], "knowledge": "none"}),
         "missing field 'context_mode'"),
        (config(toolbox=["lookup", "teleport"]), "unknown tool(s) ['teleport']"),
        (config(mode="psychic"), "unknown context mode 'psychic'"),
        ("", "empty"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_an_invalid_configuration_gets_a_precise_error_and_one_repair(bad, problem):
    a, model = agent([bad, config(), call("terminate", answer="done")])
    trajectory = a.run("task")
    repair_prompt = model.calls[1]["messages"][-1].content
    assert problem in repair_prompt
    assert trajectory.stages[0].config_source == "repaired"
    assert any(problem in p for p in trajectory.stages[0].config_problems)
    assert trajectory.answer == "done"


def test_a_configuration_that_fails_repair_falls_back_to_a_safe_default():
    a, _ = agent(["nonsense", "still nonsense", call("terminate", answer="done")])
    trajectory = a.run("the task")
    stage = trajectory.stages[0]
    assert stage.config_source == "fallback"
    assert stage.configuration == Configuration(subgoal="the task", strategy=GENERIC_STRATEGY,
                                                toolbox=["lookup", "shout"], knowledge="history", context_mode="basic")
    assert trajectory.answer == "done"


def test_malformed_tool_arguments_become_an_observation_the_model_can_act_on():
    a, _ = agent([config(), '<tool_call>{"name": "lookup", "arguments": {"key": 3}}</tool_call>',
                  '<tool_call>{"name": "lookup", "arguments": </tool_call>', call("terminate", answer="x")])
    trajectory = a.run("task")
    wrong_type, unparsable = trajectory.stages[0].steps[:2]
    assert wrong_type.is_error and "key" in wrong_type.observation and "string" in wrong_type.observation
    assert unparsable.is_error and "could not be read" in unparsable.observation


def test_a_reply_without_a_tool_call_is_answered_with_a_nudge():
    a, model = agent([config(), "I think the answer is alpha.", call("terminate", answer="alpha")])
    trajectory = a.run("task")
    nudge = model.calls[2]["messages"][-1]
    assert nudge.role == "user" and "called no tool" in nudge.content
    assert trajectory.answer == "alpha"


def test_calls_after_terminate_in_the_same_reply_are_not_run():
    reply = Message("assistant", tool_calls=[call("terminate", answer="x").tool_calls[0],
                                             call("lookup", key="a").tool_calls[0]])
    a, _ = agent([config(), reply])
    trajectory = a.run("task")
    assert trajectory.answer == "x"
    assert trajectory.stages[0].steps[-1].observation.startswith("Not run")


def test_step_budget_asks_once_for_the_best_final_answer():
    a, model = agent([config()], default=call("lookup", key="a"),
                     settings=AgentSettings(max_stages=1, max_steps_per_stage=3))
    model.replies.extend([call("lookup", key="a")] * 3 + [call("terminate", answer="best guess")])
    trajectory = a.run("task")
    assert trajectory.end_reason == "budget:steps"
    assert trajectory.answer == "best guess"
    final = model.calls[-1]
    assert [t["function"]["name"] for t in final["tools"]] == ["terminate"]
    assert "steps budget is spent" in final["messages"][-1].content
    assert trajectory.stages[0].conversation.calls[-1].kind == "final"


def test_stage_budget_ends_the_attempt_at_the_last_reconfigure():
    replies = [config(), call("reconfigure", summary="s", reason="r", next_subgoal="n"),
               call("terminate", answer="final")]
    a, _ = agent(replies, settings=AgentSettings(max_stages=1))
    trajectory = a.run("task")
    assert trajectory.end_reason == "budget:stages" and trajectory.answer == "final"
    assert trajectory.history[0]["summary"] == "s"


def test_token_budget_ends_the_attempt():
    a, model = agent([config()], default=call("lookup", key="a"),
                     settings=AgentSettings(max_total_tokens=200))
    trajectory = a.run("task")
    assert trajectory.end_reason == "budget:tokens"
    assert trajectory.usage.total_tokens >= 200


def test_wall_clock_budget_ends_the_attempt():
    def slow(messages, tools):
        time.sleep(0.05)
        return call("lookup", key="a")

    a, _ = agent([config()], default=slow, settings=AgentSettings(time_limit=0.2, max_steps_per_stage=1000))
    trajectory = a.run("task")
    assert trajectory.end_reason == "budget:time"
    assert trajectory.duration < 2


def test_a_model_failure_ends_the_attempt_with_the_error_recorded():
    def broken(messages, tools):
        raise ConnectionError("server went away")

    a, _ = agent([config()], default=broken)
    trajectory = a.run("task")
    assert trajectory.end_reason == "error" and "server went away" in trajectory.error


def test_vanilla_preset_runs_one_stage_with_the_whole_pool_and_no_reconfigure():
    preset = Configuration(subgoal="{task}", strategy=GENERIC_STRATEGY, toolbox=[], knowledge="none")
    settings = AgentSettings(method="vanilla", configurator="preset", reconfigure=False, preset=preset, max_stages=1)
    a, model = agent([call("terminate", answer="x")], settings=settings)
    trajectory = a.run("the task")
    assert trajectory.stages[0].config_source == "preset"
    assert trajectory.stages[0].configuration.subgoal == "the task"
    assert [t["function"]["name"] for t in model.calls[0]["tools"]] == ["lookup", "shout", "terminate"]
    assert "reconfigure" not in model.calls[0]["messages"][0].content


@pytest.mark.parametrize("method", ["vanilla", "static:research"])
def test_single_stage_methods_get_toolselfs_whole_action_budget_in_their_one_stage(method):
    from toolself.variants import settings_for

    toolself = settings_for("toolself", max_stages=3, max_steps_per_stage=6)
    single = settings_for(method, max_stages=3, max_steps_per_stage=6)
    assert (single.max_stages, single.max_steps_per_stage) == (1, 18)
    assert single.max_stages * single.max_steps_per_stage == toolself.max_stages * toolself.max_steps_per_stage


def test_decoupled_configurations_are_written_by_a_separate_call_that_sees_only_the_spec():
    writer = ScriptedModel([config(), config(subgoal="find b")])
    actor = ScriptedModel([call("lookup", key="a"),
                           call("reconfigure", summary="a is alpha", reason="done", next_subgoal="find b"),
                           call("terminate", answer="x")])
    settings = AgentSettings(method="decoupled", configurator="decoupled")
    trajectory = Agent(actor, ToolPool([lookup]), settings, config_model=writer).run("task")
    second = writer.calls[1]["messages"]
    assert [m.role for m in second] == ["system", "user"]
    assert "a is alpha" in second[1].content and "alpha\n" not in second[1].content.replace("a is alpha", "")
    assert trajectory.stages[1].config_conversation is not None
    assert trajectory.stages[1].configuration.subgoal == "find b"


@pytest.mark.parametrize(
    "dimension, field, expected",
    [
        ("subgoal", "subgoal", "the task"),
        ("strategy", "strategy", GENERIC_STRATEGY),
        ("toolbox", "toolbox", ["lookup", "shout"]),
        ("knowledge", "knowledge", "none"),
        ("mode", "context_mode", "basic"),
    ],
)
def test_a_frozen_dimension_ignores_what_the_policy_wrote(dimension, field, expected):
    settings = AgentSettings(freeze=(dimension,))
    a, _ = agent([config(subgoal="mine", knowledge="history", mode="truncation"), call("terminate", answer="x")],
                 settings=settings)
    stage = a.run("the task").stages[0]
    assert getattr(stage.configuration, field) == expected
    assert stage.frozen == [dimension]


def test_trajectory_round_trips_through_jsonl_losslessly(tmp_path):
    a, _ = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?", task_id="t1", metadata={"family": "demo"})
    path = tmp_path / "runs" / "t.jsonl"
    write_jsonl(path, [trajectory, trajectory])
    back = read_jsonl(path)
    assert len(back) == 2 and back[0].to_dict() == trajectory.to_dict()
    assert isinstance(back[0], Trajectory) and back[0].stages[1].configuration.context_mode == "truncation"


def test_a_torn_last_line_is_ignored_when_reading(tmp_path):
    a, _ = agent(list(TWO_STAGES))
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [a.run("q")])
    with open(path, "a") as f:
        f.write('{"task": "half a rec')
    assert len(read_jsonl(path)) == 1


def test_every_decision_records_exactly_what_the_policy_saw():
    a, model = agent(list(TWO_STAGES))
    trajectory = a.run("What are a and b?")
    decisions = [(c, call_) for c in trajectory.conversations() for call_ in c.calls]
    assert len(decisions) == len(model.calls)
    for (conversation, recorded), sent in zip(decisions, model.calls):
        assert [m.to_dict() for m in conversation.visible(recorded)] == [m.to_dict() for m in sent["messages"]]
