"""A model that replays canned replies: for deterministic tests of the loop, never for results."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Union

from toolself.models.base import Completion, Message, SyncModelBase, ToolCall, Usage
from toolself.models.protocol import new_call_id, parse_tool_calls_text

Reply = Union[str, Message, Callable[[list[Message], Any], Union[str, Message]]]


def call(name: str, **arguments: Any) -> Message:
    """An assistant message with one native tool call."""
    return Message(role="assistant", tool_calls=[ToolCall(name=name, arguments=arguments, id=new_call_id(),
                                                           raw_arguments=json.dumps(arguments))])


class ScriptedModel(SyncModelBase):
    """Returns `replies` in order. A string reply is parsed with the text tool-call protocol
    (so malformed text exercises the same path as a real model); a callable is given the
    messages and tools and returns the reply; after the script ends `default` is repeated."""

    def __init__(self, replies: list[Reply], default: Reply | None = None, name: str = "scripted"):
        self.replies = list(replies)
        self.default = default
        self.name = name
        self.calls: list[dict[str, Any]] = []

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        start = time.perf_counter()
        self.calls.append({"messages": list(messages), "tools": tools, "response_schema": response_schema})
        if self.replies:
            reply = self.replies.pop(0)
        elif self.default is not None:
            reply = self.default
        else:
            raise IndexError("the scripted model ran out of replies")
        if callable(reply) and not isinstance(reply, Message):
            reply = reply(messages, tools)
        if isinstance(reply, str):
            message = parse_tool_calls_text(reply) if tools else Message(role="assistant", content=reply)
        else:
            message = reply
        prompt_tokens = sum(self.count_tokens(m.content) for m in messages)
        completion_tokens = self.count_tokens(message.content + "".join(c.raw_arguments for c in message.tool_calls))
        return Completion(message=message, usage=Usage(prompt_tokens, completion_tokens),
                          latency=time.perf_counter() - start)
