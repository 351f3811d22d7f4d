"""Budgets with the paper's shape: a stage that spends its step budget while stages remain is
asked to reconfigure (one forced turn, recorded as such) and the work goes on in a new stage;
the attempt ends only when its total actions, stages, tokens, time or context run out, after
one request for a final answer. Single-stage methods get the same total actions."""

from __future__ import annotations

import json

import pytest

from toolself.agent import Agent, AgentSettings
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool
from toolself.variants import settings_for


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return {"a": "alpha", "b": "beta"}.get(key, "no such key")


def config(subgoal="find a") -> str:
    return json.dumps({"subgoal": subgoal, "strategy": "Use lookup.", "toolbox": ["lookup"], "knowledge": "history",
                       "context_mode": "basic"})


def run(replies, default=None, **settings):
    model = ScriptedModel(replies, default=default)
    trajectory = Agent(model, ToolPool([lookup]), AgentSettings(**settings)).run("find a and b")
    return trajectory, model


def test_a_stage_that_spends_its_steps_is_asked_to_reconfigure_and_a_second_stage_runs():
    trajectory, model = run([config(), call("lookup", key="a"), call("lookup", key="a"),
                             call("reconfigure", summary="a is alpha", reason="out of steps", next_subgoal="find b"),
                             config("find b"), call("lookup", key="b"), call("terminate", answer="alpha, beta")],
                            max_stages=3, max_steps_per_stage=2)
    assert trajectory.end_reason == "terminate" and trajectory.answer == "alpha, beta"
    first, second = trajectory.stages
    assert first.end == "reconfigure" and first.summary == "a is alpha"
    forced = first.conversation.calls[-2]
    assert forced.kind == "forced_reconfigure" and forced.tools == ["reconfigure"]
    assert "used all 2 of its steps" in model.calls[3]["messages"][-1].content
    assert second.request["forced"] == "steps" and second.configuration.subgoal == "find b"
    assert trajectory.num_reconfigurations == 1


def test_a_forced_turn_without_a_valid_reconfigure_still_moves_on_with_the_same_subgoal():
    trajectory, _ = run([config(), call("lookup", key="a"), "I think I am done.", config(),
                         call("terminate", answer="alpha")], max_stages=3, max_steps_per_stage=1)
    assert len(trajectory.stages) == 2 and trajectory.answer == "alpha"
    assert trajectory.stages[1].request["forced"] == "steps"
    assert trajectory.stages[1].request["next_subgoal"] == "find a"
    assert "without one" in trajectory.history[0]["summary"]


def test_the_last_stage_spending_its_steps_asks_for_the_final_answer():
    trajectory, model = run([config()], default=call("lookup", key="a"), max_stages=2, max_steps_per_stage=2)
    assert trajectory.end_reason == "budget:steps"
    assert len(trajectory.stages) == 2
    assert model.calls[-1]["tools"][0]["function"]["name"] == "terminate"


def test_the_total_action_budget_ends_the_attempt_across_stages():
    replies = [config(), call("lookup", key="a"), call("lookup", key="a"), call("lookup", key="a"),
               call("reconfigure", summary="s", reason="r", next_subgoal="find b"), config("find b")]
    trajectory, _ = run(replies, default=call("lookup", key="b"), max_stages=5, max_steps_per_stage=4,
                        max_total_steps=6)
    assert trajectory.end_reason == "budget:steps"
    actions = sum(1 for s in trajectory.stages for c in s.conversation.calls if c.kind == "action")
    assert actions == 6


def test_at_the_context_limit_the_policy_is_asked_for_its_final_answer():
    big = "x" * 4000

    @tool
    def dump(key: str) -> str:
        """Return a long text.

        Args:
            key: Anything.
        """
        return big

    model = ScriptedModel([json.dumps({"subgoal": "s", "strategy": "Use dump.", "toolbox": ["dump"],
                                       "knowledge": "none", "context_mode": "basic"}), call("dump", key="a")],
                          default=call("terminate", answer="from what I read"))
    settings = AgentSettings(context_limit=600, context_budget=50_000)
    trajectory = Agent(model, ToolPool([dump]), settings).run("read")
    assert trajectory.end_reason == "budget:context" and trajectory.answer == "from what I read"


@pytest.mark.parametrize("method", ["vanilla", "static:research"])
def test_single_stage_methods_keep_the_same_total_actions(method):
    toolself = settings_for("toolself", max_stages=3, max_steps_per_stage=6)
    single = settings_for(method, max_stages=3, max_steps_per_stage=6)
    assert single.total_steps == toolself.total_steps == 18
    capped = settings_for(method, max_stages=3, max_steps_per_stage=6, max_total_steps=10)
    assert (capped.max_steps_per_stage, capped.total_steps) == (10, settings_for(
        "toolself", max_stages=3, max_steps_per_stage=6, max_total_steps=10).total_steps)


def test_reconfiguration_free_methods_end_at_their_one_stage_budget():
    trajectory, model = run([config()], default=call("lookup", key="a"), max_stages=1, max_steps_per_stage=2)
    assert trajectory.end_reason == "budget:steps"
    assert not any(c.kind == "forced_reconfigure" for c in trajectory.stages[0].conversation.calls)
    assert [t["function"]["name"] for t in model.calls[-1]["tools"]] == ["terminate"]
