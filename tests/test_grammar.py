"""The grammars that constrain the embedded model, checked against a one-character vocabulary
(so no model or tokenizer has to load)."""

from __future__ import annotations

import json

import pytest

xgr = pytest.importorskip("xgrammar")

from toolself.config import configuration_schema  # noqa: E402
from toolself.models.base import Message  # noqa: E402
from toolself.models.grammar import (  # noqa: E402
    DEFAULT_MAX_ITEMS,
    GrammarCache,
    cap_strings,
    grammar_key,
    tool_call_schema,
)

VOCAB = [chr(c) for c in range(32, 127)] + ["\n", "<eos>"]
EOS = len(VOCAB) - 1

TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
        "type": "object",
        "properties": {"query": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}},
        "required": ["query"]}}},
    {"type": "function", "function": {"name": "visit", "description": "Read a page.", "parameters": {
        "type": "object",
        "properties": {"locator": {"type": "string"}, "page": {"type": "integer"}},
        "required": ["locator"]}}},
    {"type": "function", "function": {"name": "terminate", "description": "Finish.", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]


@pytest.fixture(scope="module")
def grammars() -> GrammarCache:
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return GrammarCache(info, len(VOCAB), max_string=20)


def call_text(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


NO_ESCAPES = ("xgrammar's rule for a string with maxLength admits no JSON escape (quote, backslash, line break); "
              "every EBNF rewrite that widens it made token masks hundreds of times slower, so capped text is one "
              "line and verbatim arguments go uncapped. See toolself/models/grammar.py.")


def accepts(matcher, text: str) -> bool:
    return matcher.accept_string(text)


def test_free_strings_get_a_length_cap_and_constrained_ones_keep_theirs():
    schema = {"type": "object", "properties": {
        "free": {"type": "string"},
        "choice": {"type": "string", "enum": ["a", "b"]},
        "short": {"type": "string", "maxLength": 5},
        "nested": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
    }}
    capped = cap_strings(schema, 30)
    props = capped["properties"]
    assert props["free"]["maxLength"] == 30
    assert "maxLength" not in props["choice"]
    assert props["short"]["maxLength"] == 5
    assert props["nested"]["items"]["anyOf"][0]["maxLength"] == 30
    assert "maxLength" not in schema["properties"]["free"], "the input schema is left untouched"


def test_arrays_get_an_item_cap_and_enumerated_arrays_stop_at_the_number_of_choices():
    capped = cap_strings({"type": "object", "properties": {
        "toolbox": {"type": "array", "items": {"type": "string", "enum": ["search", "visit"]}},
        "notes": {"type": "array", "items": {"type": "string"}},
    }})
    assert capped["properties"]["toolbox"]["maxItems"] == 2
    assert capped["properties"]["notes"]["maxItems"] == DEFAULT_MAX_ITEMS


def test_tool_call_schema_offers_every_tool_by_its_constant_name():
    schema = tool_call_schema(TOOLS)
    names = [option["properties"]["name"]["const"] for option in schema["anyOf"]]
    assert names == ["search", "visit", "terminate"]


def test_a_valid_call_of_each_offered_tool_is_accepted(grammars):
    for name, args in [("search", {"query": "capital of France"}), ("search", {"query": ["a", "b"]}),
                       ("visit", {"locator": "doc-1", "page": 2}), ("terminate", {"answer": "Paris"})]:
        matcher = grammars.matcher(TOOLS, None)
        assert accepts(matcher, call_text(name, args)), (name, args)
        assert matcher.accept_token(EOS)
        assert matcher.is_terminated()


def test_an_unknown_tool_name_is_rejected(grammars):
    assert not accepts(grammars.matcher(TOOLS, None), '<tool_call>\n{"name": "delete_everything"')


def test_arguments_must_match_the_chosen_tools_own_schema(grammars):
    assert not accepts(grammars.matcher(TOOLS, None), '<tool_call>\n{"name": "visit", "arguments": {"query"')
    assert not accepts(grammars.matcher(TOOLS, None), '<tool_call>\n{"name": "visit", "arguments": {"page": 1}}')


def test_free_text_strings_stop_at_the_cap(grammars):
    assert accepts(grammars.matcher(TOOLS, None), call_text("terminate", {"answer": "x" * 20}))
    assert not accepts(grammars.matcher(TOOLS, None), call_text("terminate", {"answer": "x" * 21}))


def test_the_reply_is_exactly_one_call_then_the_end_of_turn(grammars):
    matcher = grammars.matcher(TOOLS, None)
    assert not accepts(matcher, "Sure! <tool_call>")
    matcher = grammars.matcher(TOOLS, None)
    assert accepts(matcher, call_text("terminate", {"answer": "ok"}))
    assert not matcher.accept_string("\n<tool_call>")


def test_a_response_schema_accepts_a_valid_configuration_only(grammars):
    schema = configuration_schema(["search", "visit"], ["basic", "truncation"], max_text=50)
    good = {"subgoal": "find it", "strategy": "search then read", "toolbox": ["search"],
            "knowledge": "history", "knowledge_summary": "", "context_mode": "basic"}
    assert accepts(grammars.matcher(None, schema), json.dumps(good))
    assert not accepts(grammars.matcher(None, schema), json.dumps({**good, "context_mode": "turbo"}))
    assert not accepts(grammars.matcher(None, schema), json.dumps({**good, "toolbox": ["bash"]}))


def test_unconstrained_calls_have_no_grammar_and_equal_constraints_share_one(grammars):
    assert grammar_key(None, None) is None
    assert grammars.matcher(None, None) is None
    assert grammars.compiled(TOOLS, None) is grammars.compiled(json.loads(json.dumps(TOOLS)), None)


def teacher_replies() -> tuple[list, list[str], list]:
    """(pool, the configurations, the tool calls) the expert teacher writes on every suite,
    with and without its wrong turns."""
    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool

    pool = default_pool()
    configs, calls = [], []
    for suite in ("research", "data", "code", "mixed"):
        for attempt in scored_attempts(f"builtin:{suite}", limit=3, noises=(0.0, 1.0), pool=pool):
            conversations = [c for s in attempt.stages for c in (s.config_conversation, s.conversation) if c]
            for message in (m for c in conversations for m in c.messages if m.role == "assistant"):
                if message.content.startswith('{"subgoal"'):
                    configs.append(message.content)
                calls += message.tool_calls
    return pool, configs, calls


@pytest.fixture(scope="module")
def student_grammars() -> GrammarCache:
    """The grammars at the embedded model's own string cap."""
    return GrammarCache(xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS]), len(VOCAB))


