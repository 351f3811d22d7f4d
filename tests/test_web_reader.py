"""`visit` reading web pages through a Jina-Reader-style service, directly, and with a
summariser model given the page and the visit's goal; each against a loopback server,
including its failures."""

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.visit import visit_tool
from toolself.tools.web.http import RetryPolicy
from toolself.tools.web.settings import WebSettings
from test_web_judge import completion
from web_fakes import FakeService, Reply

FAST = RetryPolicy(attempts=3, backoff=0.01, max_delay=0.05, timeout=0.5)
PAGE = "http://93.184.216.34/comets"  # a public address: the reader is asked for it without DNS
SECRET = "jina_test_secret_42"


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in ("JINA_API_KEY", "JINA_KEY", "JINA_READER_URL", "TOOLSELF_VISIT_PRIVATE", "TOOLSELF_ONLINE",
                 "SEARX_HOST", "VISIT_LLM_MODEL", "VISIT_LLM_API_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JINA_API_KEY", SECRET)


def read(url, tmp_path, locator=PAGE, cache=None, **arguments):
    settings = WebSettings(reader="jina", reader_url=url, cache_dir=cache, retry=FAST,
                           visit_model=arguments.pop("visit_model", None))
    return visit_tool(settings)({"locator": locator, **arguments}, ToolContext(workspace=tmp_path))


JSON_PAGE = {"code": 200, "status": 20000,
             "data": {"title": "Comet News", "url": PAGE, "content": "A bright comet was seen over Lisbon on 3 May."}}


def test_the_reader_is_asked_for_the_page_with_the_key_and_its_json_is_read(tmp_path):
    service = FakeService([], default=Reply(200, JSON_PAGE))
    with service.running() as url:
        obs = read(url, tmp_path)
    assert not obs.is_error and obs.content.startswith("# Comet News\nlocator: " + PAGE)
    assert "seen over Lisbon" in obs.content
    sent = service.requests[0]
    assert sent["path"] in ("/" + PAGE, "/" + PAGE.replace("//", "/"))
    assert sent["headers"]["authorization"] == f"Bearer {SECRET}"
    assert sent["headers"]["accept"] == "application/json"


def test_the_readers_markdown_answer_is_read_too(tmp_path):
    text = f"Title: Comet News\nURL Source: {PAGE}\n\nMarkdown Content:\nA bright comet over Lisbon."
    service = FakeService([], default=Reply(200, text, content_type="text/plain"))
    with service.running() as url:
        obs = read(url, tmp_path)
    assert "# Comet News" in obs.content and "A bright comet over Lisbon." in obs.content
    assert "Markdown Content" not in obs.content


def test_a_rate_limited_reader_is_retried(tmp_path):
    service = FakeService([Reply(429, "slow", {"Retry-After": "0"}), Reply(502, "bad")], default=Reply(200, JSON_PAGE))
    with service.running() as url:
        obs = read(url, tmp_path)
    assert not obs.is_error and len(service.requests) == 3


@pytest.mark.parametrize("reply", [Reply(500, "down"), Reply(200, {"code": 200, "data": None}),
                                   Reply(200, "{not json", content_type="application/json"),
                                   Reply(200, JSON_PAGE, delay=2.0)])
def test_a_failing_reader_is_an_observation_naming_it(tmp_path, reply):
    service = FakeService([], default=reply)
    with service.running() as url:
        obs = read(url, tmp_path)
    assert obs.is_error and "reader service" in obs.content


def test_a_page_read_once_is_kept_in_the_run_cache_without_the_key(tmp_path):
    service = FakeService([], default=Reply(200, JSON_PAGE))
    cache = tmp_path / "cache"
    with service.running() as url:
        first = read(url, tmp_path, cache=cache)
        second = read(url, tmp_path, cache=cache)
    assert first.content == second.content and len(service.requests) == 1
    stored = "".join(p.read_text() for p in cache.rglob("*.json"))
    assert "Lisbon" in stored and SECRET not in stored


def test_the_reader_is_not_asked_for_a_private_address(tmp_path):
    service = FakeService([], default=Reply(200, JSON_PAGE))
    with service.running() as url:
        obs = read(url, tmp_path, locator="http://10.0.0.8/admin")
    assert obs.is_error and "private or local" in obs.content and service.requests == []


