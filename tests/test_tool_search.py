"""`search`: local collection by default, SearxNG's JSON API when SEARX_HOST is set."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.collection import Collection, Document
from toolself.tools.search import search


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    monkeypatch.delenv("SEARX_HOST", raising=False)
    docs = [Document("paris", "Paris", "Paris is the capital of France, on the Seine."),
            Document("berlin", "Berlin", "Berlin is the capital of Germany, on the Spree."),
            Document("seine", "Seine river", "The Seine flows through Paris to the English Channel.")]
    return ToolContext(workspace=tmp_path, collection=Collection.from_documents(docs))


@pytest.fixture
def searx(monkeypatch):
    """A real HTTP server answering like SearxNG's `/search?format=json`."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlparse(self.path)
            params = parse_qs(url.query)
            seen.append(params)
            if url.path != "/search" or params.get("format") != ["json"]:
                self.send_response(403)
                self.end_headers()
                return
            q = params["q"][0]
            body = {"query": q, "results": [
                {"url": f"https://example.org/{q.replace(' ', '-')}", "title": f"About {q}", "content": f"All on  {q}.", "score": 2.0},
                {"url": "https://example.org/shared", "title": "Shared page", "content": "Common.", "score": 1.0},
            ]}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("SEARX_HOST", f"http://127.0.0.1:{server.server_port}")
    yield seen
    server.shutdown()
    server.server_close()


def test_one_query_lists_title_locator_and_snippet(ctx):
    obs = search({"query": "capital of Germany"}, ctx)
    assert not obs.is_error
    first = obs.content.splitlines()[0]
    assert first == "1. Berlin"
    assert "locator: berlin" in obs.content
    assert "capital of Germany" in obs.content


def test_several_queries_are_deduplicated_by_locator(ctx):
    obs = search({"query": ["Paris France", "Seine Paris"]}, ctx)
    assert obs.content.count("locator: paris\n") == 1
    assert obs.content.count("locator: seine\n") == 1
    assert 'Results for "Seine Paris"' in obs.content


def test_nothing_matches_says_so(ctx):
    obs = search({"query": "quantum chromodynamics"}, ctx)
    assert not obs.is_error
    assert obs.content.startswith('No results for "quantum chromodynamics"')


def test_empty_query_is_an_error_observation(ctx):
    obs = search({"query": "  "}, ctx)
    assert obs.is_error and "empty" in obs.content


def test_wrong_argument_type_is_named(ctx):
    obs = search({"query": 42}, ctx)
    assert obs.is_error and "query" in obs.content


def test_no_backend_is_an_error_observation(tmp_path, monkeypatch):
    monkeypatch.delenv("SEARX_HOST", raising=False)
    obs = search({"query": "anything"}, ToolContext(workspace=tmp_path))
    assert obs.is_error and "SEARX_HOST" in obs.content


def test_web_backend_reads_searxng_json(searx, tmp_path):
    obs = search({"query": ["solar wind", "comet tail"]}, ToolContext(workspace=tmp_path))
    assert not obs.is_error
    assert "About solar wind" in obs.content and "locator: https://example.org/solar-wind" in obs.content
    assert obs.content.count("https://example.org/shared") == 1
    assert [p["q"] for p in searx] == [["solar wind"], ["comet tail"]]


def test_collection_takes_precedence_over_the_web(searx, ctx):
    search({"query": "Paris"}, ctx)
    assert searx == []


def test_unreachable_search_service_is_an_error_observation(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARX_HOST", "http://127.0.0.1:9")
    obs = search({"query": "x"}, ToolContext(workspace=tmp_path))
    assert obs.is_error and "could not be reached" in obs.content


def test_the_runs_collection_serves_tasks_without_their_own(tmp_path, monkeypatch):
    from toolself.tools.search import search_tool
    from toolself.tools.visit import visit_tool
    from toolself.tools.web.settings import WebSettings

    monkeypatch.delenv("SEARX_HOST", raising=False)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "lane.md").write_text("# Harriet Lane\n\nHarriet Lane was the niece of James Buchanan.")
    settings = WebSettings()
    context = ToolContext(workspace=tmp_path)
    found = search_tool(settings, docs)({"query": "Buchanan niece"}, context)
    assert not found.is_error and "locator: lane.md" in found.content
    assert "niece of James Buchanan" in visit_tool(settings, docs)({"locator": "lane.md"}, context).content
