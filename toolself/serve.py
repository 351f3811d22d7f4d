"""`toolself serve`: any ChatModel behind an OpenAI-compatible HTTP API.

This lets every OpenAI client (our own `OpenAIModel`, other agent frameworks, evaluation
harnesses) drive the embedded model or a scripted one exactly as it would drive vLLM.
Requests are awaited with `model.acomplete`, never serialised here, so that concurrent
requests reach the model together and a batching backend can batch them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal


from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from toolself.models.base import ChatModel, Completion, Message, ToolCall

log = logging.getLogger(__name__)


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


class ChatRequest(_Lenient):
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Any = None
    response_format: ResponseFormat | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # toolself extension: names the episode so the backend can keep its cache between turns.
    session: str | None = None

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def response_schema(self) -> dict[str, Any] | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "object"}
        return fmt.json_schema.schema_ if fmt.json_schema else None


# -- responses ---------------------------------------------------------------------------------

def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": None}},
                        status_code=status)


def _wire_tool_calls(message: Message) -> list[dict[str, Any]]:
    return message.to_openai().get("tool_calls", [])


def completion_body(completion: Completion, model_name: str) -> dict[str, Any]:
    message = completion.message
    content = message.content if message.content or not message.tool_calls else None
    out_message: dict[str, Any] = {"role": "assistant", "content": content}
    if message.tool_calls:
        out_message["tool_calls"] = _wire_tool_calls(message)
    if message.reasoning:
        out_message["reasoning_content"] = message.reasoning
    finish = "tool_calls" if message.tool_calls else (completion.finish_reason or "stop")
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [{"index": 0, "message": out_message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage_body(completion),
    }


def _usage_body(completion: Completion) -> dict[str, Any]:
    u = completion.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _stream_chunks(body: dict[str, Any], include_usage: bool):
    """The whole completion as server-sent events: the model is not incremental here, but
    clients that insist on streaming still get a well-formed stream."""
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    choice = body["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
    if "reasoning_content" in message:
        delta["reasoning_content"] = message["reasoning_content"]
    if "tool_calls" in message:
        delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(message["tool_calls"])]
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


# -- app ---------------------------------------------------------------------------------------

def create_app(model: ChatModel, served_name: str | None = None, max_threads: int = 64) -> Starlette:
    """An OpenAI-compatible app over `model`. Any `model` name in a request is accepted:
    one server serves one model, listed under `served_name` (default: the model's name).

    Blocking models run their `acomplete` in the event loop's default executor, which asyncio
    sizes by CPU count (6 threads on 2 cores); `max_threads` widens it so that many
    concurrent requests to such a model really overlap."""
    name = served_name or getattr(model, "name", "model")
    created = int(time.time())
    widened: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def widen_executor() -> None:
        loop = asyncio.get_running_loop()
        if loop not in widened:
            loop.set_default_executor(ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="toolself-serve"))
            widened.add(loop)

    async def chat_completions(request: Request) -> Response:
        try:
            payload = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "the request body is not valid JSON")
        if not isinstance(payload, dict):
            return error_response(400, "the request body must be a JSON object")
        try:
            req = ChatRequest.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            return error_response(400, f"{param}: {first['msg']}" if param else first["msg"], param=param)
        messages = [m.to_message() for m in req.messages]
        widen_executor()
        try:
            completion = await model.acomplete(
                messages, tools=req.tool_schemas(), response_schema=req.response_schema(),
                session=req.session, max_tokens=req.max_completion_tokens or req.max_tokens)
        except Exception as exc:  # the client gets the reason; the server stays up
            log.exception("model call failed")
            return error_response(500, f"the model failed: {type(exc).__name__}: {exc}", type_="server_error")
        body = completion_body(completion, name)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_stream_chunks(body, include_usage), media_type="text/event-stream")
        return JSONResponse(body)

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "toolself"}]})

    async def end_session(request: Request) -> Response:
        # toolself extension: frees the cache a backend kept for an episode.
        model.end_session(request.path_params["session"])
        return Response(status_code=204)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type_=kind)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/sessions/{session:path}", end_session, methods=["DELETE"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.model = model
    return app


def serve(model: ChatModel, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve `model` until interrupted."""
    import uvicorn

    uvicorn.run(create_app(model), host=host, port=port, log_level=log_level)
