"""Context-management modes: views within a token budget, and modes as typed, registrable objects."""

import json

import pytest

from toolself.agent import Agent, AgentSettings
from toolself.config import parse_configuration
from toolself.context import MODES, BasicMode, ContextMode, TruncationMode, make_mode, register_mode
from toolself.models.base import Message
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool
from toolself.trajectory import ELIDED, ELIDED_NOTE, Conversation


def stage_messages(turns: int, observation: str = "x" * 40) -> list[Message]:
    messages = [Message("system", "sys"), Message("user", "task")]
    for i in range(turns):
        assistant = call("lookup", key=str(i))
        assistant.tool_calls[0].id = f"c{i}"
        messages += [assistant, Message("tool", f"{i}:{observation}", tool_call_id=f"c{i}")]
    return messages


def tokens(messages):
    return [max(1, len(m.content) // 4) + 4 for m in messages]


def test_both_paper_modes_are_registered():
    assert {"basic", "truncation"} <= set(MODES)


def test_basic_keeps_everything_within_budget():
    messages = stage_messages(3)
    view = BasicMode().view(messages, tokens(messages), budget=10_000)
    assert view == [[i, None] for i in range(len(messages))]


def test_basic_clears_the_oldest_turns_and_keeps_the_pinned_and_recent_ones():
    messages = stage_messages(10)
    view = BasicMode().view(messages, tokens(messages), budget=60)
    indices = [i for i, _ in view]
    assert indices[:2] == [0, 1] and indices[2] == ELIDED
    assert indices[-2:] == [20, 21]
    assert 2 not in indices


def test_a_turn_is_dropped_whole_never_a_tool_result_without_its_call():
    messages = stage_messages(10)
    for budget in range(20, 200, 7):
        shown = [i for i, _ in BasicMode().view(messages, tokens(messages), budget) if i >= 2]
        for i in shown:
            if messages[i].role == "tool":
                assert i - 1 in shown


def test_the_latest_turn_is_kept_even_over_budget():
    messages = stage_messages(2, observation="y" * 10_000)
    indices = [i for i, _ in BasicMode().view(messages, tokens(messages), budget=10)]
    assert indices[-2:] == [4, 5]


def test_truncation_cuts_long_old_observations_and_keeps_the_last_ones_whole():
    messages = stage_messages(5, observation="z" * 2000)
    view = TruncationMode(keep_last=2, max_chars=100).view(messages, tokens(messages), budget=100_000)
    cuts = {i: keep for i, keep in view}
    tool_indices = [i for i, m in enumerate(messages) if m.role == "tool"]
    assert all(cuts[i] == 100 for i in tool_indices[:-2])
    assert all(cuts[i] is None for i in tool_indices[-2:])


def test_truncated_view_renders_a_placeholder_saying_how_much_was_cut():
    messages = stage_messages(4, observation="z" * 2000)
    conversation = Conversation(messages)
    view = TruncationMode(keep_last=1, max_chars=100).view(messages, tokens(messages), budget=100_000)
    rendered = conversation.render(view)
    assert "more characters of this earlier output were truncated" in rendered[3].content
    assert len(rendered[3].content) < 200 and rendered[-1].content == messages[-1].content


def test_elided_turns_render_as_a_note():
    messages = stage_messages(10)
    view = BasicMode().view(messages, tokens(messages), budget=60)
    assert ELIDED_NOTE in [m.content for m in Conversation(messages).render(view)]


def test_truncation_fits_more_turns_than_basic_in_the_same_budget():
    messages = stage_messages(8, observation="w" * 1200)
    basic = BasicMode().view(messages, tokens(messages), budget=1200)
    truncated = TruncationMode().view(messages, tokens(messages), budget=1200)
    assert len(truncated) > len(basic)


# typed, registrable modes ---------------------------------------------------------------------


class LastTurnMode(ContextMode):
    name = "last_turn"
    description = "only the latest turn stays in view"

    def view(self, messages, tokens, budget):
        turns = [i for i in range(self.pinned, len(messages)) if messages[i].role == "assistant"]
        start = turns[-1] if turns else self.pinned
        return [[i, None] for i in range(self.pinned)] + [[i, None] for i in range(start, len(messages))]


@pytest.fixture
def last_turn_mode():
    register_mode(LastTurnMode)
    yield LastTurnMode
    MODES.pop(LastTurnMode.name, None)


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return f"value of {key}"


def test_a_registered_mode_is_offered_to_the_policy_validated_and_used(last_turn_mode):
    configuration = json.dumps({"subgoal": "look up a and b", "strategy": "look up", "toolbox": ["lookup"],
                                "knowledge": "none", "context_mode": "last_turn"})
    model = ScriptedModel([configuration, call("lookup", key="a"), call("lookup", key="b"),
                           call("terminate", answer="done")])
    trajectory = Agent(model, ToolPool([lookup]), AgentSettings()).run("find a and b")
    spec = model.calls[0]["messages"][-1].content
    assert "- last_turn: only the latest turn stays in view" in spec
    assert "last_turn" in model.calls[0]["response_schema"]["properties"]["context_mode"]["enum"]
    stage = trajectory.stages[0]
    assert stage.config_source == "policy" and stage.configuration.context_mode == "last_turn"
    last = stage.conversation.calls[-1]
    assert [i for i, _ in last.view] == [0, 1, 4, 5]  # pinned, then only the turn that looked up b
    assert trajectory.answer == "done"


def test_an_unregistered_mode_is_a_validation_problem_never_a_silent_basic():
    with pytest.raises(ValueError, match="unknown context mode 'zen'"):
        AgentSettings(modes=("basic", "zen"))
    parsed = parse_configuration(json.dumps({"subgoal": "x", "strategy": "y", "toolbox": [], "knowledge": "none",
                                             "context_mode": "last_turn"}), [], ["basic", "truncation"])
    assert parsed.configuration is None and "unknown context mode 'last_turn'" in parsed.problems[0]


def test_settings_offer_every_registered_mode_by_default(last_turn_mode):
    assert AgentSettings().mode_names == ["basic", "truncation", "last_turn"]


def test_a_mode_and_its_parameters_are_built_from_a_record_and_written_back():
    mode = make_mode({"type": "truncation", "keep_last": 10, "message_max_chars": 10_000})
    assert isinstance(mode, TruncationMode) and mode.keep_last == 10
    assert make_mode(mode.to_dict()) == mode
    with pytest.raises(ValueError):
        make_mode({"type": "truncation", "keep_lats": 10})


def test_a_run_records_the_modes_with_their_parameters():
    settings = AgentSettings(modes=({"type": "basic", "window": 12}, "truncation"))
    assert settings.to_dict()["modes"][0] == {"type": "basic", "pinned": 2, "window": 12}
    assert AgentSettings(modes=tuple(settings.to_dict()["modes"])).modes == settings.modes
