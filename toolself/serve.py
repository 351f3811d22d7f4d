"""`toolself serve`: any ChatModel behind an OpenAI-compatible HTTP API.

This lets every OpenAI client (our own `OpenAIModel`, other agent frameworks, evaluation
harnesses) drive the embedded model or a scripted one exactly as it would drive vLLM.
Requests are awaited, never serialised here, so that concurrent requests reach the model
together and a batching backend can batch them.

A request field this server cannot honour is refused with a 400 rather than dropped: a client
that asks for `logprobs`, `n=4` or a penalty and silently gets something else would build on
wrong samples. A model with `astream` (the embedded one) samples with the request's
`temperature`, `top_p` and `seed` and streams token by token; any other model replies as it
always does (a scripted model has nothing to sample) and its stream comes in one piece.
A model that never thinks (`thinks = False`: the embedded engine) accepts vLLM's
`chat_template_kwargs: {"enable_thinking": false}`, which asks for what it does anyway, so that
a client written for a served Qwen3 runs against it unchanged.

The wire records live in `serve_wire`; the agent that `toolself serve` lists beside the model
(`toolself:METHOD`, one attempt per request) in `serve_agent`, which this app routes to by name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Protocol

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from toolself.models.base import ChatModel, Completion, Message, Usage
from toolself.models.protocol import new_call_id
from toolself.serve_wire import ChatRequest, error_response, usage_body, validation_error

log = logging.getLogger(__name__)


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def _held(text: str, markers: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a marker."""
    return max((n for m in markers for n in range(1, len(m)) if text.endswith(m[:n])), default=0)


class DeltaWriter:
    """Turns a reply into the deltas of an OpenAI stream, as its text is decoded: content as
    it comes (less a tail that could begin a stop sequence or a `<tool_call>` tag), each tool
    call's name as soon as the model has written it, then its arguments as they come (less
    the last `}`, which may close the call rather than the arguments). A model that is not
    incremental gives only `finish`, and its reply comes in one delta. The non-streaming
    reply is these deltas merged, so both carry the same reply."""

    def __init__(self, tools: bool, stop: list[str]):
        self.tools, self.stop = tools, stop
        self.raw = ""
        self.content = ""
        self.calls: list[dict[str, Any]] = []  # id, name, and the arguments sent so far
        self.stopped = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.raw += text
        return self._deltas(final=False)

    def finish(self, completion: Completion) -> list[dict[str, Any]]:
        message = completion.message
        if self.raw:
            deltas = self._deltas(final=True)
        else:  # not incremental: the whole reply at once
            self.raw, self.tools = message.content, False
            deltas = ([{"reasoning_content": message.reasoning}] if message.reasoning else []) + self._deltas(True)
        for call in message.tool_calls[len(self.calls):]:
            wire = Message("assistant", "", tool_calls=[call]).to_openai()["tool_calls"][0]
            self.calls.append({"id": wire["id"], "name": call.name, "arguments": wire["function"]["arguments"]})
            deltas.append({"tool_calls": [dict(wire, index=len(self.calls) - 1)]})
        return deltas

    def finish_reason(self, completion: Completion | None) -> str:
        if self.stopped or completion is None:
            return "stop"
        return "tool_calls" if self.calls else (completion.finish_reason or "stop")

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        head, _, rest = self.raw.partition(_OPEN) if self.tools else (self.raw, "", "")
        deltas = self._content_delta(head, final and not rest)
        if self.stopped or not rest:
            return deltas
        for index, part in enumerate(rest.split(_OPEN)):
            body, closed, _ = part.partition(_CLOSE)
            deltas += self._call_deltas(index, body, bool(closed) or final)
        return deltas

    def _content_delta(self, text: str, final: bool) -> list[dict[str, Any]]:
        visible = text.lstrip()
        hits = [i for i in (visible.find(s) for s in self.stop) if i >= 0]
        if hits:
            visible, self.stopped = visible[:min(hits)], True
        else:
            if not final:
                visible = visible[:len(visible) - _held(visible, self.stop + ([_OPEN] if self.tools else []))]
            visible = visible.rstrip()  # a reply's content is stripped; until the end, spaces may lead nowhere
        if not visible.startswith(self.content) or visible == self.content:
            return []
        new, self.content = visible[len(self.content):], visible
        return [{"content": new}]

    def _call_deltas(self, index: int, body: str, closed: bool) -> list[dict[str, Any]]:
        head = _CALL_HEAD.match(body)
        if head is None:
            return []
        deltas = []
        if index == len(self.calls):
            name = json.loads(f'"{head.group(1)}"')
            self.calls.append({"id": new_call_id(), "name": name, "arguments": ""})
            deltas.append({"tool_calls": [{"index": index, "id": self.calls[index]["id"], "type": "function",
                                           "function": {"name": name, "arguments": ""}}]})
        args = body[head.end():].rstrip()
        if closed:
            args = args[:-1].rstrip() if args.endswith("}") else args
        elif "}" in args:
            args = args[:args.rfind("}")]
        sent = self.calls[index]["arguments"]
        if args.startswith(sent) and args != sent:
            self.calls[index]["arguments"] = args
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": args[len(sent):]}}]})
        return deltas


