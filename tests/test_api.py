"""The public Python API: the names the README uses import from the package, lazily, and a
decorated tool stays the function it was."""

from __future__ import annotations

import subprocess
import sys

import toolself
from toolself import Agent, default_pool, settings_for, tool
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import Observation, ToolContext


@tool
def add(amount: int) -> str:
    """Add to the counter.

    Args:
        amount: How much to add.
    """
    return f"counter is {amount}"


def test_every_public_name_imports_from_the_package_and_is_listed():
    for name in toolself.__all__:
        assert getattr(toolself, name) is not None
    assert {"Agent", "AgentSettings", "tool", "default_pool", "load_model", "load_tasks", "run_eval"} <= set(dir(toolself))


def test_an_unknown_name_is_an_attribute_error():
    try:
        toolself.nothing_here
    except AttributeError as exc:
        assert "nothing_here" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_package_loads_neither_torch_nor_an_http_client():
    code = "import sys, toolself; print(sorted(m for m in ('torch', 'httpx', 'transformers', 'openai') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_decorated_tool_is_still_callable_as_its_function():
    assert add(amount=3) == "counter is 3"
    assert add(4) == "counter is 4"


def test_the_agent_still_calls_a_tool_with_arguments_and_a_context():
    ctx = ToolContext.temporary()
    try:
        assert add({"amount": 3}, ctx) == Observation("counter is 3")
    finally:
        ctx.close()
    assert add({"amount": "many"}).is_error


def test_an_agent_built_from_the_public_api_runs_a_task_with_a_user_tool():
    model = ScriptedModel([call("add", amount=3), call("terminate", answer="3")])
    with default_pool(user_tools=[add]) as pool:
        trajectory = Agent(model, pool, settings_for("vanilla")).run("Add three, then stop.")
    assert trajectory.answer == "3"
    assert trajectory.stages[0].steps[0].observation == "counter is 3"
