"""The tool interface: schemas from code, validation, errors as observations."""

from pathlib import Path
from typing import Literal

import pytest

from toolself.tools.base import Observation, Tool, ToolContext, ToolError, ToolPool, parse_docstring, tool


@tool
def add(a: int, b: int = 2, mode: Literal["plain", "loud"] = "plain", note: str | None = None) -> str:
    """Add two numbers.

    Useful for arithmetic.

    Args:
        a: The first number.
        b: The second number,
            which defaults to two.
        mode: How to print.
        note: Anything to append.

    Returns:
        The sum as text.
    """
    return f"{a + b}{'!' if mode == 'loud' else ''}{note or ''}"


def test_schema_comes_from_type_hints_and_the_args_section():
    params = add.schema["function"]["parameters"]
    assert add.schema["function"]["description"] == "Add two numbers.\n\nUseful for arithmetic."
    assert params["required"] == ["a"]
    assert params["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert params["properties"]["b"]["description"] == "The second number, which defaults to two."
    assert params["properties"]["mode"]["enum"] == ["plain", "loud"]
    assert params["properties"]["note"]["type"] == "string"  # optional, shown without a null union


def test_valid_arguments_run_the_function():
    assert add({"a": 1}).content == "3"
    assert add({"a": 1, "b": 5, "mode": "loud"}).content == "6!"


@pytest.mark.parametrize(
    "arguments, problem",
    [({}, "a: Field required"), ({"a": "x"}, "a: Input should be a valid integer"),
     ({"a": 1, "c": 2}, "c: Extra inputs are not permitted"), ({"a": 1, "mode": "quiet"}, "mode:")],
)
def test_bad_arguments_become_an_error_observation_naming_the_problem(arguments, problem):
    observation = add(arguments)
    assert observation.is_error and problem in observation.content
    assert "Expected arguments: a, b?, mode?, note?" in observation.content


def test_an_exception_inside_a_tool_becomes_an_error_observation():
    @tool
    def boom(x: int) -> str:
        """Explode.

        Args:
            x: anything
        """
        raise KeyError("missing")

    observation = boom({"x": 1})
    assert observation.is_error and "KeyError" in observation.content


def test_tool_error_is_shown_verbatim():
    @tool
    def picky(x: int) -> str:
        """Refuse.

        Args:
            x: anything
        """
        raise ToolError("x must be even")

    assert picky({"x": 1}).content == "picky failed: x must be even"


def test_a_context_argument_is_injected_and_hidden_from_the_schema(tmp_path):
    @tool
    def where(ctx: ToolContext) -> Observation:
        """Say where the workspace is."""
        return Observation(str(ctx.workspace))

    assert where.parameters["properties"] == {}
    assert where({}, ToolContext(workspace=tmp_path)).content == "."


def test_the_model_sees_its_workspace_as_dot(tmp_path):
    @tool
    def report(ctx: ToolContext) -> Observation:
        """Fail the way a test run does, naming files by absolute path."""
        ws = ctx.workspace
        return Observation(f'File "{ws}/tests/test_units.py", line 8\nws {ws}.\nsibling {ws}-old/x, {ws}.bak',
                           is_error=True)

    seen = report({}, ToolContext(workspace=tmp_path)).content
    assert seen == f'File "./tests/test_units.py", line 8\nws ..\nsibling {tmp_path}-old/x, {tmp_path}.bak'


def test_a_relative_workspace_path_is_not_replaced_inside_words(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    assert ToolContext(workspace=Path("ws")).relative(f"news in {tmp_path}/ws/a.txt") == "news in ./a.txt"


def test_errors_name_the_workspace_as_dot_too(tmp_path):
    @tool
    def refuse(ctx: ToolContext) -> str:
        """Refuse, naming the workspace root."""
        raise ToolError(f"use a path inside {ctx.workspace}")

    assert refuse({}, ToolContext(workspace=tmp_path)).content == "refuse failed: use a path inside ."


def test_a_tool_without_type_hints_is_refused():
    def untyped(x):
        """No hints."""

    with pytest.raises(TypeError, match="needs a type hint"):
        Tool(untyped)


def test_the_pool_refuses_duplicate_names_and_lists_a_catalogue():
    pool = ToolPool([add])
    with pytest.raises(ValueError, match="already in the pool"):
        pool.add(add)
    assert pool.catalogue() == "- add(a: integer, b: integer (optional), mode: string (optional), note: string (optional)): Add two numbers."


def test_docstring_without_args_section_is_all_description():
    assert parse_docstring("Just this.") == ("Just this.", {})
