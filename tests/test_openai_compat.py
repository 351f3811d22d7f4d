"""OpenAIModel against real HTTP servers on loopback: `toolself serve` over a ScriptedModel, and
small fault-injecting servers that behave like a misbehaving vLLM / proxy would."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any, Awaitable, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from http_fixtures import InFlight, running_server, serving
from toolself.agent import Agent, AgentSettings
from toolself.models.base import Message, ModelError, ToolCall
from toolself.models.openai_compat import OpenAIModel, parse_model_spec, parse_retry_after, parse_spec
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool

SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the collection.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
SCHEMA = {"type": "object", "properties": {"subgoal": {"type": "string"}, "toolbox": {
    "type": "array", "items": {"type": "string"}}}, "required": ["subgoal", "toolbox"]}


def fast_client(url: str, **options: Any) -> OpenAIModel:
    options = {"timeout": 5, "max_retries": 3, "backoff_base": 0.005, "backoff_max": 0.02, **options}
    return OpenAIModel("test-model", url, "key", **options)


def user(text: str) -> list[Message]:
    return [Message("system", "You are terse."), Message("user", text)]


# -- against `toolself serve` over a ScriptedModel ------------------------------------------

def test_native_tool_call_round_trip_keeps_arguments_and_counts_usage():
    arguments = {"query": "Kärcher \"quoted\" text", "filters": {"year": [1999, 2000]}, "k": 3}
    scripted = ScriptedModel([call("search", **arguments)])
    with serving(scripted) as url:
        completion = fast_client(url, tool_protocol="native").complete(user("find it"), tools=[SEARCH])
    (sent,) = scripted.calls
    assert sent["tools"] == [SEARCH]
    assert [(m.role, m.content) for m in sent["messages"]] == [("system", "You are terse."), ("user", "find it")]
    (tool_call,) = completion.tool_calls
    assert (tool_call.name, tool_call.arguments, tool_call.error) == ("search", arguments, None)
    assert tool_call.id.startswith("call_")
    assert completion.finish_reason == "tool_calls"
    expected_prompt = sum(scripted.count_tokens(m.content) for m in sent["messages"])
    assert completion.usage.prompt_tokens == expected_prompt
    assert completion.usage.completion_tokens == scripted.count_tokens(json.dumps(arguments))
    assert completion.latency > 0


def test_tool_results_in_history_reach_the_model_as_typed_messages():
    scripted = ScriptedModel(["it is 42"])
    earlier = ToolCall(name="search", arguments={"query": "answer"}, id="call_1", raw_arguments='{"query": "answer"}')
    history = user("what is the answer?") + [
        Message("assistant", "", tool_calls=[earlier], reasoning="I should search"),
        Message("tool", "the answer is 42", tool_call_id="call_1", name="search"),
    ]
    with serving(scripted) as url:
        completion = fast_client(url, tool_protocol="native").complete(history, tools=[SEARCH])
    received = scripted.calls[0]["messages"]
    assert [m.role for m in received] == ["system", "user", "assistant", "tool"]
    assert received[2].tool_calls[0].arguments == {"query": "answer"}
    assert received[2].tool_calls[0].id == "call_1"
    assert received[2].reasoning is None
    assert (received[3].tool_call_id, received[3].content) == ("call_1", "the answer is 42")
    assert completion.text == "it is 42"


def test_response_schema_round_trip_returns_the_json_document():
    document = {"subgoal": "find the year", "toolbox": ["search", "visit"]}
    scripted = ScriptedModel([json.dumps(document)])
    with serving(scripted) as url:
        completion = fast_client(url).complete(user("configure"), response_schema=SCHEMA)
    assert scripted.calls[0]["response_schema"] == SCHEMA
    assert json.loads(completion.text) == document


def test_text_protocol_renders_tools_into_the_prompt_and_parses_calls():
    scripted = ScriptedModel(['Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'])
    with serving(scripted) as url:
        completion = fast_client(url, tool_protocol="text").complete(user("find x"), tools=[SEARCH])
    sent = scripted.calls[0]
    assert sent["tools"] is None
    assert "<tools>" in sent["messages"][0].content and '"name": "search"' in sent["messages"][0].content
    assert completion.text == "Let me look."
    (tool_call,) = completion.tool_calls
    assert (tool_call.name, tool_call.arguments) == ("search", {"query": "x"})


def test_text_protocol_sends_tool_results_as_tool_response_turns():
    scripted = ScriptedModel(["done"])
    earlier = ToolCall(name="search", arguments={"query": "q"}, id="call_1", raw_arguments='{"query": "q"}')
    history = user("go") + [Message("assistant", "", tool_calls=[earlier]),
                            Message("tool", "result text", tool_call_id="call_1")]
    with serving(scripted) as url:
        fast_client(url, tool_protocol="text").complete(history, tools=[SEARCH])
    received = scripted.calls[0]["messages"]
    assert [m.role for m in received] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in received[2].content and not received[2].tool_calls
    assert received[3].content == "<tool_response>\nresult text\n</tool_response>"


def test_text_protocol_sends_a_user_turns_images_as_content_parts():
    from test_web_judge import completion
    from web_fakes import FakeService, Reply

    image = "data:image/png;base64,iVBORw0KGgo="
    service = FakeService([], default=Reply(200, completion("a bar chart")))
    with service.running() as url:
        reply = fast_client(f"{url}/v1", tool_protocol="text").complete(
            [Message("user", "What does the chart show?", images=[image])], tools=[SEARCH])
    (sent,) = service.requests[0]["body"]["messages"][1:]
    assert sent == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                {"type": "text", "text": "What does the chart show?"}]}
    assert reply.text == "a bar chart"


def test_a_tool_result_after_a_user_turn_with_images_opens_a_turn_of_its_own():
    from toolself.models.protocol import to_text_messages

    image = Message("user", "What does the chart show?", images=["data:image/png;base64,iVBORw0KGgo="])
    turns = to_text_messages([image, Message("tool", "result text", tool_call_id="call_1")], None)
    assert turns[0]["content"][0]["type"] == "image_url"
    assert turns[1] == {"role": "user", "content": "<tool_response>\nresult text\n</tool_response>"}


def test_think_block_in_content_goes_to_reasoning():
    scripted = ScriptedModel(["<think>\nThe user wants a greeting.\n</think>\n\nHello!"])
    with serving(scripted) as url:
        completion = fast_client(url).complete(user("greet me"))
    assert completion.text == "Hello!"
    assert completion.message.reasoning == "The user wants a greeting."


def test_reasoning_content_field_goes_to_reasoning_and_is_not_sent_back():
    # With tools the scripted model splits the think block itself, so the server answers
    # with a separate `reasoning_content` field, as vLLM's reasoning parser does.
    scripted = ScriptedModel(['<think>search first</think><tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>',
                              "final"])
    with serving(scripted) as url:
        model = fast_client(url, tool_protocol="native")
        first = model.complete(user("q"), tools=[SEARCH])
        assert first.message.reasoning == "search first"
        assert "think" not in first.text
        history = user("q") + [first.message, Message("tool", "r", tool_call_id=first.tool_calls[0].id)]
        model.complete(history, tools=[SEARCH])
    replayed = scripted.calls[1]["messages"][2]
    assert replayed.reasoning is None and "search first" not in replayed.content


def test_acomplete_requests_run_concurrently():
    slow = InFlight(0.3)

    scripted = ScriptedModel([], default=slow)

    async def four(model: OpenAIModel):
        try:
            return await asyncio.gather(*(model.acomplete(user(str(i))) for i in range(4)))
        finally:
            await model.aclose()

    with serving(scripted) as url:
        results = asyncio.run(four(fast_client(url)))
    assert [r.text for r in results] == ["ok"] * 4
    assert slow.peak == 4, f"only {slow.peak} of four calls overlapped"


async def complete_once(model: OpenAIModel, messages: list[Message]):
    try:
        return await model.acomplete(messages)
    finally:
        await model.aclose()


def test_acomplete_works_across_event_loops():
    scripted = ScriptedModel([], default="ok")
    with serving(scripted) as url:
        model = fast_client(url)
        assert asyncio.run(complete_once(model, user("a"))).text == "ok"
        assert asyncio.run(complete_once(model, user("b"))).text == "ok"


# -- fault-injecting servers ----------------------------------------------------------------

Step = Callable[[dict[str, Any]], Awaitable[Response]]


def fault_app(*steps: Step) -> Starlette:
    """A chat-completions endpoint that answers the n-th request with steps[n] (the last one
    repeats) and records every request body in `app.state.requests`."""
    requests: list[dict[str, Any]] = []

    async def endpoint(request: Request) -> Response:
        body = await request.json()
        requests.append(body)
        return await steps[min(len(requests), len(steps)) - 1](body)

    app = Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])
    app.state.requests = requests
    return app


def chat_body(message: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}]}
    if usage is not None:
        body["usage"] = usage
    return body


def answer(content: str = "ok", **usage: Any) -> Step:
    async def step(body):
        return JSONResponse(chat_body({"content": content},
                                      usage or {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}))
    return step


def status(code: int, message: str = "boom", headers: dict[str, str] | None = None) -> Step:
    async def step(body):
        return JSONResponse({"error": {"message": message, "type": "server_error", "code": None}},
                            status_code=code, headers=headers)
    return step


def hang(seconds: float) -> Step:
    async def step(body):
        await asyncio.sleep(seconds)
        return JSONResponse(chat_body({"content": "too late"}))
    return step


def test_timeout_is_retried_until_the_server_recovers():
    app = fault_app(hang(3), answer("recovered"))
    with running_server(app) as base:
        start = time.perf_counter()
        completion = fast_client(base + "/v1", timeout=0.3).complete(user("hi"))
        elapsed = time.perf_counter() - start
    assert completion.text == "recovered"
    assert len(app.state.requests) == 2
    assert elapsed < 2.5, "the client waited for the hung server instead of timing out"


def test_rate_limit_waits_as_long_as_retry_after_says():
    app = fault_app(status(429, "slow down", {"Retry-After": "1"}), answer("ok"))
    with running_server(app) as base:
        start = time.perf_counter()
        completion = fast_client(base + "/v1").complete(user("hi"))
        elapsed = time.perf_counter() - start
    assert completion.text == "ok"
    assert len(app.state.requests) == 2
    assert elapsed >= 0.95, "the client did not honour Retry-After: 1"


def test_server_error_is_retried_then_succeeds():
    app = fault_app(status(500), status(503), answer("ok"))
    with running_server(app) as base:
        completion = fast_client(base + "/v1").complete(user("hi"))
    assert completion.text == "ok"
    assert len(app.state.requests) == 3


def test_permanent_server_error_raises_model_error_after_the_retries():
    app = fault_app(status(500, "the GPU caught fire"))
    with running_server(app) as base:
        with pytest.raises(ModelError, match=r"after 3 attempts: HTTP 500: the GPU caught fire"):
            fast_client(base + "/v1", max_retries=2).complete(user("hi"))
    assert len(app.state.requests) == 3, "the SDK's own retries must be off"


def test_permanent_server_error_raises_model_error_in_async_path():
    app = fault_app(status(502))
    with running_server(app) as base:
        with pytest.raises(ModelError, match="after 2 attempts"):
            asyncio.run(complete_once(fast_client(base + "/v1", max_retries=1), user("hi")))
    assert len(app.state.requests) == 2


def test_unreachable_server_raises_model_error_naming_the_connection():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ModelError, match="connection error"):
        fast_client(f"http://127.0.0.1:{port}/v1", max_retries=1).complete(user("hi"))


def test_bad_request_unrelated_to_tools_fails_without_retrying():
    app = fault_app(status(400, "context length exceeded"))
    with running_server(app) as base:
        with pytest.raises(ModelError, match="rejected the request: HTTP 400: context length exceeded"):
            fast_client(base + "/v1").complete(user("hi"), tools=[SEARCH])
    assert len(app.state.requests) == 1


def test_malformed_tool_calls_become_tool_calls_with_errors():
    calls = [
        {"id": "a", "type": "function", "function": {"name": "search", "arguments": '{"query": "ok"}'}},
        {"id": "b", "type": "function", "function": {"name": "search", "arguments": '{"query": "unterminated'}},
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": '["a", "list"]'}},
        {"id": "d", "type": "function", "function": {"name": "search", "arguments": 17}},
        {"id": "e", "type": "function", "function": {"arguments": "{}"}},
        {"id": "f", "type": "function"},
        "not even an object",
    ]

    async def step(body):
        return JSONResponse(chat_body({"content": None, "tool_calls": calls}))

    with running_server(fault_app(step)) as base:
        completion = fast_client(base + "/v1", tool_protocol="native").complete(user("go"), tools=[SEARCH])
    got = completion.tool_calls
    assert len(got) == 7
    assert (got[0].arguments, got[0].error) == ({"query": "ok"}, None)
    assert got[1].arguments is None and "not valid JSON" in got[1].error
    assert got[1].raw_arguments == '{"query": "unterminated'
    assert "must be a JSON object" in got[2].error
    assert "must be a JSON object" in got[3].error
    assert "names no function" in got[4].error
    assert all(c.error and c.arguments is None for c in got[5:])
    assert all(c.id for c in got)


def test_auto_falls_back_to_text_protocol_when_the_server_rejects_tools():
    async def no_tools(body):
        if "tools" in body:
            return JSONResponse({"object": "error", "message": '"auto" tool choice requires '
                                 "--enable-auto-tool-choice and --tool-call-parser to be set",
                                 "type": "BadRequestError", "code": 400}, status_code=400)
        return JSONResponse(chat_body({"content": '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'}))

    app = fault_app(no_tools)
    with running_server(app) as base:
        model = fast_client(base + "/v1")
        first = model.complete(user("go"), tools=[SEARCH])
        second = model.complete(user("again"), tools=[SEARCH])
    assert first.tool_calls[0].arguments == {"query": "q"}
    assert second.tool_calls[0].name == "search"
    assert model.native_tools is False
    requests = app.state.requests
    assert len(requests) == 3, "after the first rejection tools must no longer be sent natively"
    assert "tools" not in requests[1] and "<tools>" in requests[1]["messages"][0]["content"]


def test_auto_fallback_also_happens_on_the_async_path():
    async def no_tools(body):
        if "tools" in body:
            return JSONResponse({"error": {"message": "tools param requires --jinja flag"}}, status_code=400)
        return JSONResponse(chat_body({"content": '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'}))

    with running_server(fault_app(no_tools)) as base:
        model = fast_client(base + "/v1")
        completion = asyncio.run(complete_with_tools(model))
    assert completion.tool_calls[0].arguments == {"query": "q"}
    assert model.native_tools is False


async def complete_with_tools(model: OpenAIModel):
    try:
        return await model.acomplete(user("go"), tools=[SEARCH])
    finally:
        await model.aclose()


def test_text_tool_calls_in_content_are_parsed_even_when_tools_were_sent_natively():
    # A server with tool support but no tool-call parser hands the model's protocol text back.
    async def step(body):
        return JSONResponse(chat_body({"content": '<think>hm</think>\n<tool_call>\n{"name": "search", '
                                                  '"arguments": {"query": "raw"}}\n</tool_call>'}))

    with running_server(fault_app(step)) as base:
        completion = fast_client(base + "/v1", tool_protocol="native").complete(user("go"), tools=[SEARCH])
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [("search", {"query": "raw"})]
    assert (completion.text, completion.message.reasoning) == ("", "hm")


def test_native_protocol_does_not_fall_back():
    app = fault_app(status(400, "tools are not supported"))
    with running_server(app) as base:
        with pytest.raises(ModelError, match="tools are not supported"):
            fast_client(base + "/v1", tool_protocol="native").complete(user("go"), tools=[SEARCH])


def test_rejected_response_format_falls_back_to_the_schema_in_the_prompt():
    async def no_format(body):
        if "response_format" in body:
            return JSONResponse({"error": {"message": "response_format is not supported"}}, status_code=400)
        return JSONResponse(chat_body({"content": '{"subgoal": "s", "toolbox": []}'}))

    app = fault_app(no_format)
    with running_server(app) as base:
        completion = fast_client(base + "/v1").complete(user("configure"), response_schema=SCHEMA)
    assert json.loads(completion.text) == {"subgoal": "s", "toolbox": []}
    last = app.state.requests[-1]["messages"][-1]
    assert last["role"] == "user" and last["content"].startswith("configure")
    assert json.dumps(SCHEMA) in last["content"]


def test_cached_tokens_are_read_from_usage():
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}
    with running_server(fault_app(answer("ok", **usage))) as base:
        completion = fast_client(base + "/v1").complete(user("hi"))
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens,
            completion.usage.cached_tokens) == (100, 5, 64)


def test_missing_usage_is_estimated_from_the_text():
    async def step(body):
        return JSONResponse(chat_body({"content": "x" * 40}))

    with running_server(fault_app(step)) as base:
        completion = fast_client(base + "/v1").complete(user("y" * 400))
    assert completion.usage.completion_tokens == 10
    assert completion.usage.prompt_tokens >= 100


def test_request_carries_options_and_extra_body():
    app = fault_app(answer("ok"))
    with running_server(app) as base:
        model = fast_client(base + "/v1", temperature=0.25, seed=7, extra_body={"top_k": 20}, send_session=True)
        model.complete(user("hi"), max_tokens=64, session="episode-1")
    (body,) = app.state.requests
    assert (body["temperature"], body["seed"], body["top_k"], body["max_tokens"], body["session"]) == (
        0.25, 7, 20, 64, "episode-1")


def test_rejected_max_tokens_switches_to_max_completion_tokens():
    async def new_name_only(body):
        if "max_tokens" in body:
            return JSONResponse({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with "
                                           "this model. Use 'max_completion_tokens' instead."}}, status_code=400)
        return JSONResponse(chat_body({"content": "ok"}))

    app = fault_app(new_name_only)
    with running_server(app) as base:
        model = fast_client(base + "/v1")
        assert model.complete(user("hi"), max_tokens=32).text == "ok"
        assert model.complete(user("hi"), max_tokens=16).text == "ok"
    assert [r.get("max_completion_tokens") for r in app.state.requests] == [None, 32, 16]


def refusing(field: str, message: str, code: str) -> Step:
    """A step that answers as OpenAI answers a request carrying a field the model does not take."""
    async def step(body):
        if field in body:
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": field,
                                           "code": code}}, status_code=400)
        return JSONResponse(chat_body({"content": "ok"}))
    return step


def test_a_temperature_the_model_refuses_is_left_out_from_then_on_with_a_warning(caplog):
    app = fault_app(refusing("temperature", "Unsupported value: 'temperature' does not support 0 with this model. "
                                            "Only the default (1) value is supported.", "unsupported_value"))
    with running_server(app) as base:
        model = fast_client(base + "/v1", temperature=0.0, seed=7)
        assert model.complete(user("hi")).text == "ok"
        assert model.complete(user("again")).text == "ok"
    assert [("temperature" in r, r.get("seed")) for r in app.state.requests] == [(True, 7), (False, 7), (False, 7)]
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        f"openai:test-model at {base}/v1 does not take temperature (HTTP 400: Unsupported value: 'temperature' does "
        "not support 0 with this model. Only the default (1) value is supported.): sent without it from now on, so "
        "it samples at its own default"]


def test_a_top_p_a_preset_sends_that_the_model_refuses_is_left_out_too():
    app = fault_app(refusing("top_p", "Unsupported parameter: 'top_p' is not supported with this model.",
                             "unsupported_parameter"))
    with running_server(app) as base:
        assert fast_client(base + "/v1", extra_body={"top_p": 0.95}).complete(user("hi")).text == "ok"
    assert [r.get("top_p") for r in app.state.requests] == [0.95, None]


def test_a_temperature_out_of_range_is_an_error_not_a_field_to_drop():
    app = fault_app(refusing("temperature", "Invalid 'temperature': decimal above maximum value. Expected a value "
                                            "<= 2, but got 3 instead.", "decimal_above_max_value"))
    with running_server(app) as base:
        with pytest.raises(ModelError, match="rejected the request: HTTP 400: Invalid 'temperature'"):
            fast_client(base + "/v1", temperature=3.0).complete(user("hi"))
    assert len(app.state.requests) == 1


REFUSALS = {  # what a server refuses, how it says so, and the call that sends it
    "temperature": ({"message": "Unsupported value: 'temperature' does not support 0 with this model. Only the "
                                "default (1) value is supported.", "param": "temperature", "code": "unsupported_value"},
                    {"temperature": 0.0}, {}),
    "max_tokens": ({"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                               "'max_completion_tokens' instead."}, {}, {"max_tokens": 16}),
    "response_format": ({"message": "response_format is not supported"}, {}, {"response_schema": SCHEMA}),
    "tools": ({"message": "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set"},
              {}, {"tools": [SEARCH]}),
}


@pytest.mark.parametrize("field", list(REFUSALS))
def test_concurrent_requests_that_meet_the_same_refusal_each_adapt_and_succeed(field):
    error, options, call_options = REFUSALS[field]

    async def refuse_while_all_are_in_flight(body):
        if field in body:
            await asyncio.sleep(0.2)
            return JSONResponse({"error": {"type": "invalid_request_error", **error}}, status_code=400)
        return JSONResponse(chat_body({"content": '{"subgoal": "s", "toolbox": []}'}))

    async def eight_at_once(model):
        try:
            return await asyncio.gather(*(model.acomplete(user(f"q{i}"), **call_options) for i in range(8)))
        finally:
            await model.aclose()

    app = fault_app(refuse_while_all_are_in_flight)
    with running_server(app) as base:
        completions = asyncio.run(eight_at_once(fast_client(base + "/v1", **options)))
    assert [json.loads(c.text) for c in completions] == [{"subgoal": "s", "toolbox": []}] * 8
    assert len(app.state.requests) == 16  # each sent once as it was, once adapted


class SessionModel(ScriptedModel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ended: list[str] = []

    def end_session(self, session: str) -> None:
        self.ended.append(session)


def test_end_session_reaches_the_served_model_when_sessions_are_sent():
    served = SessionModel([], default="ok")
    with serving(served) as url:
        fast_client(url, send_session=True).end_session("episode/1")
        fast_client(url).end_session("episode/2")
    assert served.ended == ["episode/1"]


# -- specs and headers ----------------------------------------------------------------------

def test_spec_with_url(monkeypatch):
    monkeypatch.delenv("TOOLSELF_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    spec = parse_spec("openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1/")
    assert (spec.model, spec.base_url, spec.api_key) == ("Qwen/Qwen3-8B", "http://127.0.0.1:8000/v1", "sk-test")


def test_spec_name_may_contain_at_sign(monkeypatch):
    spec = parse_spec("openai:org@v2/model@https://example.test/v1")
    assert (spec.model, spec.base_url) == ("org@v2/model", "https://example.test/v1")


def test_spec_without_url_uses_openai_base_url(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9000/v1")
    monkeypatch.setenv("TOOLSELF_API_KEY", "tk")
    spec = parse_spec("openai:qwen3")
    assert (spec.model, spec.base_url, spec.api_key) == ("qwen3", "http://127.0.0.1:9000/v1", "tk")


def test_spec_api_key_defaults_to_empty(monkeypatch):
    monkeypatch.delenv("TOOLSELF_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert parse_spec("openai:m@http://localhost:1/v1").api_key == "EMPTY"


@pytest.mark.parametrize("spec, message", [
    ("qwen3@http://127.0.0.1:8000/v1", "expected openai:NAME@URL"),
    ("openai:@http://127.0.0.1:8000/v1", "no model name"),
    ("openai:qwen3@127.0.0.1:8000", "must start with http"),
    ("openai:qwen3", "names no server"),
])
def test_malformed_specs_are_rejected_clearly(monkeypatch, spec, message):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_model_spec_builds_a_model_with_options(monkeypatch):
    model = parse_model_spec("openai:qwen3@http://127.0.0.1:8000/v1", temperature=0.6, tool_protocol="text")
    assert (model.name, model.base_url, model.temperature, model.tool_protocol) == (
        "openai:qwen3", "http://127.0.0.1:8000/v1", 0.6, "text")


def test_retry_after_accepts_seconds_milliseconds_and_dates():
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < parse_retry_after({"retry-after": date}) <= 31
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# -- the agent loop over HTTP ---------------------------------------------------------------

@tool
def lookup(key: str) -> str:
    """Look a key up in a small table.

    Args:
        key: The key to look up.
    """
    return {"a": "alpha", "b": "beta"}.get(key, "no such key")


def configuration(subgoal: str, knowledge: str = "none") -> str:
    return json.dumps({"subgoal": subgoal, "strategy": "Use lookup, then answer.", "toolbox": ["lookup"],
                       "knowledge": knowledge, "context_mode": "basic"})


@pytest.mark.parametrize("protocol", ["native", "text"])
def test_an_agent_episode_runs_against_toolself_serve(protocol):
    scripted = ScriptedModel([
        configuration("find a"),
        call("lookup", key="a"),
        call("reconfigure", summary="a is alpha", reason="sub-goal done", next_subgoal="find b"),
        configuration("find b", knowledge="history"),
        call("lookup", key="b"),
        call("terminate", answer="alpha, beta"),
    ])
    with serving(scripted) as url:
        model = fast_client(url, tool_protocol=protocol)
        trajectory = Agent(model, ToolPool([lookup]), AgentSettings()).run("What are a and b?")
    assert trajectory.error is None, trajectory.error
    assert trajectory.answer == "alpha, beta"
    assert [s.configuration.subgoal for s in trajectory.stages] == ["find a", "find b"]
    assert trajectory.num_reconfigurations == 1
    assert trajectory.usage.prompt_tokens > 0 and trajectory.usage.completion_tokens > 0
    observations = [m.content for m in scripted.calls[2]["messages"]]
    assert any("alpha" in text for text in observations), "the tool result travelled back over HTTP"


def test_an_attempt_records_the_sampling_fields_its_model_refused():
    app = fault_app(refusing("temperature", "Unsupported value: 'temperature' does not support 0.7 with this model. "
                                            "Only the default (1) value is supported.", "unsupported_value"))
    with running_server(app) as base:
        model = fast_client(base + "/v1", temperature=0.7)
        trajectory = Agent(model, ToolPool([]), AgentSettings(max_stages=1, max_steps_per_stage=1)).run("Say ok.")
        untouched = Agent(fast_client(base + "/v1"), ToolPool([]), AgentSettings(max_stages=1,
                                                                                 max_steps_per_stage=1)).run("Say ok.")
    assert trajectory.metadata["model_refused_fields"] == ["temperature"]
    assert "model_refused_fields" not in untouched.metadata


def test_an_eval_says_which_sampling_fields_its_models_server_refused_and_records_them(tmp_path):
    from typer.testing import CliRunner

    from toolself.cli import app as cli

    server = fault_app(refusing("temperature", "Unsupported value: 'temperature' does not support 0.7 with this "
                                               "model. Only the default (1) value is supported.", "unsupported_value"))
    with running_server(server) as base:
        result = CliRunner().invoke(cli, ["eval", "--model", f"openai:test-model@{base}/v1", "--tasks", "builtin:data",
                                          "--limit", "1", "--temperature", "0.7", "--max-stages", "1",
                                          "--max-steps", "1", "--no-report", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "warning: the model's server refused temperature" in " ".join(result.output.split())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["refused_fields"] == {"model": ["temperature"]}
