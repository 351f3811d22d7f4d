"""Configurations: schema, parsing and validation against the pool."""

import json

import pytest

from toolself.config import Configuration, configuration_schema, fallback_configuration, parse_configuration

POOL = ["search", "visit", "code_interpreter"]
MODES = ["basic", "truncation"]
GOOD = {"subgoal": "find the founder", "strategy": "search then visit", "toolbox": ["search", "visit"],
        "knowledge": "none", "context_mode": "basic"}


def test_a_valid_configuration_parses():
    parsed = parse_configuration(json.dumps(GOOD), POOL, MODES)
    assert parsed.problems == []
    assert parsed.configuration == Configuration(**GOOD)


def test_a_configuration_inside_a_fenced_block_or_prose_parses():
    text = "Here it is:\n```json\n" + json.dumps(GOOD) + "\n```"
    assert parse_configuration(text, POOL, MODES).configuration is not None
    assert parse_configuration("Sure. " + json.dumps(GOOD) + " Done.", POOL, MODES).configuration is not None


def test_duplicate_tools_are_kept_once_in_order():
    parsed = parse_configuration(json.dumps({**GOOD, "toolbox": ["visit", "search", "visit"]}), POOL, MODES)
    assert parsed.configuration.toolbox == ["visit", "search"]


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"toolbox": ["search", "teleport"]}, "unknown tool(s) ['teleport']"),
        ({"toolbox": "search"}, "must be a list of tool names"),
        ({"context_mode": "zen"}, "unknown context mode 'zen'"),
        ({"knowledge": "everything"}, "unknown knowledge source 'everything'"),
        ({"knowledge": "summary"}, "'knowledge_summary' is empty"),
        ({"subgoal": "  "}, "'subgoal' must not be empty"),
        ({"strategy": 3}, "'strategy' must be a string"),
        ({"colour": "blue"}, "unknown field(s) ['colour']"),
    ],
)
def test_each_invalid_field_is_named(change, problem):
    parsed = parse_configuration(json.dumps({**GOOD, **change}), POOL, MODES)
    assert parsed.configuration is None
    assert any(problem in p for p in parsed.problems), parsed.problems


def test_every_missing_field_is_reported_at_once():
    parsed = parse_configuration(json.dumps({"subgoal": "x"}), POOL, MODES)
    assert {"missing field 'strategy'", "missing field 'toolbox'", "missing field 'knowledge'",
            "missing field 'context_mode'"} <= set(parsed.problems)


def test_unparsable_json_says_where():
    parsed = parse_configuration('{"subgoal": "x",', POOL, MODES)
    assert parsed.configuration is None and "line 1" in parsed.problems[0]


def test_the_schema_enumerates_the_pool_and_the_modes():
    schema = configuration_schema(POOL, MODES, max_text=100)
    assert schema["properties"]["toolbox"]["items"]["enum"] == POOL
    assert schema["properties"]["context_mode"]["enum"] == MODES
    assert schema["properties"]["strategy"]["maxLength"] == 100
    assert set(schema["required"]) == {"subgoal", "strategy", "toolbox", "knowledge", "context_mode"}


def test_the_fallback_is_always_valid_and_keeps_the_previous_mode():
    previous = Configuration(**{**GOOD, "context_mode": "truncation"})
    fallback = fallback_configuration("next", POOL, previous)
    assert fallback.toolbox == POOL and fallback.context_mode == "truncation" and fallback.subgoal == "next"
    parsed = parse_configuration(fallback.to_json(), POOL, MODES)
    assert parsed.configuration == fallback


def test_the_schema_shown_and_the_validation_applied_come_from_one_model():
    from toolself.config import configuration_model

    model = configuration_model(tuple(POOL), tuple(MODES), 100)
    assert configuration_schema(POOL, MODES, max_text=100)["properties"].keys() == model.model_fields.keys()


def test_a_text_over_the_schema_max_length_is_rejected():
    parsed = parse_configuration(json.dumps({**GOOD, "strategy": "s" * 101}), POOL, MODES, max_text=100)
    assert parsed.configuration is None
    assert parsed.problems == ["field 'strategy' has 101 characters, over the limit of 100"]


@pytest.mark.parametrize("knowledge, source, summary", [("", "none", ""), ("ALL", "history", ""),
                                                        ("a is alpha", "summary", "a is alpha")])
def test_the_official_knowledge_form_reads_into_the_same_configuration(knowledge, source, summary):
    data = {k: v for k, v in GOOD.items() if k != "knowledge"} | {"knowledge": knowledge}
    parsed = parse_configuration(json.dumps(data), POOL, MODES, knowledge_form="official")
    assert parsed.configuration.knowledge == source and parsed.configuration.knowledge_summary == summary


def test_the_official_schema_describes_knowledge_as_free_text():
    schema = configuration_schema(POOL, MODES, knowledge_form="official")
    assert schema["properties"]["knowledge"]["type"] == "string" and "enum" not in schema["properties"]["knowledge"]
    assert "knowledge_summary" not in schema["properties"]
