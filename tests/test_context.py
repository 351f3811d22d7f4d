"""Context-management modes: views within a token budget."""

from toolself.context import MODES, BasicMode, TruncationMode
from toolself.models.base import Message
from toolself.models.scripted import call
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
