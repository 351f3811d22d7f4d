"""The agent loop survives its model (finding 11 of issue 25): a model that hangs past the time
limit is abandoned, an interrupt raised in a model call leaves the trajectory with the caller,
a reply without text is an ordinary empty reply, and what a model writes or a tool returns is
capped before it is recorded."""

from __future__ import annotations

import json
import threading
import time

import pytest

from toolself.agent import Agent, AgentSettings, interrupted_attempt
from toolself.models.base import Completion, Message, SyncModelBase
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool
from toolself.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)

MB = 1 << 20
CONFIG = json.dumps({"subgoal": "look it up", "strategy": "Use lookup, then answer.", "toolbox": ["lookup", "dump"],
                     "knowledge": "none", "context_mode": "basic"})
LOOKUPS: list[str] = []


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    LOOKUPS.append(key)
    return "found"


@tool
def dump(size: int) -> str:
    """Return a long text.

    Args:
        size: How many characters.
    """
    return "x" * size


def agent(model, **settings) -> Agent:
    return Agent(model, ToolPool([lookup, dump]), AgentSettings(**settings))


class Hanging:
    """A reply that blocks until released (or 25 s), then answers: the late answer that must
    not be taken."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def __call__(self, messages, tools):
        self.release.wait(25)
        self.returned.set()
        return call("terminate", answer="late")


def test_a_model_call_hanging_past_the_time_limit_is_abandoned_and_its_late_answer_dropped():
    hang = Hanging()
    trajectory = agent(ScriptedModel([CONFIG], default=hang), time_limit=1.0).run("task")
    assert trajectory.end_reason == "budget:time"
    assert trajectory.duration < 1.0 * 1.1 + 0.4  # the limit and the final answer's grace
    hang.release.set()
    assert hang.returned.wait(5)
    assert trajectory.answer is None
    assert trajectory.stages[0].conversation.calls == []  # neither abandoned call is recorded


def test_a_cancelled_attempt_stops_waiting_for_its_model():
    hang = Hanging()
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    trajectory = agent(ScriptedModel([CONFIG], default=hang), time_limit=5.0).run("task", cancel=cancel)
    hang.release.set()
    assert trajectory.end_reason == "budget:cancelled"
    assert time.monotonic() - started < 0.3 + 0.5 + 0.4  # the cancel, the final answer's grace
    assert trajectory.answer is None


def raising(exc: BaseException):
    def reply(messages, tools):
        raise exc
    return reply


@pytest.mark.parametrize("time_limit", [None, 30.0], ids=["in-the-loop's-thread", "in-a-bounded-call"])
def test_a_keyboard_interrupt_in_a_model_call_goes_on_carrying_the_trajectory(time_limit):
    model = ScriptedModel([CONFIG, call("lookup", key="a"), raising(KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt) as raised:
        agent(model, time_limit=time_limit).run("task")
    trajectory = interrupted_attempt(raised.value)
    assert trajectory is not None and trajectory.end_reason == "interrupted"
    assert trajectory.stages[0].configuration.subgoal == "look it up"
    assert [s.tool for s in trajectory.stages[0].steps] == ["lookup"]
    assert Trajectory.from_json(trajectory.to_json()).end_reason == "interrupted"


def test_a_system_exit_from_a_model_goes_on_with_the_trajectory_marked():
    model = ScriptedModel([CONFIG, raising(SystemExit(3))])
    with pytest.raises(SystemExit) as raised:
        agent(model, time_limit=30.0).run("task")
    assert raised.value.code == 3
    trajectory = interrupted_attempt(raised.value)
    assert trajectory.end_reason == "interrupted" and "SystemExit" in trajectory.error


class Silent(SyncModelBase):
    """A backend that answers every call with no content at all."""

    name = "silent"

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        return Completion(Message("assistant", content=None))


def test_a_reply_with_no_content_is_an_ordinary_empty_reply():
    trajectory = agent(Silent(), max_steps_per_stage=2, max_stages=1).run("task")
    assert trajectory.error is None
    assert trajectory.end_reason == "budget:steps"
    assert trajectory.stages[0].config_source == "fallback"
    assert Trajectory.from_json(trajectory.to_json()).to_dict() == trajectory.to_dict()


def test_a_20_mb_argument_is_not_run_and_leaves_a_bounded_trajectory():
    LOOKUPS.clear()
    model = ScriptedModel([CONFIG, call("lookup", key="k" * (20 * MB)), call("terminate", answer="done")])
    trajectory = agent(model).run("task")
    step = trajectory.stages[0].steps[0]
    assert LOOKUPS == []
    assert step.is_error and "over the limit of 100,000" in step.observation
    assert step.cut == {"arguments": 20 * MB + len('{"key": ""}')}
    assert len(trajectory.to_json()) < 1 * MB
    assert trajectory.answer == "done"


def test_a_20_mb_observation_is_cut_as_the_model_saw_it_and_the_cut_recorded():
    model = ScriptedModel([CONFIG, call("dump", size=20 * MB), call("terminate", answer="done")])
    trajectory = agent(model).run("task")
    step = trajectory.stages[0].steps[0]
    assert step.cut == {"observation": 20 * MB}
    assert "more characters cut: the limit is 100,000" in step.observation
    assert model.calls[-1]["messages"][-1].content == step.observation
    assert len(trajectory.to_json()) < 1 * MB


def test_a_20_mb_reply_text_is_cut():
    model = ScriptedModel([CONFIG, "y" * (20 * MB), call("terminate", answer="done")])
    trajectory = agent(model).run("task")
    reply = trajectory.stages[0].conversation.messages[2]
    assert reply.role == "assistant" and len(reply.content) < 100_100
    assert len(trajectory.to_json()) < 1 * MB
