"""The two tools every ToolSelf stage has besides its toolbox.

Their bodies never run: the agent loop intercepts both by name, because what they do
(archive a stage and ask for the next configuration; end the task) is the loop's business.
They are real `Tool`s so that their schemas and argument validation come from the same place
as every other tool's.
"""

from __future__ import annotations

from toolself.tools.base import Tool, tool

RECONFIGURE = "reconfigure"
TERMINATE = "terminate"


def _intercepted(*_args, **_kwargs) -> str:  # pragma: no cover - the agent handles these calls
    raise RuntimeError("reconfigure and terminate are handled by the agent loop")


@tool(name=RECONFIGURE)
def reconfigure(
    summary: str,
    reason: str,
    next_subgoal: str,
    toolbox_request: str | None = None,
    knowledge_request: str | None = None,
    strategy_request: str | None = None,
    context_mode_request: str | None = None,
) -> str:
    """Close this stage and configure the next one, when the current configuration no longer
    fits: the sub-goal is done but the task is not, the approach failed, a tool or knowledge is
    missing, or the strategy or context mode should change.

    Args:
        summary: What this stage found or did, with the concrete facts the next stages need.
        reason: Why the configuration must change.
        next_subgoal: The proposed sub-goal of the next stage.
        toolbox_request: Tools the next stage needs, if any.
        knowledge_request: What knowledge the next stage needs, if any.
        strategy_request: How the next stage should work, if it matters.
        context_mode_request: The context mode the next stage should use, if it matters.
    """
    return _intercepted()


@tool(name=TERMINATE)
def terminate(answer: str) -> str:
    """End the task with the final answer. Only when the main task is done.

    Args:
        answer: The final answer to the main task, short and exact.
    """
    return _intercepted()


SPECIAL_TOOLS: dict[str, Tool] = {RECONFIGURE: reconfigure, TERMINATE: terminate}
