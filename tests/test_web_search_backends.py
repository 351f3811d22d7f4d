"""Each web search backend against a loopback server that answers in that API's documented
format, including its errors: retried on 429 / 5xx / timeouts, stopped on refused keys, and
every failure an observation that names the service, never a crash."""

import json
import time

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.search import search_tool
from toolself.tools.web.http import RetryPolicy
from toolself.tools.web.search_backends import make_backend
from toolself.tools.web.settings import WebSettings
from web_fakes import FakeService, Reply

FAST = RetryPolicy(attempts=3, backoff=0.01, max_delay=0.05, timeout=0.5)
SECRET = "sk-test-secret-0123"


def _serper(q):
    return {"organic": [{"title": f"About {q}", "link": f"https://example.org/{q}", "snippet": "A  snippet.",
                         "position": 1}], "relatedSearches": []}


def _tavily(q):
    return {"query": q, "results": [{"title": f"About {q}", "url": f"https://example.org/{q}",
                                     "content": "A  snippet.", "score": 0.9}], "response_time": 0.1}


def _brave(q):
    return {"query": {"original": q}, "web": {"results": [{"title": f"About {q}", "url": f"https://example.org/{q}",
                                                           "description": "A  snippet."}]}}


def _jina(q):
    return {"code": 200, "status": 20000, "data": [{"title": f"About {q}", "url": f"https://example.org/{q}",
                                                    "description": "A  snippet.", "content": ""}]}


def _searx(q):
    return {"query": q, "number_of_results": 1, "results": [{"title": f"About {q}", "url": f"https://example.org/{q}",
                                                              "content": "A  snippet.", "engine": "x"}],
            "answers": [], "infoboxes": [], "suggestions": []}


# name, key variable, documented answer, where the key travels, how the query travels
BACKENDS = {
    "serper": ("SERPER_API_KEY", _serper, lambda r: r["headers"]["x-api-key"], lambda r: r["body"]["q"]),
    "tavily": ("TAVILY_API_KEY", _tavily, lambda r: r["headers"]["authorization"], lambda r: r["body"]["query"]),
    "brave": ("BRAVE_API_KEY", _brave, lambda r: r["headers"]["x-subscription-token"], lambda r: r["query"]["q"]),
    "jina": ("JINA_API_KEY", _jina, lambda r: r["headers"]["authorization"], lambda r: r["path"].lstrip("/")),
    "searxng": (None, _searx, None, lambda r: r["query"]["q"]),
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("SEARX_HOST", "SERPER_API_KEY", "TAVILY_API_KEY", "BRAVE_API_KEY", "JINA_API_KEY", "JINA_KEY",
                 "TOOLSELF_SEARCH", "TOOLSELF_WEB_CACHE"):
        monkeypatch.delenv(name, raising=False)


def _search(name, url, tmp_path, query="solar wind", cache=None, policy=FAST):
    settings = WebSettings(search=name, search_url=url, cache_dir=cache, retry=policy)
    return search_tool(settings)({"query": query}, ToolContext(workspace=tmp_path))


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, monkeypatch):
    name = request.param
    key_var = BACKENDS[name][0]
    if key_var:
        monkeypatch.setenv(key_var, SECRET)
    return name


def test_each_backend_sends_its_documented_request_and_reads_its_documented_answer(backend, tmp_path):
    key_var, answer, key_of, query_of = BACKENDS[backend]
    service = FakeService([], default=Reply(200, answer("solar wind")))
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert not obs.is_error, obs.content
    assert "1. About solar wind\n   locator: https://example.org/solar wind\n   A snippet." in obs.content
    sent = service.requests[0]
    assert query_of(sent).replace("%20", " ") == "solar wind"
    if key_of:
        assert SECRET in key_of(sent)


def test_a_rate_limit_is_retried_after_the_time_the_service_asks(backend, tmp_path):
    answer = BACKENDS[backend][1]
    service = FakeService([Reply(429, {"error": "too many"}, {"Retry-After": "1"})],
                          default=Reply(200, answer("solar wind")))
    started = time.monotonic()
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert not obs.is_error and "About solar wind" in obs.content
    assert len(service.requests) == 2
    assert time.monotonic() - started >= 1.0


