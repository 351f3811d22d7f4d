"""`toolself serve`: the OpenAI wire format over any ChatModel, spoken over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from http_fixtures import InFlight, running_server, serving
from toolself.models.base import Completion, Message, SyncModelBase, ToolCall, Usage
from toolself.models.openai_compat import OpenAIModel
from toolself.models.scripted import ScriptedModel, call
from toolself.serve import DeltaWriter, create_app, merge_deltas

SEARCH = {"type": "function", "function": {"name": "search", "description": "Search.",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}


class RecordingModel(SyncModelBase):
    """Answers with a fixed message and keeps every argument it was called with."""

    name = "recorder"

    def __init__(self, reply: Message | None = None, usage: Usage | None = None):
        self.reply = reply or Message("assistant", "fine")
        self.usage = usage or Usage(11, 3, 5)
        self.calls: list[dict[str, Any]] = []

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        self.calls.append({"messages": messages, "tools": tools, "response_schema": response_schema,
                           "session": session, "max_tokens": max_tokens})
        return Completion(self.reply, self.usage, finish_reason="length")


def post(url: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(url + "/chat/completions", content=content, headers={"content-type": "application/json"},
                      timeout=10)


HELLO = [{"role": "user", "content": "hello"}]


def test_health_and_model_list():
    with serving(RecordingModel()) as url:
        assert httpx.get(url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
        models = httpx.get(url + "/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["recorder"]


def test_plain_completion_has_the_openai_shape_and_usage():
    with serving(RecordingModel()) as url:
        body = post(url, {"model": "anything", "messages": HELLO}).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "fine"}
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                             "prompt_tokens_details": {"cached_tokens": 5}}


def test_request_messages_become_typed_messages():
    model = RecordingModel()
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": None, "reasoning_content": "dropped",
         "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "search", "arguments": '{"query": "q"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "name": "search", "content": "found"},
    ]
    with serving(model) as url:
        assert post(url, {"messages": messages, "tools": [SEARCH]}).status_code == 200
    got = model.calls[0]["messages"]
    assert [(m.role, m.content) for m in got] == [("system", "be brief"), ("user", "part one, part two"),
                                                   ("assistant", ""), ("tool", "found")]
    assert got[2].tool_calls == [ToolCall("search", {"query": "q"}, "call_9", '{"query": "q"}')]
    assert (got[3].tool_call_id, got[3].name) == ("call_9", "search")
    assert model.calls[0]["tools"] == [SEARCH]


def test_request_options_reach_the_model():
    model = RecordingModel()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    with serving(model) as url:
        post(url, {"messages": HELLO, "max_tokens": 50, "max_completion_tokens": 20, "session": "ep-1",
                   "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        post(url, {"messages": HELLO, "response_format": {"type": "json_object"}, "tools": [SEARCH],
                   "tool_choice": "none", "top_p": 0.9, "seed": 3})
    first, second = model.calls
    assert (first["max_tokens"], first["session"], first["response_schema"]) == (20, "ep-1", schema)
    assert (second["response_schema"], second["tools"]) == ({"type": "object"}, None)


def test_tool_calls_and_reasoning_are_returned_in_openai_shape():
    reply = Message("assistant", "", reasoning="think first", tool_calls=[
        ToolCall("search", {"query": "x"}, "call_1", '{"query": "x"}'),
        ToolCall("search", None, "call_2", '{"query": ', error="arguments are not valid JSON")])
    with serving(RecordingModel(reply)) as url:
        body = post(url, {"messages": HELLO, "tools": [SEARCH]}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "think first"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"query": "x"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": '{"query": '}}]


@pytest.mark.parametrize("body, fragment", [
    ("{not json", "not valid JSON"),
    ([1, 2], "must be a JSON object"),
    ({"model": "m"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "tool", "content": "r"}]}, "tool_call_id"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text content"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "n": 2}, "one choice per request"),
    ({"messages": HELLO, "logprobs": True}, "log-probabilities"),
    ({"messages": HELLO, "top_logprobs": 3}, "log-probabilities"),
    ({"messages": HELLO, "frequency_penalty": 0.5}, "penalties"),
    ({"messages": HELLO, "logit_bias": {"42": 5}}, "logit_bias"),
    ({"messages": HELLO, "top_k": 5}, "top_k: this server does not support"),
    ({"messages": HELLO, "temperature": 3}, "temperature"),
    ({"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
    ({"messages": HELLO, "tools": [SEARCH], "tool_choice": {"type": "function", "function": {"name": "visit"}}},
     "'visit' is not among the tools"),
    ({"messages": HELLO, "tool_choice": "required"}, "needs tools"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"description": "no name"}}]}, "name"),
    ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "json_schema"),
    ({"messages": HELLO, "chat_template_kwargs": {"enable_thinking": True}}, "accepts only"),
    ({"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False, "tools_in_user": 1}}, "accepts only"),
])
def test_bad_requests_get_an_openai_error_with_400(body, fragment):
    model = RecordingModel()
    with serving(model) as url:
        response = post(url, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]
    assert model.calls == []


def test_unknown_route_gets_json_404():
    with serving(RecordingModel()) as url:
        response = httpx.get(url + "/engines")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_a_failing_model_gives_500_and_the_server_stays_up():
    model = ScriptedModel([])  # raises IndexError: out of replies
    with serving(model) as url:
        failed = post(url, {"messages": HELLO})
        healthy = httpx.get(url.removesuffix("/v1") + "/health")
    assert failed.status_code == 500
    assert "IndexError" in failed.json()["error"]["message"]
    assert healthy.status_code == 200


def test_concurrent_requests_reach_the_model_concurrently():
    class SlowAsyncModel(RecordingModel):
        in_flight = peak = 0

        async def acomplete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None):
            SlowAsyncModel.in_flight += 1
            SlowAsyncModel.peak = max(SlowAsyncModel.peak, SlowAsyncModel.in_flight)
            await asyncio.sleep(0.3)
            SlowAsyncModel.in_flight -= 1
            return self.complete(messages)

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=10) as client:
            responses = await asyncio.gather(*(client.post(url + "/chat/completions", json={"messages": HELLO})
                                               for _ in range(6)))
        return [r.status_code for r in responses]

    with serving(SlowAsyncModel()) as url:
        codes = asyncio.run(burst(url))
    assert codes == [200] * 6
    assert SlowAsyncModel.peak == 6


def test_concurrent_requests_to_a_blocking_model_overlap_beyond_the_cpu_count():
    slow = InFlight(0.3)

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=10) as client:
            responses = await asyncio.gather(*(client.post(url + "/chat/completions", json={"messages": HELLO})
                                               for _ in range(24)))
        return [r.status_code for r in responses]

    with serving(ScriptedModel([], default=slow)) as url:
        codes = asyncio.run(burst(url))
    assert codes == [200] * 24
    # asyncio's default executor has min(32, cpus + 4) = 6 threads on 2 cores.
    assert slow.peak > 6, f"at most {slow.peak} blocking calls overlapped"


def test_streaming_is_read_by_the_openai_sdk():
    scripted = ScriptedModel([call("search", query="streamed")])
    with serving(scripted) as url:
        with openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client:
            chunks = list(client.chat.completions.create(model="m", messages=HELLO, tools=[SEARCH], stream=True,
                                                         stream_options={"include_usage": True}))
    calls = [c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("search", {"query": "streamed"})]
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


def test_app_lists_a_served_name_when_given():
    app = create_app(RecordingModel(), served_name="Qwen/Qwen3-8B")
    with running_server(app) as base:
        assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == "Qwen/Qwen3-8B"


def test_loopback_fixture_answers_keep_alive_requests_without_delayed_acks():
    # Benchmarks time fixed-latency servers through this fixture: a 40 ms delayed ACK per
    # request (sockets without TCP_NODELAY) would swamp what they measure.
    with serving(RecordingModel()) as url, httpx.Client() as client:
        client.get(url + "/models")
        start = time.perf_counter()
        for _ in range(20):
            client.get(url + "/models")
        elapsed = time.perf_counter() - start
    # With Nagle's algorithm on, each keep-alive request waits ~40 ms for a delayed ACK (0.8 s).
    assert elapsed < 0.7, f"20 keep-alive requests took {elapsed:.2f} s"


@pytest.mark.slow  # a fresh interpreter importing openai and starlette: 2-6 s on 2 busy cores
def test_the_serve_command_serves_a_model_spec_as_a_subprocess():
    # `toolself serve --model openai:...@URL` is a proxy: here to another server on loopback.
    upstream = ScriptedModel([call("search", query="via the proxy")])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    with serving(upstream) as upstream_url:
        process = subprocess.Popen(
            [sys.executable, "-m", "toolself", "serve", "--model", f"openai:upstream@{upstream_url}",
             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "toolself serve did not come up"
                time.sleep(0.05)
            proxy = OpenAIModel("any", f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=10)
            completion = proxy.complete([Message("user", "find it")], tools=[SEARCH])
            listed = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
        finally:
            process.terminate()
            process.wait(timeout=10)
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [("search", {"query": "via the proxy"})]
    assert upstream.calls[0]["tools"] == [SEARCH]
    assert listed == "openai:upstream"


def test_fields_that_never_change_a_reply_are_accepted():
    with serving(RecordingModel()) as url:
        response = post(url, {"messages": HELLO, "user": "u1", "metadata": {"k": "v"}, "store": False,
                              "parallel_tool_calls": True, "n": 1, "logprobs": False, "frequency_penalty": 0})
    assert response.status_code == 200


def test_a_request_not_to_think_is_refused_for_a_model_that_may_think():
    model = RecordingModel(Message("assistant", "fine", reasoning="I thought about it"))
    with serving(model) as url:
        response = post(url, {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False}})
    assert response.status_code == 400 and "recorder may think" in response.json()["error"]["message"]
    assert model.calls == []


def test_a_named_tool_choice_offers_the_model_only_that_tool():
    model = RecordingModel()
    visit = {"type": "function", "function": {"name": "visit", "parameters": {"type": "object"}}}
    with serving(model) as url:
        post(url, {"messages": HELLO, "tools": [SEARCH, visit],
                   "tool_choice": {"type": "function", "function": {"name": "visit"}}})
    assert [t["function"]["name"] for t in model.calls[0]["tools"]] == ["visit"]


def test_a_stop_sequence_cuts_the_reply_of_a_model_that_is_not_incremental():
    model = RecordingModel(Message("assistant", "First sentence. Second sentence."))
    with serving(model) as url:
        choice = post(url, {"messages": HELLO, "stop": "."}).json()["choices"][0]
    assert choice["message"]["content"] == "First sentence"
    assert choice["finish_reason"] == "stop"


def feed_by_characters(writer: DeltaWriter, text: str) -> list[dict[str, Any]]:
    return [d for ch in text for d in writer.feed(ch)]


def test_a_tool_call_streams_its_name_first_and_its_arguments_as_they_are_written():
    writer = DeltaWriter(tools=True, stop=[])
    text = '<tool_call>\n{"name": "search", "arguments": {"query": "a {b} c", "n": {"k": 1}}}\n</tool_call>'
    deltas = feed_by_characters(writer, text)
    first = deltas[0]["tool_calls"][0]
    assert first["function"] == {"name": "search", "arguments": ""} and first["id"]
    pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]]
    assert len(pieces) > 5, "the arguments came in one piece"
    (call_,) = merge_deltas(deltas)["tool_calls"]
    assert json.loads(call_["function"]["arguments"]) == {"query": "a {b} c", "n": {"k": 1}}


def test_streamed_content_holds_back_what_could_start_a_stop_sequence():
    writer = DeltaWriter(tools=False, stop=["END"])
    deltas = feed_by_characters(writer, "one two EN three EN")
    assert merge_deltas(deltas)["content"] == "one two EN three"
    assert not writer.stopped
    deltas += feed_by_characters(writer, "D more")
    assert merge_deltas(deltas)["content"] == "one two EN three " and writer.stopped


# -- the embedded model behind the server: real sampling and token-by-token streams -----------

@pytest.fixture(scope="module")
def embedded():
    from toolself.models.local import EmbeddedModel

    model = EmbeddedModel.load(dtype="float32", threads=0)
    yield model
    model.close()


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)


@pytest.mark.slow
def test_sampling_fields_change_the_embedded_models_samples(embedded):
    story = [{"role": "user", "content": "Write one sentence about a cat."}]
    with serving(embedded) as url, client_for(url) as client:
        def reply(**fields):
            return client.chat.completions.create(model="m", messages=story, max_tokens=12,
                                                  **fields).choices[0].message.content
        sampled = [reply(temperature=1.5, seed=seed) for seed in range(4)]
        again = reply(temperature=1.5, seed=0)
        greedy = {reply(), reply()}
    assert len(set(sampled)) >= 3, sampled
    assert again == sampled[0]
    assert len(greedy) == 1


@pytest.mark.slow
def test_a_stop_sequence_ends_the_embedded_models_reply_where_it_appears(embedded):
    story = [{"role": "user", "content": "Tell me about the sea."}]
    with serving(embedded) as url, client_for(url) as client:
        full = client.chat.completions.create(model="m", messages=story, max_tokens=40).choices[0].message.content
        stop = full.split()[3]
        cut = client.chat.completions.create(model="m", messages=story, max_tokens=40, stop=[stop, "zzz"]).choices[0]
    assert cut.message.content == full[:full.index(stop)]
    assert cut.finish_reason == "stop"


@pytest.mark.slow
def test_the_embedded_model_accepts_a_request_not_to_think_as_vllm_takes_it(embedded):
    with serving(embedded) as url:
        response = post(url, {"messages": HELLO, "max_tokens": 4, "chat_template_kwargs": {"enable_thinking": False}})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_the_embedded_model_streams_its_reply_token_by_token(embedded):
    story = [{"role": "user", "content": "Tell me about the sea."}]
    with serving(embedded) as url, client_for(url) as client:
        started = time.monotonic()
        arrivals = []
        for chunk in client.chat.completions.create(model="m", messages=story, max_tokens=48, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic() - started, chunk.choices[0].delta.content))
        total = time.monotonic() - started
        whole = client.chat.completions.create(model="m", messages=story, max_tokens=48).choices[0].message.content
    assert len(arrivals) > 10
    assert arrivals[0][0] < total / 3, f"first text at {arrivals[0][0]:.2f} s of {total:.2f} s"
    assert "".join(text for _, text in arrivals) == whole


@pytest.mark.slow
def test_the_embedded_model_streams_a_tool_call_the_openai_sdk_reassembles(embedded):
    with serving(embedded) as url, client_for(url) as client:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Search for the Lumen kettle."}], tools=[SEARCH],
            stream=True, stream_options={"include_usage": True}, max_tokens=40)
        chunks = list(stream)
    calls = [c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []]
    assert calls[0].function.name == "search" and calls[0].id
    assert len(calls) > 2, "the arguments came in one piece"
    arguments = json.loads("".join(c.function.arguments or "" for c in calls))
    assert isinstance(arguments.get("query"), str)
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0
