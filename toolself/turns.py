"""One attempt's turns with the model: each call on the stage's view, and each tool result
that answers it, bounded and recorded.

Everything that keeps a turn within bounds sits here, so that the loop (see `agent`) only
decides what comes next: the attempt's budgets (cancel, time, tokens, context) are checked
before a call; a call still running at its deadline is abandoned (see `bounded`) and becomes
`BudgetExhausted`; a reply is cut to the size limit, a call with oversized arguments kept unrun
so the model is told; an observation is cut before it is recorded. It keeps what must outlive
one call: the deadlines, each conversation's token counts so far, the sizes of cut arguments.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import Any

from toolself.agent_settings import AgentSettings
from toolself.bounded import Abandoned, call_within
from toolself.context import ContextMode
from toolself.models.base import ChatModel, Completion, Message, ToolCall
from toolself.tools.base import Observation
from toolself.trajectory import Conversation, ModelCall, Stage, Step, Trajectory


class BudgetExhausted(Exception):
    """A budget of the attempt ran out (`budget` names it); the loop then asks once for the answer."""

    def __init__(self, budget: str):
        super().__init__(budget)
        self.budget = budget


class Turns:
    """The model calls and tool results of one attempt under its settings."""

    def __init__(self, settings: AgentSettings, model: ChatModel, trajectory: Trajectory,
                 cancel: threading.Event | None, deadline: float | None):
        self.s = settings
        self.model = model
        self.trajectory = trajectory
        self.cancel = cancel
        self.deadline = deadline
        self.final_deadline = deadline
        self.cut_arguments: dict[int, int] = {}  # id(ToolCall) -> characters its arguments had
        self._token_counts: dict[int, list[int]] = {}

    def check_budgets(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise BudgetExhausted("cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise BudgetExhausted("time")
        if self.s.max_total_tokens is not None and self.trajectory.usage.total_tokens >= self.s.max_total_tokens:
            raise BudgetExhausted("tokens")

    def token_counts(self, conversation: Conversation) -> list[int]:
        """Each message's tokens, counted once as the conversation grows: every view needs them."""
        counts = self._token_counts.setdefault(id(conversation), [])
        count = self.model.count_tokens
        for message in conversation.messages[len(counts):]:
            text = message.content + "".join(c.raw_arguments or json.dumps(c.arguments) for c in message.tool_calls)
            counts.append(count(text) + 4)
        return counts

    def decide(self, conversation: Conversation, kind: str, tools: list[dict[str, Any]] | None,
               mode: ContextMode, response_schema: dict[str, Any] | None = None, model: ChatModel | None = None,
               check: bool = True) -> tuple[Completion, int]:
        """One model call on the view `mode` gives of the conversation; the reply joins it."""
        if check:
            self.check_budgets()
        view = mode.view(conversation.messages, self.token_counts(conversation), self.s.context_budget)
        visible = conversation.render(view)
        if check and kind == "action" and self.s.context_limit is not None and \
                sum(self.model.count_tokens(m.content) + 4 for m in visible) > self.s.context_limit:
            raise BudgetExhausted("context")
        model = model or self.model
        deadline, cancel = (self.final_deadline, None) if kind == "final" else (self.deadline, self.cancel)
        try:
            completion = call_within(lambda: model.complete(
                visible, tools=tools, response_schema=response_schema, session=self.trajectory.id,
                max_tokens=self.s.max_tokens_per_call), deadline, cancel)
        except Abandoned as exc:
            raise BudgetExhausted(exc.reason) from None
        message = self.bounded_reply(completion.message)
        completion = replace(completion, message=message)
        conversation.messages.append(message)
        conversation.calls.append(ModelCall(
            kind=kind, view=view, output=len(conversation.messages) - 1,
            tools=[t["function"]["name"] for t in tools or []], response_schema=response_schema is not None,
            usage=completion.usage, latency=completion.latency, completion_token_ids=completion.completion_token_ids))
        self.trajectory.usage = self.trajectory.usage + completion.usage
        return completion, len(conversation.calls) - 1

    def bounded_reply(self, message: Message) -> Message:
        """The reply as the loop records and acts on it: an assistant message whose text is a
        string (None from a backend is an empty reply), with text and reasoning cut at the
        limit, and each call whose arguments are over it kept unrun, as a call that could not
        be read, so that the model is told and the trajectory stays bounded."""
        limit = self.s.max_reply_chars
        calls = []
        for call in message.tool_calls or []:
            raw = call.raw_arguments or (json.dumps(call.arguments) if call.arguments is not None else "")
            if len(raw) > limit or len(call.name or "") > limit:
                call = ToolCall(name=(call.name or "")[:limit], arguments=None, id=call.id, raw_arguments=raw[:limit],
                                error=f"its arguments are {len(raw):,} characters, over the limit of {limit:,}; "
                                      "send the content in smaller pieces")
                self.cut_arguments[id(call)] = len(raw)
            calls.append(call)
        reasoning = _cut(_as_text(message.reasoning), limit) if message.reasoning is not None else None
        return replace(message, role="assistant", content=_cut(_as_text(message.content), limit), tool_calls=calls,
                       reasoning=reasoning)

    def respond(self, stage: Stage, tool_call, observation: Observation, call_index: int,
                duration: float = 0.0, canonical: dict[str, Any] | None = None) -> Step:
        """The observation as the stage's next tool message and step (cut at the limit)."""
        content = _as_text(observation.content)
        cut = {"observation": len(content)} if len(content) > self.s.max_observation_chars else {}
        if id(tool_call) in self.cut_arguments:
            cut["arguments"] = self.cut_arguments[id(tool_call)]
        content = _cut(content, self.s.max_observation_chars)
        stage.conversation.messages.append(Message("tool", content, tool_call_id=tool_call.id,
                                                   name=tool_call.name or None))
        step = Step(tool=tool_call.name, arguments=tool_call.arguments, observation=content,
                    is_error=observation.is_error, duration=duration, call=call_index, cut=cut,
                    canonical=canonical if canonical is not None and canonical != tool_call.arguments else None)
        stage.steps.append(step)
        return step


def _as_text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit:,} more characters cut: the limit is {limit:,} ...]"