def merge_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a client rebuilds from the deltas of a stream."""
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            call = calls.setdefault(c["index"], {"id": c.get("id"), "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            call["function"]["name"] += c.get("function", {}).get("name", "")
            call["function"]["arguments"] += c.get("function", {}).get("arguments", "")
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


# -- a reply, incremental where the model is -------------------------------------------------

async def _reply(model: Any, req: ChatRequest, messages: list[Message]) -> AsyncIterator[str | Completion]:
    """The reply's text as it is decoded (a model with `astream`), then its Completion."""
    tools, schema = req.tool_schemas(), req.response_schema()
    max_tokens = req.max_completion_tokens or req.max_tokens
    if hasattr(model, "astream"):
        stream = model.astream(messages, tools=tools, response_schema=schema, session=req.session,
                               max_tokens=max_tokens, sampling=req.sampling(model))
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()
        return
    yield await model.acomplete(messages, tools=tools, response_schema=schema, session=req.session,
                                max_tokens=max_tokens)


def _usage_of_stopped(model: Any, messages: list[Message], tools: Any, content: str) -> Usage:
    """Usage of a reply cut at a stop sequence, whose decoding was cancelled before the
    model reported any."""
    prompt = len(model.prompt_ids(messages, tools)) if hasattr(model, "prompt_ids") else 0
    return Usage(prompt_tokens=prompt, completion_tokens=model.count_tokens(content))


class _Exchange:
    """One request's reply, read from the model until it ends or a stop sequence cuts it."""

    def __init__(self, model: Any, req: ChatRequest, messages: list[Message], name: str):
        self.model, self.req, self.messages = model, req, messages
        self.writer = DeltaWriter(tools=req.tool_schemas() is not None and req.response_schema() is None,
                                  stop=req.stop_sequences())
        self.items = _reply(model, req, messages)
        self.completion: Completion | None = None
        self.id, self.created, self.name = "chatcmpl-" + uuid.uuid4().hex, int(time.time()), name

    async def deltas(self, first: str | Completion) -> AsyncIterator[dict[str, Any]]:
        item: str | Completion | None = first
        try:
            while item is not None:
                if isinstance(item, Completion):
                    self.completion = item
                    for d in self.writer.finish(item):
                        yield d
                    return
                for d in self.writer.feed(item):
                    yield d
                if self.writer.stopped:
                    return
                item = await anext(self.items, None)
        finally:
            await self.items.aclose()

    def usage(self) -> Usage:
        if self.completion is not None:
            return self.completion.usage
        return _usage_of_stopped(self.model, self.messages, self.req.tool_schemas(), self.writer.content)

    def body(self, deltas: list[dict[str, Any]]) -> dict[str, Any]:
        choice = {"index": 0, "message": merge_deltas(deltas),
                  "finish_reason": self.writer.finish_reason(self.completion), "logprobs": None}
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.name,
                "choices": [choice], "usage": usage_body(self.usage())}

    async def events(self, first: str | Completion) -> AsyncIterator[str]:
        base = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.name}

        def event(delta: dict[str, Any], finish: str | None = None) -> str:
            return f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish}]})}\n\n"

        yield event({"role": "assistant", "content": ""})
        try:
            async for delta in self.deltas(first):
                yield event(delta)
        except Exception as exc:  # headers are gone: the error travels in the stream
            log.exception("model call failed mid-stream")
            error = {"message": f"the model failed: {type(exc).__name__}: {exc}", "type": "server_error"}
            yield f"data: {json.dumps({'error': error})}\n\n"
            return
        yield event({}, self.writer.finish_reason(self.completion))
        if self.req.stream_options and self.req.stream_options.include_usage:
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage_body(self.usage())})}\n\n"
        yield "data: [DONE]\n\n"