def test_the_summariser_gets_the_page_and_the_goal_and_its_extract_comes_back(tmp_path):
    reader = FakeService([], default=Reply(200, JSON_PAGE))
    model = FakeService([], default=Reply(200, completion("Seen over Lisbon on 3 May.")))
    with reader.running() as reader_url, model.running() as model_url:
        obs = read(reader_url, tmp_path, goal="when was the comet seen", visit_model=f"openai:summ@{model_url}/v1")
    assert "parts relevant to the goal 'when was the comet seen'" in obs.content
    assert obs.content.rstrip().endswith("Seen over Lisbon on 3 May.")
    prompt = model.requests[0]["body"]["messages"][-1]["content"]
    assert prompt.startswith("Goal: when was the comet seen") and "A bright comet was seen over Lisbon" in prompt
    assert model.requests[0]["body"]["model"] == "summ"


def test_a_failing_summariser_leaves_the_page_itself(tmp_path, monkeypatch):
    import toolself.tools.visit as visit_module

    monkeypatch.setattr(visit_module, "SUMMARISER_RETRIES", 1)
    reader = FakeService([], default=Reply(200, JSON_PAGE))
    model = FakeService([], default=Reply(200, "<html>not a completion</html>"))
    with reader.running() as reader_url, model.running() as model_url:
        obs = read(reader_url, tmp_path, goal="when", visit_model=f"openai:summ@{model_url}/v1")
    assert not obs.is_error and "extraction failed" in obs.content and "seen over Lisbon" in obs.content


def test_without_a_summariser_or_goal_the_page_is_paginated(tmp_path):
    long_page = {"data": {"title": "Long", "url": PAGE, "content": "\n\n".join("word " * 200 for _ in range(20))}}
    service = FakeService([], default=Reply(200, long_page))
    with service.running() as url:
        obs = read(url, tmp_path)
    assert "page 1 of " in obs.content and "page=2" in obs.content


def test_the_direct_reader_keeps_a_pages_main_text(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLSELF_VISIT_PRIVATE", "1")
    html = ("<html><head><title>Comet News</title></head><body><nav>Home</nav><article><p>"
            + "A bright comet was seen over Lisbon on 3 May. " * 20 + "</p></article></body></html>")
    service = FakeService([], default=Reply(200, html, content_type="text/html"))
    with service.running() as url:
        settings = WebSettings(online=True, retry=FAST)
        obs = visit_tool(settings)({"locator": f"{url}/comets"}, ToolContext(workspace=tmp_path))
    assert "# Comet News" in obs.content and "seen over Lisbon" in obs.content


def test_the_visit_model_comes_from_the_official_variables(monkeypatch):
    monkeypatch.setenv("VISIT_LLM_MODEL", "qwen")
    monkeypatch.setenv("VISIT_LLM_API_BASE_URL", "http://127.0.0.1:8001/v1")
    assert WebSettings.from_env().visit_model == "openai:qwen@http://127.0.0.1:8001/v1"


def test_the_direct_reader_turns_a_pdf_page_into_text(tmp_path, monkeypatch):
    from test_tool_files import make_pdf

    monkeypatch.setenv("TOOLSELF_VISIT_PRIVATE", "1")
    make_pdf(tmp_path / "treaty.pdf", "The treaty was signed in 1648.")
    pdf = (tmp_path / "treaty.pdf").read_bytes()
    service = FakeService([], default=Reply(200, pdf, content_type="application/pdf"))
    with service.running() as url:
        obs = visit_tool(WebSettings(online=True, retry=FAST))({"locator": f"{url}/treaty.pdf"},
                                                               ToolContext(workspace=tmp_path))
    assert not obs.is_error, obs.content
    assert "# treaty.pdf" in obs.content and "The treaty was signed in 1648." in obs.content


def test_a_rate_limited_or_failing_summariser_is_retried(tmp_path):
    reader = FakeService([], default=Reply(200, JSON_PAGE))
    model = FakeService([Reply(429, {"error": {"message": "slow"}}, {"Retry-After": "0"}), Reply(503, "busy")],
                        default=Reply(200, completion("Seen on 3 May.")))
    with reader.running() as reader_url, model.running() as model_url:
        obs = read(reader_url, tmp_path, goal="when", visit_model=f"openai:summ@{model_url}/v1")
    assert obs.content.rstrip().endswith("Seen on 3 May.") and len(model.requests) == 3
