"""The OpenAI chat-completions wire format as `toolself serve` reads and writes it: the
request records (parsed once at the edge, a field the server cannot honour refused with a
400 rather than dropped) and the error and usage bodies. Shared by the model endpoint
(`toolself.serve`) and the agent endpoint (`toolself.serve_agent`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.responses import JSONResponse

from toolself.models.base import Message, ToolCall, Usage


# -- request records ---------------------------------------------------------------------------

class _Lenient(BaseModel):
    # Clients send fields we do not use (top_p, seed, user, ...); OpenAI servers ignore them too.
    model_config = ConfigDict(extra="ignore")


class FunctionCallIn(_Lenient):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCallIn(_Lenient):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessageIn(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "ChatMessageIn":
        if isinstance(self.content, list):
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise ValueError(f"only text content parts are supported, got a {part.type!r} part")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages may carry tool_calls")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""

    def to_message(self) -> Message:
        calls = [ToolCall.from_raw(c.function.name, c.function.arguments, id=c.id) for c in self.tool_calls or []]
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=self.text(), tool_calls=calls, tool_call_id=self.tool_call_id,
                       name=self.name if self.role == "tool" else None)


class FunctionSpec(_Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionSpec


class JsonSchemaSpec(_Lenient):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


class StreamOptions(_Lenient):
    include_usage: bool = False


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionSpec


NO_THINKING = {"enable_thinking": False}


class ChatRequest(BaseModel):
    """The chat-completions fields this server honours; any other field is refused."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # Accepted because they never change a reply.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    # vLLM's and SGLang's extension: accepted only as NO_THINKING, for a model that never thinks
    # (`serve.create_app`).
    chat_template_kwargs: dict[str, Any] | None = None
    # toolself extension: names the episode so the backend can keep its cache between turns.
    session: str | None = None

    @model_validator(mode="after")
    def _refuse_what_is_not_served(self) -> "ChatRequest":
        if self.n != 1:
            raise ValueError("n: this server returns one choice per request; send n=1 (or several requests)")
        if self.logprobs or self.top_logprobs:
            raise ValueError("logprobs: this server does not return log-probabilities")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name}: this server does not apply penalties; send 0 or leave it out")
        if self.logit_bias:
            raise ValueError("logit_bias: this server does not bias logits")
        if self.chat_template_kwargs not in (None, NO_THINKING):
            raise ValueError("chat_template_kwargs: this server applies no template arguments; it accepts only "
                             "{\"enable_thinking\": false}, for a model that never thinks")
        if len(self.stop_sequences()) > 4:
            raise ValueError("stop: at most 4 sequences")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice: {self.tool_choice.function.name!r} is not among the tools {names}")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice: 'required' needs tools")
        return self

    def stop_sequences(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stop if s]

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools offered to the model: none for `tool_choice="none"`, only the named one for
        a named choice (the embedded model's grammar then has to call it)."""
        if not self.tools or self.tool_choice == "none":
            return None
        tools = self.tools
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
        return [t.model_dump(exclude_none=True) for t in tools]

    def sampling(self, model: Any) -> Any:
        """The sampling of this request for a model that takes one per call (the model's own
        settings fill the fields the request leaves out), or None to keep the model's."""
        if self.temperature is None and self.top_p is None and self.seed is None:
            return None
        from toolself.models.local import Sampling

        return Sampling(temperature=getattr(model, "temperature", 0.0) if self.temperature is None else self.temperature,
                        top_p=getattr(model, "top_p", 1.0) if self.top_p is None else self.top_p,
                        seed=getattr(model, "seed", 0) if self.seed is None else self.seed)

    def response_schema(self) -> dict[str, Any] | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "object"}
        return fmt.json_schema.schema_ if fmt.json_schema else None


# -- responses ---------------------------------------------------------------------------------

def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, which its clients raise as `openai.APIError` with this message."""
    return {"error": {"message": message, "type": type_, "param": param, "code": None}}


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param), status_code=status)


def usage_body(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def validation_error(exc: ValidationError) -> JSONResponse:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        message = f"{param}: this server does not support this field, and ignoring it could change the reply"
    else:
        message = first["msg"].removeprefix("Value error, ")
        message = f"{param}: {message}" if param and not message.startswith(f"{param}:") else message
    return error_response(400, message, param=param)
