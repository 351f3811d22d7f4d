"""Several servers of one model, shared round-robin with a limit on requests in flight at each;
specified against real `toolself serve` servers on loopback."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from toolself.models import load_model
from toolself.models.base import Message
from toolself.models.endpoints import DEFAULT_LIMIT, Endpoint, RoundRobinModel, parse_endpoints
from toolself.models.openai_compat import OpenAIModel
from toolself.models.scripted import ScriptedModel

from http_fixtures import InFlight, serving

HELLO = [Message("user", "hello")]


def two_servers(a: InFlight, b: InFlight):
    return serving(ScriptedModel([], default=a)), serving(ScriptedModel([], default=b))


def test_a_spec_lists_servers_with_optional_limits():
    name, endpoints = parse_endpoints("openai:Qwen/Qwen3-8B@http://gpu0:8000/v1#16, http://gpu1:8000/v1/")
    assert name == "Qwen/Qwen3-8B"
    assert endpoints == [Endpoint("http://gpu0:8000/v1", 16), Endpoint("http://gpu1:8000/v1", DEFAULT_LIMIT)]


def test_copies_built_from_one_spec_start_their_rounds_at_different_servers():
    firsts = {RoundRobinModel([object(), object(), object()], [1, 1, 1])._acquire(None, set()) for _ in range(60)}
    assert firsts == {0, 1, 2}


@pytest.mark.parametrize("spec, message", [
    ("openai:m@http://a/v1,ftp://b", "must start with http"),
    ("openai:m@http://a/v1#x,http://b/v1", "whole number"),
    ("openai:m@http://a/v1#0,http://b/v1", "at least 1"),
    ("openai:m@http://a/v1,http://a/v1", "names a server twice"),
])
def test_a_malformed_multi_server_spec_says_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_endpoints(spec)


def test_load_model_shares_a_comma_separated_spec_across_its_servers():
    model = load_model("openai:m@http://127.0.0.1:1/v1,http://127.0.0.1:2/v1#3", temperature=0.5)
    assert isinstance(model, RoundRobinModel)
    assert [m.base_url for m in model.models] == ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    assert model.limits == [DEFAULT_LIMIT, 3] and all(m.temperature == 0.5 for m in model.models)
    assert isinstance(load_model("openai:m@http://127.0.0.1:1/v1"), OpenAIModel)


def test_calls_without_a_session_alternate_between_servers():
    a, b = InFlight(0.0, "a"), InFlight(0.0, "b")
    first, second = two_servers(a, b)
    with first as url_a, second as url_b:
        model = RoundRobinModel([OpenAIModel("m", url_a), OpenAIModel("m", url_b)], [4, 4])
        answers = [model.complete(HELLO).message.content for _ in range(6)]
    assert answers[0::2] == [answers[0]] * 3 and answers[1::2] == [answers[1]] * 3 and answers[0] != answers[1]
    assert (a.total, b.total) == (3, 3)


def test_no_server_gets_more_requests_in_flight_than_its_limit():
    a, b = InFlight(0.2, "a"), InFlight(0.2, "b")
    first, second = two_servers(a, b)
    with first as url_a, second as url_b:
        model = RoundRobinModel([OpenAIModel("m", url_a), OpenAIModel("m", url_b)], [1, 2])
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: model.complete(HELLO).message.content, range(9)))
    assert len(answers) == 9 and a.total + b.total == 9
    assert a.peak == 1 and b.peak == 2
    assert model.in_flight == [0, 0] and sum(model.served) == 9


def test_an_episode_stays_on_the_server_that_took_its_first_call():
    a, b = InFlight(0.0, "a"), InFlight(0.0, "b")
    first, second = two_servers(a, b)
    with first as url_a, second as url_b:
        model = RoundRobinModel([OpenAIModel("m", url_a), OpenAIModel("m", url_b)], [4, 4])
        one = {model.complete(HELLO, session="episode-1").message.content for _ in range(4)}
        two = {model.complete(HELLO, session="episode-2").message.content for _ in range(4)}
        model.end_session("episode-1")
    assert len(one) == 1 and len(two) == 1 and one != two
    assert "episode-1" not in model._sessions


def test_a_call_a_dead_server_fails_is_answered_by_another():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    b = InFlight(0.0, "b")
    with serving(ScriptedModel([], default=b)) as url_b:
        model = RoundRobinModel([OpenAIModel("m", dead, max_retries=0), OpenAIModel("m", url_b)], [4, 4])
        answers = [model.complete(HELLO, session=f"e{i}").message.content for i in range(4)]
    assert answers == ["b"] * 4 and b.total == 4
