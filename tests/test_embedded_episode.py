"""A real ToolSelf episode on the embedded model: every decision it writes parses."""

from __future__ import annotations

import pytest

from toolself.agent import Agent, AgentSettings
from toolself.cli import DEMO_QUESTION, demo_docs
from toolself.tools.base import ToolContext
from toolself.tools.collection import Collection
from toolself.tools.registry import default_pool


@pytest.mark.slow
def test_every_action_and_configuration_of_the_embedded_model_parses_without_repair():
    from toolself.models.local import EmbeddedModel

    model = EmbeddedModel.load()
    pool = default_pool(include=["search", "visit"])
    settings = AgentSettings(max_stages=2, max_steps_per_stage=3, context_budget=2000, config_max_text=120,
                             max_tokens_per_call=256)
    ctx = ToolContext.temporary(collection=Collection.from_path(demo_docs()), model=model)
    try:
        trajectory = Agent(model, pool, settings).run(DEMO_QUESTION, ctx)
    finally:
        ctx.close()
        pool.close()
    assert trajectory.error is None, trajectory.error
    assert all(stage.config_source == "policy" and not stage.config_problems for stage in trajectory.stages)
    decisions = [(conversation, call) for conversation in trajectory.conversations() for call in conversation.calls]
    assert any(call.kind == "action" for _, call in decisions)
    for conversation, call in decisions:
        reply = conversation.messages[call.output]
        if call.kind == "configure":
            assert reply.content.lstrip().startswith("{")
        else:
            assert reply.tool_calls, f"a {call.kind} turn without a tool call: {reply.content!r}"
            assert all(c.error is None and c.name in call.tools for c in reply.tool_calls)
        assert call.completion_token_ids, "the embedded model records the ids it generated"
    assert all("could not be read" not in step.observation and "no tool" not in step.observation
               for stage in trajectory.stages for step in stage.steps)