def test_everything_the_expert_teacher_writes_the_constrained_student_can_write(student_grammars):
    """The student is trained on the teacher's replies and then decodes under the grammars,
    which fix the field order, keep capped text to one line and leave verbatim arguments
    (code, commands, edits) free: a reply the grammar rejects is one the student can never
    reproduce."""
    from toolself.cli import model_defaults
    from toolself.models.protocol import to_text_messages
    from toolself.tools.special import SPECIAL_TOOLS

    pool, configs, calls = teacher_replies()
    schema = configuration_schema([t.name for t in pool], ["basic", "truncation"],
                                  max_text=model_defaults("embedded").config_max_text)
    assert len(configs) >= 24 and any('"knowledge": "summary"' in text for text in configs)
    for text in configs:
        assert accepts(student_grammars.matcher(None, schema), text), text
    tools = pool.schemas() + [t.schema for t in SPECIAL_TOOLS.values()]
    written = [to_text_messages([Message("assistant", "", tool_calls=[c])], None)[0]["content"] for c in calls]
    assert any("\\n" in text for text in written), "some verbatim argument spans lines"
    assert {c.name for c in calls} >= {"search", "visit", "code_interpreter", "str_replace_editor", "execute_bash",
                                       "reconfigure", "terminate"}
    for text in written:
        assert accepts(student_grammars.matcher(tools, None), text), text


def test_verbatim_arguments_may_hold_any_json_escape_and_have_no_cap(grammars):
    tools = [{"type": "function", "function": {"name": "code_interpreter", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "contentMediaType": "text/plain"}},
        "required": ["code"]}}}]
    for code in ('print("hi")\nprint(1)', "x = '\\\\'", "y = 1  # " + "z" * 60):
        assert accepts(grammars.matcher(tools, None), call_text("code_interpreter", {"code": code})), code


@pytest.mark.xfail(strict=True, reason=NO_ESCAPES)
def test_a_capped_string_may_hold_json_escapes_and_stays_capped(grammars):
    schema = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 12}},
              "required": ["code"], "additionalProperties": False}
    for value in ("a = 1\nb = 2", 'say "hi"', "C:\\dir", "x" * 12):
        assert accepts(grammars.matcher(None, schema), json.dumps({"code": value})), value
    assert not accepts(grammars.matcher(None, schema), json.dumps({"code": "x" * 13}))
    assert not accepts(grammars.matcher(None, schema), '{"code": "bad \\q"}')
