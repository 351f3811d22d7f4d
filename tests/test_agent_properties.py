"""Whatever a model writes, the loop neither crashes nor loses track of it."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolself.agent import Agent, AgentSettings
from toolself.models.base import Message, ToolCall
from toolself.tools.base import ToolPool, tool
from toolself.trajectory import Trajectory


@tool
def lookup(key: str, times: int = 1) -> str:
    """Look a key up.

    Args:
        key: The key.
        times: How often.
    """
    return key * min(times, 3)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=8,
)
tool_names = st.sampled_from(["lookup", "reconfigure", "terminate", "teleport", "", "LOOKUP"])
arguments = st.one_of(
    st.dictionaries(st.sampled_from(["key", "times", "answer", "summary", "reason", "next_subgoal", "x"]),
                    json_values, max_size=4),
    json_values,
)


def as_text_call(name, args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


valid_config = json.dumps({"subgoal": "s", "strategy": "t", "toolbox": ["lookup"], "knowledge": "none",
                           "context_mode": "basic"})
replies = st.one_of(
    st.text(max_size=200),
    st.just(""),
    st.builds(lambda piece, n: piece * n, st.text(min_size=1, max_size=20, alphabet="ab{}\"<>"),
              st.integers(1_000, 5_000)),
    st.builds(as_text_call, tool_names, arguments),
    st.builds(lambda n, a: as_text_call(n, a)[: len(as_text_call(n, a)) // 2], tool_names, arguments),
    st.builds(lambda n, raw: Message("assistant", tool_calls=[ToolCall.from_raw(n, raw, id="c")]),
              tool_names, st.text(max_size=50)),
    st.builds(lambda d: json.dumps(d), st.dictionaries(
        st.sampled_from(["subgoal", "strategy", "toolbox", "knowledge", "context_mode", "extra"]), json_values)),
    st.just(valid_config),
    st.just("```json\n" + valid_config[:-5]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(replies, min_size=1, max_size=25))
def test_arbitrary_model_outputs_never_escape_the_agent(script):
    from toolself.models.scripted import ScriptedModel

    model = ScriptedModel(list(script), default="")
    agent = Agent(model, ToolPool([lookup]), AgentSettings(max_stages=3, max_steps_per_stage=6,
                                                           max_total_tokens=50_000))
    trajectory = agent.run("task")
    assert trajectory.error is None, trajectory.error
    assert trajectory.end_reason == "terminate" or trajectory.end_reason.startswith("budget:")
    decisions = sum(len(c.calls) for c in trajectory.conversations())
    assert decisions == len(model.calls)
    for stage in trajectory.stages:
        for step in stage.steps:
            if step.tool not in ("lookup",) or step.arguments is None:
                assert step.is_error or step.tool in ("reconfigure", "terminate")
    assert Trajectory.from_json(trajectory.to_json()).to_dict() == trajectory.to_dict()
