"""The boundary between the agent and any language model.

Messages use the OpenAI chat shape because every backend we talk to (vLLM, SGLang, Ollama,
llama.cpp, OpenAI itself, our own `toolself serve`) already speaks it; the records here are
that shape made typed, so that a trajectory can be written and read back losslessly.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class ToolCall:
    """One call the model asked for.

    `arguments` is the parsed object, or None when the model's text did not parse; then
    `error` says why and `raw_arguments` keeps exactly what it wrote, so that the agent can
    answer with an observation the model can act on instead of failing.
    """

    name: str
    arguments: dict[str, Any] | None
    id: str = ""
    raw_arguments: str = ""
    error: str | None = None

    @classmethod
    def from_raw(cls, name: str, raw_arguments: str | dict | None, id: str = "") -> "ToolCall":
        if isinstance(raw_arguments, dict):
            return cls(name=name, arguments=raw_arguments, id=id, raw_arguments=json.dumps(raw_arguments))
        raw = raw_arguments or ""
        if not raw.strip():
            return cls(name=name, arguments={}, id=id, raw_arguments=raw)
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            return cls(name=name, arguments=None, id=id, raw_arguments=raw, error=f"arguments are not valid JSON: {exc}")
        if not isinstance(parsed, dict):
            return cls(name=name, arguments=None, id=id, raw_arguments=raw,
                       error=f"arguments must be a JSON object, got {type(parsed).__name__}")
        return cls(name=name, arguments=parsed, id=id, raw_arguments=raw)


@dataclass
class Message:
    """A chat message. `reasoning` holds a `<think>` block, kept for the record but never
    sent back to the model in later turns. `images` are image URLs (a base64 `data:` URL for
    local bytes) sent with the text as OpenAI `image_url` content parts, before it, where
    vision models' own chat templates place them; an in-process model, which reads text only,
    refuses them."""

    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    images: list[str] = field(default_factory=list)

    def to_openai(self) -> dict[str, Any]:
        content: Any = self.content
        if self.images:
            content = [{"type": "image_url", "image_url": {"url": url}} for url in self.images]
            content.append({"type": "text", "text": self.content})
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.raw_arguments or json.dumps(c.arguments or {})},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for empty in [k for k in ("tool_calls", "images") if not out[k]]:
            del out[empty]
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Message":
        data = dict(data)
        data["tool_calls"] = [ToolCall(**c) for c in data.get("tool_calls", [])]
        return cls(**data)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )


@dataclass
class Completion:
    """What a model returned for one call: its message plus accounting."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    latency: float = 0.0
    finish_reason: str = "stop"
    # Token ids of the prompt and of the completion where the backend knows them (the
    # embedded model does): training then sees exactly what the agent produced.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None

    @property
    def text(self) -> str:
        return self.message.content

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.message.tool_calls


class ModelError(RuntimeError):
    """A model call failed for good (after the backend's own retries)."""


@runtime_checkable
class ChatModel(Protocol):
    """Any model the agent can drive.

    `tools` are OpenAI function schemas. `response_schema` asks for a JSON document matching
    a JSON schema instead of tool calls (the configuration turns). `session` names the
    episode so that a backend may keep its KV cache between the turns of that episode. A
    backend whose replies never carry reasoning says so with `thinks = False` (`toolself serve`
    then accepts a request not to think).
    """

    name: str

    def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        response_schema: dict[str, Any] | None = None,
        session: str | None = None,
        max_tokens: int | None = None,
    ) -> Completion: ...

    async def acomplete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        response_schema: dict[str, Any] | None = None,
        session: str | None = None,
        max_tokens: int | None = None,
    ) -> Completion: ...

    def count_tokens(self, text: str) -> int: ...

    def end_session(self, session: str) -> None: ...


class SyncModelBase:
    """Shared plumbing for backends whose natural call is blocking."""

    name = "model"

    async def acomplete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        return await asyncio.to_thread(self.complete, messages, tools, response_schema, session, max_tokens)

    def count_tokens(self, text: str) -> int:
        # About four characters a token for English under BPE vocabularies; backends with a
        # tokenizer override this so that budgets are counted in the model's own tokens.
        return max(1, len(text) // 4)

    def end_session(self, session: str) -> None:
        return None