def test_server_errors_are_retried_then_answered(backend, tmp_path):
    answer = BACKENDS[backend][1]
    service = FakeService([Reply(502, "bad gateway"), Reply(503, "busy")], default=Reply(200, answer("solar wind")))
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert not obs.is_error and len(service.requests) == 3


def test_a_service_that_keeps_failing_is_an_observation_naming_it(backend, tmp_path):
    service = FakeService([], default=Reply(500, "down"))
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert obs.is_error and backend in obs.content and "after 3 attempts" in obs.content
    assert len(service.requests) == 3


def test_a_service_that_does_not_answer_in_time_is_an_observation(backend, tmp_path):
    service = FakeService([], default=Reply(200, {}, delay=3.0))
    with service.running() as url:
        obs = _search(backend, url, tmp_path, policy=RetryPolicy(attempts=2, backoff=0.01, timeout=0.3))
    assert obs.is_error and "no answer within 0.3 s" in obs.content


@pytest.mark.parametrize("body", ["<html>rate limit page</html>", {"unexpected": True}, [1, 2]])
def test_a_body_that_is_not_the_documented_json_is_an_observation_naming_the_service(backend, tmp_path, body):
    service = FakeService([], default=Reply(200, body))
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert obs.is_error and obs.content.startswith("search failed: ") and backend in obs.content


def test_a_refused_key_stops_at_once_and_names_the_variable(backend, tmp_path):
    key_var = BACKENDS[backend][0]
    service = FakeService([], default=Reply(403, {"error": "forbidden"}))
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert obs.is_error and "HTTP 403" in obs.content
    assert len(service.requests) == 1
    assert (key_var or "format") in obs.content


def test_a_spent_quota_stops_and_says_so(backend, tmp_path):
    service = FakeService([], default=Reply(402, {"error": "payment required"}))
    with service.running() as url:
        obs = _search(backend, url, tmp_path)
    assert obs.is_error and "quota" in obs.content and len(service.requests) == 1


@pytest.mark.parametrize("name", ["serper", "tavily", "brave", "jina"])
def test_a_missing_key_is_named_before_any_request(name, tmp_path):
    service = FakeService([], default=Reply(200, {}))
    with service.running() as url:
        obs = _search(name, url, tmp_path)
    assert obs.is_error and BACKENDS[name][0] in obs.content
    assert service.requests == []


def test_a_repeated_query_is_answered_from_the_cache_which_holds_no_key(backend, tmp_path):
    answer = BACKENDS[backend][1]
    service = FakeService([], default=Reply(200, answer("solar wind")))
    cache = tmp_path / "cache"
    with service.running() as url:
        first = _search(backend, url, tmp_path, cache=cache)
        second = _search(backend, url, tmp_path, cache=cache)
    assert first.content == second.content and len(service.requests) == 1
    stored = "".join(p.read_text() for p in cache.rglob("*.json"))
    assert "About solar wind" in stored and SECRET not in stored
    assert SECRET not in first.content


def test_the_backend_is_chosen_from_the_environment(monkeypatch):
    monkeypatch.setenv("TAVILY_API_KEY", SECRET)
    assert WebSettings.from_env().search == "tavily"
    monkeypatch.setenv("SEARX_HOST", "http://127.0.0.1:9")
    assert WebSettings.from_env().search == "searxng"
    assert WebSettings.from_env(search="brave").search == "brave"


def test_settings_never_hold_a_key(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", SECRET)
    settings = WebSettings.from_env()
    assert SECRET not in json.dumps(settings.to_dict()) and SECRET not in repr(settings)
    assert SECRET not in repr(make_backend("serper"))


def test_an_unknown_backend_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="brave.*jina.*searxng.*serper.*tavily"):
        WebSettings(search="bing")
