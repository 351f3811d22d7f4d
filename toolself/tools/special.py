"""The two tools every ToolSelf stage has besides its toolbox.

Their bodies never run: the agent loop intercepts both by name, because what they do
(archive a stage and ask for the next configuration; end the task) is the loop's business.
They are real `Tool`s so that their schemas and argument validation come from the same place
as every other tool's. Each has two forms: toolself's and the authors' (`OFFICIAL_TOOLS`).
"""

from __future__ import annotations

from typing import Any

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


# The authors' argument names. A checkpoint trained on their format calls these; the loop accepts
# them under either dialect and reads them into toolself's form (`canonical_arguments`).

DETAIL_KEYS = ("toolbox", "knowledge", "strategy", "context_mode")


@tool(name=RECONFIGURE)
def reconfigure_official(
    execution_summary: str,
    update_reason: str,
    new_sub_goal: str,
    additional_details: dict[str, str] | None = None,
) -> str:
    """Reconfigure: end the current stage and request a new configuration. Use it when the
    sub-goal is completed but the main task is not, when the approach failed, when a tool or
    knowledge is missing, or when the strategy or context mode should change.

    Args:
        execution_summary: A detailed summary of what this stage did and found, with the concrete facts.
        update_reason: Why the configuration must be updated.
        new_sub_goal: The sub-goal the next stage must adopt.
        additional_details: Optional requirements for the next configuration, by key: toolbox,
            knowledge, strategy, context_mode.
    """
    return _intercepted()


@tool(name=TERMINATE)
def terminate_official(status: str, result: str, summary: str = "") -> str:
    """Terminate: end the task when the main task is complete, with its final result.

    Args:
        status: success or failure.
        result: The final answer to the main task, short and exact.
        summary: A short summary of how the answer was reached.
    """
    return _intercepted()


OFFICIAL_TOOLS: dict[str, Tool] = {RECONFIGURE: reconfigure_official, TERMINATE: terminate_official}


def _official_only(name: str) -> set[str]:
    return set(OFFICIAL_TOOLS[name].parameters["properties"]) - set(SPECIAL_TOOLS[name].parameters["properties"])


def canonical_arguments(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The validated arguments of `reconfigure` or `terminate` in toolself's form, whichever
    form the model wrote (the authors' when it uses any of their argument names). Raises
    `ToolArgumentError` naming the problems in the form the model used."""
    if not set(arguments) & _official_only(name):
        return SPECIAL_TOOLS[name].validate(arguments)
    given = OFFICIAL_TOOLS[name].validate(arguments)
    if name == TERMINATE:
        return {"answer": given["result"]}
    details = {str(k).lower(): v for k, v in (given["additional_details"] or {}).items()}
    out: dict[str, Any] = {"summary": given["execution_summary"], "reason": given["update_reason"],
                           "next_subgoal": given["new_sub_goal"]}
    for key in DETAIL_KEYS:
        value = next((details[k] for k in (key, f"{key}_request", f"{key}_requirement", f"{key}_requirements")
                      if details.get(k)), None)
        out[f"{key}_request"] = value
    return out
