"""toolself: agents that reconfigure themselves at run time, and CAT training to make them good at it.

The public surface, for use from Python (the README shows it end to end):

    from toolself import Agent, default_pool, load_model, settings_for, tool

    @tool
    def add(amount: int) -> str:
        '''Add to the counter.

        Args:
            amount: How much to add.
        '''
        return str(amount)

    agent = Agent(load_model("embedded"), default_pool(user_tools=[add]), settings_for("toolself"))
    trajectory = agent.run("Add three to the counter, then stop.")

Names are imported on first use, so `import toolself` stays fast and pulls in neither torch
nor an HTTP client; everything else lives in its module and may change between versions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "Agent": "toolself.agent",
    "AgentSettings": "toolself.agent",
    "Observer": "toolself.agent",
    "settings_for": "toolself.variants",
    "tool": "toolself.tools.base",
    "Tool": "toolself.tools.base",
    "ToolContext": "toolself.tools.base",
    "ToolPool": "toolself.tools.base",
    "default_pool": "toolself.tools.registry",
    "load_model": "toolself.models",
    "ChatModel": "toolself.models",
    "Message": "toolself.models",
    "Trajectory": "toolself.trajectory",
    "load_tasks": "toolself.evals.loaders",
    "run_eval": "toolself.evals.runner",
}

__all__ = sorted(_PUBLIC) + ["__version__"]

if TYPE_CHECKING:  # what type checkers and editors see; at run time `__getattr__` imports
    from toolself.agent import Agent, AgentSettings, Observer
    from toolself.evals.loaders import load_tasks
    from toolself.evals.runner import run_eval
    from toolself.models import ChatModel, Message, load_model
    from toolself.tools.base import Tool, ToolContext, ToolPool, tool
    from toolself.tools.registry import default_pool
    from toolself.trajectory import Trajectory
    from toolself.variants import settings_for


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'toolself' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
