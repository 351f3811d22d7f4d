"""A ChatModel over any OpenAI-compatible HTTP server (vLLM, SGLang, Ollama, llama.cpp, OpenAI,
`toolself serve`).

Servers differ in what they accept: some have no native tool calls, some no `response_format`
json_schema. The model learns this from the server's first 400 and adapts for the rest of its
life instead of asking the user to know. Retries are done here, not by the SDK (whose own retries
are switched off), so that every backend fails and recovers the same, tested way.

Responses are read as plain JSON rather than through the SDK's typed objects: servers send
shapes the SDK does not model (`reasoning_content`, malformed tool calls), and a malformed tool
call must reach the agent as a `ToolCall` with an error, never as an exception.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import openai

from toolself.models.base import Completion, Message, ModelError, ToolCall, Usage
from toolself.models.protocol import (DEFAULT, TextProtocol, new_call_id, parse_tool_calls_text, split_reasoning,
                                      text_protocol_named, to_text_messages)
from toolself.models.tokenizers import own_tokenizer

log = logging.getLogger(__name__)

ToolProtocol = Literal["native", "text", "auto"]

SPEC_PREFIX = "openai:"
DEFAULT_API_KEY = "EMPTY"
MAX_RETRY_AFTER = 60.0
_RETRYABLE_STATUS = {408, 409, 429}
_SCHEMA_NAME = "configuration"
# What the client itself writes into a request, from its own settings and the call's.
CLIENT_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "response_format", "max_tokens",
                           "max_completion_tokens", "temperature", "seed", "stream", "stream_options", "session"})
# Sampling fields a model may refuse outright (OpenAI's reasoning models take only their default
# temperature and top_p): left out for the rest of the run, with a warning, rather than failing it.
SAMPLING_FIELDS = ("temperature", "top_p", "seed")


@dataclass(frozen=True)
class ModelSpec:
    """A parsed `openai:NAME@URL` spec."""

    model: str
    base_url: str
    api_key: str

    def build(self, **options: Any) -> "OpenAIModel":
        return OpenAIModel(self.model, self.base_url, self.api_key, **options)


def request_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields a user adds to every request (a server's extensions: vLLM's and SGLang's
    `chat_template_kwargs`, `top_k`), checked: a field the client writes itself is set by its
    own option, and a second value in the body would silently replace it."""
    if not isinstance(fields, dict):
        raise ValueError(f"request options are a JSON object of fields, not {type(fields).__name__}")
    taken = sorted(CLIENT_FIELDS & set(fields))
    if taken:
        raise ValueError(f"request options cannot set {', '.join(taken)}: toolself writes "
                         f"{'it' if len(taken) == 1 else 'them'} from its own options (--temperature, --seed, "
                         "--max-tokens, the tools and the prompt)")
    return dict(fields)


def env_api_key() -> str:
    return os.environ.get("TOOLSELF_API_KEY") or os.environ.get("OPENAI_API_KEY") or DEFAULT_API_KEY


def parse_model_spec(spec: str, **options: Any) -> "OpenAIModel":
    """The model an `openai:NAME@URL` spec names; `options` go to `OpenAIModel`."""
    return parse_spec(spec).build(**options)


def parse_spec(spec: str) -> ModelSpec:
    """Parse `openai:NAME@URL` (or `openai:NAME` with `OPENAI_BASE_URL` set).

    The last `@` followed by an http(s) URL separates the name from the URL, so model names
    that contain `@` still parse.
    """
    if not isinstance(spec, str) or not spec.startswith(SPEC_PREFIX):
        raise ValueError(f"not an OpenAI-compatible model spec: {spec!r}; expected openai:NAME@URL, "
                         "e.g. openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
    rest = spec[len(SPEC_PREFIX):].strip()
    match = re.match(r"^(?P<name>.*)@(?P<url>https?://\S+)$", rest)
    if match:
        name, url = match.group("name").strip(), match.group("url")
    elif "@" in rest:
        name, _, url = rest.rpartition("@")
        raise ValueError(f"bad URL {url!r} in model spec {spec!r}: it must start with http:// or https://")
    else:
        name = rest
        url = os.environ.get("OPENAI_BASE_URL", "").strip()
        if not url:
            raise ValueError(f"model spec {spec!r} names no server: write openai:NAME@URL "
                             "(e.g. @http://127.0.0.1:8000/v1) or set OPENAI_BASE_URL")
        if not re.match(r"^https?://\S+$", url):
            raise ValueError(f"OPENAI_BASE_URL={url!r} must be an http:// or https:// URL")
    if not name:
        raise ValueError(f"model spec {spec!r} has no model name: expected openai:NAME@URL")
    return ModelSpec(model=name, base_url=url.rstrip("/"), api_key=env_api_key())


def parse_retry_after(headers: Any) -> float | None:
    """Seconds a server asked us to wait (`retry-after-ms`, `retry-after` in seconds or as an
    HTTP date), or None."""
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / divisor)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return None


