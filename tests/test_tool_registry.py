"""The global pool: built-ins, user tools from files and modules, MCP servers, the `tools list` command."""

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from toolself.tools.base import Tool, ToolContext, tool
from toolself.tools.cli import tools_app
from toolself.tools.registry import BUILTIN_NAMES, default_pool, load_user_tools

SERVER = str(Path(__file__).with_name("mcp_server.py"))

USER_TOOLS = '''
from toolself.tools.base import tool

@tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text to count.
    """
    return len(text.split())

def helper():  # not a tool: stays out of the pool
    return 1
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(USER_TOOLS)
    return path


def test_default_pool_has_every_builtin():
    with default_pool() as pool:
        assert pool.names == BUILTIN_NAMES
        for t in pool:
            assert t.schema["function"]["parameters"]["type"] == "object"


def test_include_selects_builtins_and_rejects_unknown_names():
    with default_pool(include=["search", "visit"]) as pool:
        assert pool.names == ["search", "visit"]
    with pytest.raises(ValueError, match="unknown built-in tools \\['browser'\\]"):
        default_pool(include=["search", "browser"])


def test_user_tools_from_a_file_join_the_pool(user_file):
    with default_pool(include=[], user_tools=[str(user_file)]) as pool:
        assert pool.names == ["word_count"]
        assert pool["word_count"]({"text": "one two three"}).content == "3"
        assert pool["word_count"].parameters["properties"]["text"]["description"] == "The text to count."


def test_user_tools_from_a_module(user_file, monkeypatch):
    monkeypatch.syspath_prepend(str(user_file.parent))
    assert [t.name for t in load_user_tools("my_tools")] == ["word_count"]


def test_module_without_tools_is_an_error(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no @tool function"):
        load_user_tools(str(tmp_path / "empty.py"))


def test_tool_objects_can_be_passed_directly():
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    with default_pool(include=["search"], user_tools=[ping]) as pool:
        assert pool.names == ["search", "ping"] and isinstance(pool["ping"], Tool)


def test_name_clash_with_a_builtin_is_refused(tmp_path):
    (tmp_path / "clash.py").write_text("from toolself.tools.base import tool\n\n@tool\ndef search(q: str) -> str:\n    return q\n")
    with pytest.raises(ValueError, match="already in the pool"):
        default_pool(user_tools=[str(tmp_path / "clash.py")])


def test_config_file_with_user_tools_and_an_mcp_server(tmp_path, user_file):
    config = tmp_path / "tools.json"
    config.write_text(json.dumps({
        "include": ["search"],
        "userTools": ["my_tools.py"],
        "mcpServers": {"demo": {"command": sys.executable, "args": [SERVER]}},
    }))
    with default_pool(config=config) as pool:
        assert pool.names[:2] == ["search", "word_count"]
        assert "demo__add" in pool
        assert pool["demo__add"]({"a": 1, "b": 2}).content == "3"


def test_builtin_tools_run_through_the_pool():
    ctx = ToolContext.temporary()
    try:
        with default_pool() as pool:
            assert pool["execute_bash"]({"command": "echo hi"}, ctx).content == "hi"
            assert pool["code_interpreter"]({"code": "2 ** 10"}, ctx).content == "[value]\n1024"
            assert pool["str_replace_editor"]({"command": "view", "path": ".."}, ctx).is_error
    finally:
        ctx.close()


def cli():
    app = typer.Typer()
    app.add_typer(tools_app, name="tools")  # as the main CLI mounts it
    return app


def test_tools_list_prints_every_tool_with_its_schema(user_file):
    result = CliRunner().invoke(cli(), ["tools", "list", "--user-tools", str(user_file)])
    assert result.exit_code == 0, result.output
    for name in BUILTIN_NAMES + ["word_count"]:
        assert name in result.output
    assert '"required"' in result.output


def test_tools_list_json_is_the_openai_schema(user_file):
    result = CliRunner().invoke(cli(), ["tools", "list", "--json", "--user-tools", str(user_file)])
    schemas = json.loads(result.output)
    assert [s["function"]["name"] for s in schemas] == BUILTIN_NAMES + ["word_count"]


def test_tools_list_reports_an_unreachable_server():
    result = CliRunner().invoke(cli(), ["tools", "list", "--mcp", "bad=http://127.0.0.1:9/mcp"])
    assert result.exit_code == 2 and "could not connect to MCP server 'bad'" in result.output


def test_every_builtin_answers_bad_arguments_with_an_observation_naming_them():
    ctx = ToolContext.temporary()
    try:
        with default_pool() as pool:
            for t in pool:
                unknown = t({"bogus": 1}, ctx)
                assert unknown.is_error and "bogus" in unknown.content, t.name
                required = t.parameters.get("required", [])
                missing = t({}, ctx)
                assert missing.is_error and all(name in missing.content for name in required), t.name
    finally:
        ctx.close()