# -- app ---------------------------------------------------------------------------------------

class AgentEndpoint(Protocol):
    """A second model the server lists and routes to by name (`toolself.serve_agent`)."""

    name: str

    def model_entry(self, created: int) -> dict[str, Any]: ...

    async def respond(self, request: Request, req: ChatRequest) -> Response: ...

    def cancel_all(self) -> None: ...


def create_app(model: ChatModel, served_name: str | None = None, max_threads: int = 64,
               agent: AgentEndpoint | None = None) -> Starlette:
    """An OpenAI-compatible app over `model`. Any `model` name in a request is accepted:
    one server serves one model, listed under `served_name` (default: the model's name),
    except the name of `agent`, whose requests it answers.

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
            return validation_error(exc)
        to_agent = agent is not None and req.model == agent.name
        if req.chat_template_kwargs is not None and (to_agent or getattr(model, "thinks", True)):
            return error_response(400, f"chat_template_kwargs: {req.model if to_agent else name} may think, and "
                                       "this server passes no template arguments on", param="chat_template_kwargs")
        if to_agent:
            return await agent.respond(request, req)
        widen_executor()
        exchange = _Exchange(model, req, [m.to_message() for m in req.messages], name)
        try:  # the first token, or the whole reply: a model that fails before it gets a 500
            first = await anext(exchange.items)
        except Exception as exc:  # the client gets the reason; the server stays up
            log.exception("model call failed")
            await exchange.items.aclose()
            return error_response(500, f"the model failed: {type(exc).__name__}: {exc}", type_="server_error")
        if req.stream:
            return StreamingResponse(exchange.events(first), media_type="text/event-stream")
        try:
            deltas = [d async for d in exchange.deltas(first)]
        except Exception as exc:
            log.exception("model call failed")
            return error_response(500, f"the model failed: {type(exc).__name__}: {exc}", type_="server_error")
        return JSONResponse(exchange.body(deltas))

    async def list_models(request: Request) -> Response:
        served = [{"id": name, "object": "model", "created": created, "owned_by": "toolself"}]
        return JSONResponse({"object": "list", "data": served + ([agent.model_entry(created)] if agent else [])})

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


def server(model: ChatModel, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
           agent: AgentEndpoint | None = None) -> Any:
    """A uvicorn server for `model` (and `agent`). Its shutdown first cancels the agent's
    attempts: uvicorn waits for requests in flight, and an attempt may run for many minutes."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            if agent is not None:
                agent.cancel_all()
            await super().shutdown(sockets)

    return Server(uvicorn.Config(create_app(model, agent=agent), host=host, port=port, log_level=log_level))


def serve(model: ChatModel, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          agent: AgentEndpoint | None = None) -> None:
    """Serve `model` (and `agent`) until interrupted."""
    server(model, host, port, log_level, agent).run()