def _error_text(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    return (str(exc) + " " + (json.dumps(body) if body is not None else "")).lower()


def _error_object(exc: BaseException) -> dict[str, Any]:
    """The error object of a server's error body (`{"message", "param", "code", ...}`), whether
    the SDK unwrapped it from `{"error": ...}` or not; empty when the body has none."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    return body if isinstance(body, dict) else {}


def _unsupported_field(exc: BaseException) -> str | None:
    """The sampling field a 400 says the model does not take (OpenAI: `param` with code
    `unsupported_value` or `unsupported_parameter`), or None."""
    error = _error_object(exc)
    if error.get("code") not in ("unsupported_value", "unsupported_parameter"):
        return None
    return error.get("param") if error.get("param") in SAMPLING_FIELDS else None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "the request timed out"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {_error_object(exc).get('message') or exc.message}"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"connection error ({type(cause).__name__}: {cause})" if cause else "connection error"
    return f"{type(exc).__name__}: {exc}"


class _Rebuild:
    """The server told us what it does not support; send the same call again, adapted."""


_REBUILD = _Rebuild()


class OpenAIModel:
    """A ChatModel over an OpenAI-compatible server.

    `tool_protocol`: `native` sends `tools`; `text` renders them into the prompt with the
    Qwen/Hermes protocol; `auto` tries native and switches to text for good if the server
    rejects tools. `max_retries` counts retries after the first attempt; `backoff_base` and
    `backoff_max` (seconds) shape the exponential backoff. `send_session` sends the episode
    name as a `session` field (understood by `toolself serve`; vLLM ignores unknown fields,
    OpenAI rejects them). A completion's latency is the whole call as the caller waited for
    it, retries included. `text_protocol` shapes the text protocol (`paper`: see
    `protocol.PAPER`); `tokenizer` names the served weights' tokenizer, which counts tokens for
    the context budgets when this machine has it (see `tokenizers`).
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        *,
        tool_protocol: ToolProtocol = "auto",
        timeout: float = 120,
        max_retries: int = 4,
        temperature: float | None = None,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        send_session: bool = False,
        text_protocol: TextProtocol | str = DEFAULT,
        tokenizer: str | None = None,
    ):
        if tool_protocol not in ("native", "text", "auto"):
            raise ValueError(f"tool_protocol must be native, text or auto, not {tool_protocol!r}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or env_api_key()
        self.name = f"openai:{model}"
        self.tool_protocol: ToolProtocol = tool_protocol
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.seed = seed
        self.extra_body = dict(extra_body or {})
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.send_session = send_session
        self.text_protocol = text_protocol_named(text_protocol)
        self.tokenizer = tokenizer
        # What the server turned out to support; `auto` starts optimistic.
        self.native_tools = tool_protocol != "text"
        self.schema_format = True
        self.max_tokens_field = "max_tokens"
        self.refused_fields: set[str] = set()  # SAMPLING_FIELDS the model does not take
        self._client: openai.OpenAI | None = None
        # An async HTTP client belongs to the event loop it was first used on.
        self._client_lock = threading.Lock()
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, {self.base_url!r}, tool_protocol={self.tool_protocol!r})"

    # -- ChatModel -------------------------------------------------------------------------

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        start = time.perf_counter()
        attempt = 0
        while True:
            body, native = self._body(messages, tools, response_schema, session, max_tokens)
            try:
                data = self._sync_client().post(_PATH, body=_wire(body), cast_to=httpx.Response).json()
            except (openai.OpenAIError, ValueError) as exc:
                action = self._after_error(exc, attempt, body, native, tools, messages)
                if action is not _REBUILD:
                    time.sleep(action)
                    attempt += 1
                continue
            return self._completion(data, native, tools, body["messages"], start)

    async def acomplete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        start = time.perf_counter()
        attempt = 0
        while True:
            body, native = self._body(messages, tools, response_schema, session, max_tokens)
            try:
                response = await self._async_client().post(_PATH, body=_wire(body), cast_to=httpx.Response)
                data = response.json()
            except (openai.OpenAIError, ValueError) as exc:
                action = self._after_error(exc, attempt, body, native, tools, messages)
                if action is not _REBUILD:
                    await asyncio.sleep(action)
                    attempt += 1
                continue
            return self._completion(data, native, tools, body["messages"], start)

    def count_tokens(self, text: str) -> int:
        encode = own_tokenizer(self.tokenizer) if self.tokenizer else None
        if encode is not None:
            return max(1, len(encode(text)))
        # The server's tokenizer is not reachable through the API; four characters a token is
        # close enough for budgets under BPE vocabularies.
        return max(1, len(text) // 4)

    def end_session(self, session: str) -> None:
        """Tell a `toolself serve` server that the episode is over, so that its model can free the
        episode's cache. Only with `send_session`; other servers keep their own prefix caches,
        and a server that does not know the endpoint is not an error."""
        if not (self.send_session and session):
            return
        url = f"{self.base_url}/sessions/{urllib.parse.quote(session, safe='')}"
        try:
            httpx.delete(url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=min(5.0, self.timeout))
        except httpx.HTTPError:
            pass

    def close(self) -> None:
        """Release the HTTP connections of the blocking client."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Release the HTTP connections the async path opened on the running event loop."""
        client = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    # -- clients ---------------------------------------------------------------------------

    def _client_options(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "base_url": self.base_url, "timeout": self.timeout, "max_retries": 0}

    def _sync_client(self) -> openai.OpenAI:
        # Threads racing on the first call would each build a client (and load the CA store).
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = openai.OpenAI(**self._client_options())
        return self._client

    def _async_client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            client = self._async_clients[loop] = openai.AsyncOpenAI(**self._client_options())
        return client

    # -- request ---------------------------------------------------------------------------

    def _body(self, messages: list[Message], tools, response_schema, session, max_tokens) -> tuple[dict[str, Any], bool]:
        native = self.native_tools
        tools = [_as_function_tool(t) for t in tools] if tools else None
        if native:
            wire = [m.to_openai() for m in messages]
        else:
            wire = to_text_messages(messages, tools, self.text_protocol)
        body: dict[str, Any] = {"model": self.model, "messages": wire}
        if tools and native:
            body["tools"] = tools
        if response_schema is not None:
            if self.schema_format:
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": _SCHEMA_NAME, "schema": response_schema, "strict": False}}
            else:
                body["messages"] = _with_schema_instruction(wire, response_schema)
        if max_tokens is not None:
            body[self.max_tokens_field] = max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.seed is not None:
            body["seed"] = self.seed
        extra = dict(self.extra_body)
        for field in self.refused_fields:
            body.pop(field, None)
            extra.pop(field, None)
        if self.send_session and session:
            extra["session"] = session
        if extra:
            body["extra_body"] = extra
        return body, native

    def _after_error(self, exc: BaseException, attempt: int, sent: dict[str, Any], native: bool, tools,
                     messages) -> float | _Rebuild:
        """Decide what a failed attempt means: adapt and resend, wait and retry, or give up. An
        adaptation is decided by what this request `sent`, not by what the model has learnt since:
        concurrent requests meet the same refusal, and each must be sent again, adapted."""
        where = f"{self.name} at {self.base_url}"
        if isinstance(exc, openai.APIStatusError) and exc.status_code in (400, 422):
            text = _error_text(exc)
            uses_tools = bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
            if native and self.tool_protocol == "auto" and uses_tools and "tool" in text:
                self.native_tools = False
                return _REBUILD
            if "response_format" in sent and any(
                    word in text for word in ("response_format", "json_schema", "structured output", "guided")):
                self.schema_format = False
                return _REBUILD
            if "max_tokens" in sent and "max_tokens" in text and "max_completion_tokens" in text:
                # OpenAI's reasoning models accept only the newer name.
                self.max_tokens_field = "max_completion_tokens"
                return _REBUILD
            refused = _unsupported_field(exc)
            if refused is not None and (refused in sent or refused in sent.get("extra_body", {})):
                if refused not in self.refused_fields:
                    self.refused_fields.add(refused)
                    log.warning("%s does not take %s (%s): sent without it from now on, so it samples at its "
                                "own default", where, refused, _describe(exc))
                return _REBUILD
            raise ModelError(f"{where} rejected the request: {_describe(exc)}") from exc
        retryable = isinstance(exc, openai.APIConnectionError) or (
            isinstance(exc, openai.APIStatusError)
            and (exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500))
        if isinstance(exc, ValueError):
            raise ModelError(f"{where} answered with a body that is not JSON: {exc}") from exc
        if not retryable:
            raise ModelError(f"{where} failed: {_describe(exc)}") from exc
        if attempt >= self.max_retries:
            raise ModelError(f"{where} failed after {attempt + 1} attempts: {_describe(exc)}") from exc
        delay = min(self.backoff_max, self.backoff_base * 2 ** attempt) * random.uniform(0.5, 1.0)
        if isinstance(exc, openai.APIStatusError):
            asked = parse_retry_after(exc.response.headers)
            if asked is not None:
                delay = max(delay, min(asked, MAX_RETRY_AFTER))
        return delay

    # -- response --------------------------------------------------------------------------

    def _completion(self, data: Any, native: bool, tools, sent: list[dict[str, Any]], start: float) -> Completion:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ModelError(f"{self.name} at {self.base_url} returned no choices: {str(data)[:300]}")
        choice = choices[0]
        raw = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        content = _text_content(raw.get("content"))
        field_reasoning = raw.get("reasoning_content") or raw.get("reasoning")
        raw_calls = raw.get("tool_calls") or []
        if isinstance(raw.get("function_call"), dict) and not raw_calls:
            raw_calls = [{"type": "function", "function": raw["function_call"]}]
        if raw_calls:
            content, think = split_reasoning(content)
            calls = raw_calls if isinstance(raw_calls, list) else [raw_calls]
            message = Message(role="assistant", content=content, tool_calls=[_tool_call(c) for c in calls],
                              reasoning=think)
        elif tools and (not native or "<tool_call>" in content):
            # Servers without a tool parser hand the protocol back as text even when asked natively.
            message = parse_tool_calls_text(content, self.text_protocol)
        else:
            content, think = split_reasoning(content)
            message = Message(role="assistant", content=content, reasoning=think)
        if isinstance(field_reasoning, str) and field_reasoning.strip():
            parts = [field_reasoning.strip()] + ([message.reasoning] if message.reasoning else [])
            message.reasoning = "\n".join(parts)
        usage = self._usage(data.get("usage"), sent, message)
        finish = choice.get("finish_reason") or "stop"
        if message.tool_calls and finish == "stop":
            finish = "tool_calls"
        return Completion(message=message, usage=usage, latency=time.perf_counter() - start,
                          finish_reason=str(finish))

    def _usage(self, raw: Any, sent: list[dict[str, Any]], message: Message) -> Usage:
        if isinstance(raw, dict) and isinstance(raw.get("prompt_tokens"), int):
            details = raw.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            if cached is None:
                cached = raw.get("prompt_cache_hit_tokens")
            return Usage(prompt_tokens=raw["prompt_tokens"], completion_tokens=int(raw.get("completion_tokens") or 0),
                         cached_tokens=int(cached or 0))
        # Some servers report no usage; budgets still need a number, so estimate it.
        prompt = sum(self.count_tokens(_text_content(m.get("content"))) for m in sent)
        produced = message.content + (message.reasoning or "") + "".join(c.raw_arguments for c in message.tool_calls)
        return Usage(prompt_tokens=prompt, completion_tokens=self.count_tokens(produced))


_PATH = "/chat/completions"


def _wire(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON the server receives. The request goes through the SDK client's plain `post`
    (its connection pool, headers, timeouts and typed errors) rather than
    `chat.completions.create`, whose per-call validation and transformation of the parameters
    was half of the client's CPU time per request: at 32 concurrent attempts on two cores that
    CPU, not the server, bounded the runner."""
    extra = body.get("extra_body")
    if not extra:
        return body
    wire = {k: v for k, v in body.items() if k != "extra_body"}
    wire.update(extra)
    return wire


def _as_function_tool(schema: dict[str, Any]) -> dict[str, Any]:
    if schema.get("type") == "function" and "function" in schema:
        return schema
    return {"type": "function", "function": schema}


def _text_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(content)


def _with_schema_instruction(wire: list[dict[str, Any]], schema: dict[str, Any]) -> list[dict[str, Any]]:
    instruction = ("Answer with one JSON document and nothing else. It must match this JSON schema:\n"
                   + json.dumps(schema, ensure_ascii=False))
    wire = [dict(m) for m in wire]
    if wire and wire[-1].get("role") == "user" and isinstance(wire[-1].get("content"), str):
        wire[-1]["content"] = wire[-1]["content"] + "\n\n" + instruction
    else:
        wire.append({"role": "user", "content": instruction})
    return wire


def _tool_call(raw: Any) -> ToolCall:
    """A native tool call from the wire; any shape the server sends becomes a ToolCall."""
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        return ToolCall(name="", arguments=None, id=new_call_id(), raw_arguments=json.dumps(raw, default=str),
                        error='a tool call must look like {"type": "function", "function": {"name": ..., "arguments": ...}}')
    call_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else new_call_id()
    fn = raw["function"]
    name = fn.get("name")
    arguments = fn.get("arguments")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", arguments=None, id=call_id, raw_arguments=json.dumps(arguments, default=str),
                        error="the tool call names no function")
    if arguments is None or isinstance(arguments, (str, dict)):
        return ToolCall.from_raw(name, arguments, id=call_id)
    return ToolCall(name=name, arguments=None, id=call_id, raw_arguments=json.dumps(arguments, default=str),
                    error=f"arguments must be a JSON object, got {type(arguments).__name__}")
