"""The text tool-call protocol (Qwen / Hermes): for models and servers without native tool calls.

Tools are described in the system message inside `<tools>` tags; the model answers with
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; results come back in a user
turn inside `<tool_response>` tags. Qwen3 `<think>` blocks are split off into
`Message.reasoning`.

`TextProtocol` holds what varies: toolself's default runs every call of a reply and never sends
`<think>` back; the authors' (`PAPER`) runs only the first call of a reply, keeps `<think>` in
the context, and leaves the tool list to the prompt, whose user turn already carries it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from toolself.models.base import Message, ToolCall

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    body = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return TOOLS_PREAMBLE + body + TOOLS_POSTAMBLE


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class TextProtocol:
    """first_call_only: a reply's later `<tool_call>` blocks are ignored, as if not written.
    keep_think: an assistant turn goes back with its `<think>` block.
    tools_in_system: the tool schemas are appended to the system message."""

    first_call_only: bool = False
    keep_think: bool = False
    tools_in_system: bool = True


DEFAULT = TextProtocol()
PAPER = TextProtocol(first_call_only=True, keep_think=True, tools_in_system=False)
TEXT_PROTOCOLS = {"default": DEFAULT, "paper": PAPER}


def text_protocol_named(protocol: TextProtocol | str) -> TextProtocol:
    """A protocol given by name (as run files and model options carry it) or as itself."""
    if isinstance(protocol, TextProtocol):
        return protocol
    if protocol not in TEXT_PROTOCOLS:
        raise ValueError(f"unknown text protocol {protocol!r}; known: {list(TEXT_PROTOCOLS)}")
    return TEXT_PROTOCOLS[protocol]


def to_text_messages(messages: list[Message], tools: list[dict[str, Any]] | None,
                     protocol: TextProtocol = DEFAULT) -> list[dict[str, Any]]:
    """Flatten typed messages into plain role/content turns a template without tool support
    can render. Consecutive tool results share one user turn, as in Qwen's template. A user
    turn with images keeps them as content parts, as the native wire sends them: the protocol
    is about tool calls, and a served vision model reads the parts either way."""
    out: list[dict[str, Any]] = []
    tool_text = tools_system_text(tools) if tools and protocol.tools_in_system else ""
    for i, m in enumerate(messages):
        if m.role == "system":
            content = m.content + ("\n\n" + tool_text if tool_text and i == 0 else "")
            out.append({"role": "system", "content": content})
        elif m.role == "assistant":
            parts = [f"<think>\n{m.reasoning}\n</think>"] if protocol.keep_think and m.reasoning else []
            parts += [m.content] if m.content else []
            for c in m.tool_calls:
                args = c.arguments if c.arguments is not None else c.raw_arguments
                parts.append("<tool_call>\n" + json.dumps({"name": c.name, "arguments": args}, ensure_ascii=False)
                             + "\n</tool_call>")
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif m.role == "tool":
            block = f"<tool_response>\n{m.content}\n</tool_response>"
            last = out[-1]["content"] if out and out[-1]["role"] == "user" else None
            if isinstance(last, str) and last.startswith("<tool_response>"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append({"role": m.role, "content": m.to_openai()["content"]})
    if tool_text and (not messages or messages[0].role != "system"):
        out.insert(0, {"role": "system", "content": tool_text})
    return out


def split_reasoning(text: str) -> tuple[str, str | None]:
    """Remove `<think>` blocks; return (rest, reasoning)."""
    thoughts = [m.strip() for m in _THINK.findall(text)]
    if not thoughts and "</think>" in text:  # template opened the block in the prompt
        head, _, text = text.partition("</think>")
        thoughts = [head.strip()]
    rest = _THINK.sub("", text).strip()
    return rest, ("\n".join(thoughts) if thoughts else None)


def parse_tool_calls_text(text: str, protocol: TextProtocol = DEFAULT) -> Message:
    """Parse an assistant reply written in the text protocol.

    A block that is not valid JSON still becomes a `ToolCall` carrying the error, so the agent
    can tell the model exactly what was wrong with its call.
    """
    content, reasoning = split_reasoning(text)
    calls: list[ToolCall] = []
    blocks = _TOOL_CALL.findall(content)
    for raw in blocks[:1] if protocol.first_call_only else blocks:
        raw = raw.strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(name="", arguments=None, id=new_call_id(), raw_arguments=raw,
                                  error=f"the tool call is not valid JSON: {exc.msg}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall(name="", arguments=None, id=new_call_id(), raw_arguments=raw,
                                  error='a tool call must be {"name": <tool name>, "arguments": {...}}'))
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            calls.append(ToolCall.from_raw(obj["name"], args, id=new_call_id()))
        else:
            call = ToolCall.from_raw(obj["name"], json.dumps(args), id=new_call_id())
            calls.append(call)
    visible = _TOOL_CALL.sub("", content).strip()
    return Message(role="assistant", content=visible, tool_calls=calls, reasoning=reasoning)
