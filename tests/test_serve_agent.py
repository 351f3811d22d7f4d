"""`toolself serve` offers the ToolSelf agent as a model: one attempt per chat completion,
spoken to with the openai client over real loopback HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
from typer.testing import CliRunner

from http_fixtures import InFlight, serving
from ports import free_port
from toolself.cli import DEMO_ANSWER, app, demo_docs
from toolself.models.scripted import ScriptedModel, call
from toolself.serve import server
from toolself.serve_agent import HEADER, ServedAgent
from toolself.tools.options import ToolOptions
from toolself.trajectory import read_jsonl
from toolself.variants import settings_for
from toolself.viewer.load import load_attempts

AGENT = "toolself:toolself"
QUESTION = "Who makes the Lumen kettle?"


def research_config(**change: Any) -> str:
    return json.dumps({"subgoal": "find the maker", "strategy": "search the documents", "toolbox": ["search", "visit"],
                       "knowledge": "none", "context_mode": "basic", **change})


def finds_the_maker() -> list[Any]:
    return [research_config(), call("search", query="Lumen kettle maker"),
            call("terminate", answer="Brightwater Appliances")]


@contextmanager
def agent_server(model: Any, out: Path, concurrency: int = 2, method: str = "toolself", freeze: tuple[str, ...] = (),
                 config_model: Any = None, **budgets: Any) -> Iterator[tuple[str, ServedAgent]]:
    """`toolself serve` over `model`, with the agent over it and the demo documents."""
    options = ToolOptions(docs=demo_docs())
    pool = options.pool()
    settings = settings_for(method, freeze, **{"max_stages": 3, "max_steps_per_stage": 4, **budgets})
    agent = ServedAgent(model, pool, settings, out, concurrency=concurrency, collection=options.collection(),
                        config_model=config_model)
    try:
        with serving(model, agent=agent) as url:
            yield url, agent
    finally:
        agent.close()
        pool.close()


def client_for(url: str, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=timeout)


def ask(client: openai.OpenAI, question: str = QUESTION, **fields: Any) -> Any:
    return client.chat.completions.create(model=AGENT, messages=[{"role": "user", "content": question}], **fields)


def until(condition: Any, seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.05)
    return value


def test_the_model_and_the_agent_are_both_listed(tmp_path):
    with agent_server(ScriptedModel([]), tmp_path) as (url, _), client_for(url) as client:
        models = {m.id: m for m in client.models.list()}
    assert list(models) == ["scripted", AGENT]
    assert models[AGENT].model_extra["toolself"] == {"kind": "agent", "method": "toolself", "preset": None,
                                                     "policy": "scripted"}


def test_an_agent_completion_searches_the_documents_and_answers_with_the_saved_trajectory(tmp_path):
    model = ScriptedModel(finds_the_maker())
    with agent_server(model, tmp_path / "served") as (url, _), client_for(url) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=AGENT, messages=[{"role": "system", "content": "ignored"}, {"role": "user", "content": QUESTION}])
    completion = raw.parse()
    served = completion.model_extra["toolself"]
    assert completion.choices[0].message.content == "Brightwater Appliances"
    assert completion.choices[0].finish_reason == "stop" and completion.model == AGENT
    assert raw.headers[HEADER] == served["trajectory_id"]
    assert served["trajectory_file"] == str((tmp_path / "served" / "trajectories.jsonl").resolve())
    assert (served["end_reason"], served["stages"], served["actions"]) == ("terminate", 1, 2)
    [trajectory] = read_jsonl(served["trajectory_file"])
    assert trajectory.id == served["trajectory_id"] and trajectory.task == QUESTION
    search = trajectory.stages[0].steps[0]
    assert search.tool == "search" and not search.is_error and "Brightwater" in search.observation
    assert completion.usage.total_tokens == trajectory.usage.total_tokens > 0
    assert [a.trajectory.id for a in load_attempts([tmp_path / "served"])] == [trajectory.id]  # `toolself view` reads it


def test_a_served_decoupled_agent_has_its_configurations_written_by_the_config_model(tmp_path):
    writer = ScriptedModel([research_config(subgoal="name the maker")])
    actor = ScriptedModel(finds_the_maker()[1:])
    with agent_server(actor, tmp_path, method="decoupled", config_model=writer) as (url, _), \
            client_for(url) as client:
        completion = client.chat.completions.create(model="toolself:decoupled",
                                                    messages=[{"role": "user", "content": QUESTION}])
    assert completion.choices[0].message.content == "Brightwater Appliances"
    [trajectory] = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(writer.calls) == 1 and trajectory.stages[0].configuration.subgoal == "name the maker"


def test_a_served_agent_holds_a_frozen_dimension_whatever_the_policy_writes(tmp_path):
    with agent_server(ScriptedModel(finds_the_maker()), tmp_path, freeze=("strategy",)) as (url, _), \
            client_for(url) as client:
        assert [m.id for m in client.models.list()][1] == "toolself:toolself-freeze:strategy"
        client.chat.completions.create(model="toolself:toolself-freeze:strategy",
                                       messages=[{"role": "user", "content": QUESTION}])
    [trajectory] = read_jsonl(tmp_path / "trajectories.jsonl")
    assert trajectory.settings["freeze"] == ["strategy"]
    assert trajectory.stages[0].configuration.strategy != "search the documents"  # what the policy wrote


def test_the_serve_command_names_a_dimension_it_cannot_freeze_before_loading_a_model():
    result = CliRunner().invoke(app, ["serve", "--freeze", "colour", "--model", "openai:x@http://127.0.0.1:9/v1"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "cannot freeze ['colour']" in text and "loading the model" not in text


def test_a_request_naming_the_model_still_gets_the_models_own_reply(tmp_path):
    with agent_server(ScriptedModel(["plain reply"]), tmp_path) as (url, _), client_for(url) as client:
        reply = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "plain reply"
    assert not (tmp_path / "trajectories.jsonl").exists()


def test_an_attempt_that_fails_is_a_500_in_openais_error_format_and_the_server_serves_on(tmp_path):
    def explode(messages, tools):
        raise RuntimeError("the policy exploded")

    model = ScriptedModel([explode, *finds_the_maker()])
    with agent_server(model, tmp_path) as (url, _), client_for(url) as client:
        with pytest.raises(openai.InternalServerError) as failed:
            ask(client)
        after = ask(client)
    assert failed.value.status_code == 500
    assert "the policy exploded" in failed.value.body["message"] and failed.value.body["type"] == "server_error"
    failed_id = failed.value.response.headers[HEADER]
    assert failed.value.response.json()["toolself"]["end_reason"] == "error"
    assert after.choices[0].message.content == "Brightwater Appliances"
    saved = {t.id: t.end_reason for t in read_jsonl(tmp_path / "trajectories.jsonl")}
    assert saved == {failed_id: "error", after.model_extra["toolself"]["trajectory_id"]: "terminate"}


@pytest.mark.parametrize("field", [{"temperature": 0.7}, {"max_tokens": 50}, {"stop": ["x"]},
                                   {"tools": [{"type": "function", "function": {"name": "f"}}]}])
def test_a_field_the_agent_cannot_honour_is_refused(tmp_path, field):
    model = ScriptedModel([])
    with agent_server(model, tmp_path) as (url, _), client_for(url) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(client, **field)
    assert next(iter(field)) in refused.value.body["message"] and model.calls == []


def test_a_request_without_a_user_message_is_refused(tmp_path):
    with agent_server(ScriptedModel([]), tmp_path) as (url, _):
        response = httpx.post(url + "/chat/completions", json={"model": AGENT, "messages": [
            {"role": "system", "content": "no task here"}]}, timeout=10)
    assert response.status_code == 400 and "last user message" in response.json()["error"]["message"]


def test_a_stream_shows_stages_and_actions_as_reasoning_and_the_answer_as_content(tmp_path):
    with agent_server(ScriptedModel(finds_the_maker()), tmp_path) as (url, _), client_for(url) as client:
        chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    progress = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    assert "stage 1: find the maker" in progress and "1. search" in progress and "Brightwater" in progress
    assert "".join(d.content or "" for d in deltas) == "Brightwater Appliances"
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == "stop"
    served = last.model_extra["toolself"]
    assert f"attempt {served['trajectory_id']}" in progress
    assert chunks[-1].usage.total_tokens > 0
    assert [t.id for t in read_jsonl(tmp_path / "trajectories.jsonl")] == [served["trajectory_id"]]


def test_agent_requests_run_concurrently_up_to_the_agent_concurrency(tmp_path):
    gate = InFlight(0.5)

    def reply(messages, tools):
        gate(messages, tools)
        return research_config() if tools is None else call("terminate", answer="42")

    with agent_server(ScriptedModel([], default=reply), tmp_path, concurrency=2) as (url, _), \
            client_for(url) as client:
        answers: list[str] = []
        threads = [threading.Thread(target=lambda: answers.append(ask(client).choices[0].message.content))
                   for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert answers == ["42"] * 3
    assert gate.total == 6 and gate.peak == 2


def slow_searcher(messages, tools):
    time.sleep(0.05)
    return research_config() if tools is None else call("search", query="more")


def test_a_client_that_leaves_cancels_its_attempt_and_the_attempt_is_kept(tmp_path):
    model = ScriptedModel([], default=slow_searcher)
    with agent_server(model, tmp_path, max_stages=1, max_steps_per_stage=10_000) as (url, _):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/chat/completions", json={"model": AGENT, "messages": [
                {"role": "user", "content": QUESTION}]}, timeout=1)
        [trajectory] = until(lambda: (tmp_path / "trajectories.jsonl").exists()
                             and read_jsonl(tmp_path / "trajectories.jsonl"))
    assert trajectory.end_reason == "budget:cancelled" and trajectory.num_steps > 0


def test_shutting_the_server_down_cancels_the_attempts_in_flight(tmp_path):
    model = ScriptedModel([], default=slow_searcher)
    options = ToolOptions(docs=demo_docs())
    pool = options.pool()
    agent = ServedAgent(model, pool, settings_for("toolself", max_stages=1, max_steps_per_stage=10_000), tmp_path,
                        collection=options.collection())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uvicorn_server = server(model, port=port, log_level="warning", agent=agent)
    running = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    running.start()
    events: list[str] = []
    try:
        until(lambda: uvicorn_server.started)

        def stream() -> None:
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30, json={
                    "model": AGENT, "stream": True, "messages": [{"role": "user", "content": QUESTION}]}) as response:
                events.extend(line for line in response.iter_lines() if line)

        client = threading.Thread(target=stream, daemon=True)
        client.start()
        until(lambda: len(model.calls) > 3)
        uvicorn_server.should_exit = True
        running.join(timeout=15)
        client.join(timeout=15)
        assert not running.is_alive(), "the server waited for the attempt instead of cancelling it"
    finally:
        uvicorn_server.should_exit = uvicorn_server.force_exit = True
        agent.close()
        pool.close()
        sock.close()
    [trajectory] = read_jsonl(tmp_path / "trajectories.jsonl")
    assert trajectory.end_reason == "budget:cancelled"
    error = json.loads(events[-1].removeprefix("data: "))
    assert "cancelled" in error["error"]["message"] and error["toolself"]["trajectory_id"] == trajectory.id


# -- the command ----------------------------------------------------------------------------------

def test_the_serve_command_checks_its_tool_options_before_loading_a_model(tmp_path):
    config = tmp_path / "tools.json"
    config.write_text(json.dumps({"include": ["search"], "mcpservers": {}}))
    result = CliRunner().invoke(app, ["serve", "--tools-config", str(config), "--model",
                                      "openai:x@http://127.0.0.1:9/v1"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "unknown key 'mcpservers'" in text and "tools.json" in text and "loading the model" not in text


@pytest.mark.slow  # a fresh interpreter importing the agent, openai and starlette: 3-8 s on 2 busy cores
@pytest.mark.timeout(90)
def test_the_serve_command_serves_the_agent_with_its_docs_and_keeps_trajectories_in_out(tmp_path):
    upstream = ScriptedModel(finds_the_maker())
    port = free_port()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
           "TOOLSELF_CACHE": str(tmp_path / "cache")}
    with serving(upstream) as upstream_url:
        process = subprocess.Popen(
            [sys.executable, "-m", "toolself", "serve", "--model", f"openai:upstream@{upstream_url}", "--port",
             str(port), "--docs", str(demo_docs()), "--out", str(tmp_path / "served"), "--max-steps", "3"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            def up() -> bool:
                assert process.poll() is None, process.communicate()[0]
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            until(up, seconds=40)
            with client_for(f"http://127.0.0.1:{port}/v1") as client:
                listed = [m.id for m in client.models.list()]
                completion = ask(client)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=15)
    assert listed == ["openai:upstream", AGENT]
    assert completion.choices[0].message.content == "Brightwater Appliances"
    [trajectory] = read_jsonl(tmp_path / "served" / "trajectories.jsonl")
    assert trajectory.id == completion.model_extra["toolself"]["trajectory_id"]
    assert trajectory.settings["max_steps_per_stage"] == 3


@pytest.mark.slow  # the embedded model through a whole attempt: ~80 s, 1.2 GB on 2 busy cores
@pytest.mark.timeout(420)
def test_the_embedded_model_answers_through_the_agent_endpoint(tmp_path):
    from toolself.models.local import EmbeddedModel
    from toolself.models.spec import SMALL_MODEL

    model = EmbeddedModel.load(dtype="float32", threads=0)
    try:
        budgets = {**SMALL_MODEL.settings(), "max_stages": 1, "max_steps_per_stage": 2, "time_limit": 240}
        with agent_server(model, tmp_path, **budgets) as (url, _), client_for(url, timeout=400) as client:
            completion = ask(client, "Which company makes the Lumen kettle? Search the documents.")
    finally:
        model.close()
    served = completion.model_extra["toolself"]
    assert isinstance(completion.choices[0].message.content, str)
    assert served["stages"] == 1 and completion.usage.completion_tokens > 0
    [trajectory] = read_jsonl(tmp_path / "trajectories.jsonl")
    assert trajectory.id == served["trajectory_id"] and trajectory.model == model.name
