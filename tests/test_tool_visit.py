"""`visit`: local documents by locator or close title, web pages when online, pagination, goals."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from toolself.models.scripted import ScriptedModel
from toolself.tools.base import ToolContext
from toolself.tools.collection import Collection, Document
from toolself.tools.visit import PAGE_CHARS, paginate, visit

LONG = "\n\n".join(f"Paragraph {i}: " + "words " * 150 for i in range(40))


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    monkeypatch.delenv("SEARX_HOST", raising=False)
    monkeypatch.delenv("TOOLSELF_ONLINE", raising=False)
    docs = [Document("wiki/ada.txt", "Ada Lovelace", "Ada Lovelace wrote the first published algorithm in 1843."),
            Document("wiki/alan.txt", "Alan Turing", "Alan Turing proposed the Turing machine in 1936."),
            Document("wiki/alan-kay.txt", "Alan Kay", "Alan Kay worked on Smalltalk."),
            Document("long.txt", "A long report", LONG)]
    return ToolContext(workspace=tmp_path, collection=Collection.from_documents(docs))


@pytest.fixture
def web(monkeypatch):
    pages = {
        "/article": ("text/html; charset=utf-8",
                     "<html><head><title>Comet News</title></head><body><nav>Home | About</nav>"
                     "<article><h1>Comet seen</h1><p>" + "A bright comet was seen over Lisbon on 3 May. " * 20
                     + "</p></article><script>track()</script></body></html>"),
        "/plain": ("text/plain", "Just plain text."),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path not in pages:
                self.send_response(404)
                self.end_headers()
                return
            kind, body = pages[self.path]
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("TOOLSELF_ONLINE", "1")
    monkeypatch.setenv("TOOLSELF_VISIT_PRIVATE", "1")  # the test server is on loopback
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_exact_locator_returns_the_document(ctx):
    obs = visit({"locator": "wiki/ada.txt"}, ctx)
    assert not obs.is_error
    assert obs.content.startswith("# Ada Lovelace\nlocator: wiki/ada.txt")
    assert "first published algorithm" in obs.content


def test_unique_title_match_is_accepted(ctx):
    assert "Turing machine" in visit({"locator": "Alan Turing"}, ctx).content
    assert "Turing machine" in visit({"locator": "wiki/alan.tx"}, ctx).content


def test_ambiguous_locator_lists_near_matches(ctx):
    obs = visit({"locator": "wiki/alan"}, ctx)
    assert obs.is_error
    assert "wiki/alan.txt" in obs.content and "wiki/alan-kay.txt" in obs.content


def test_unknown_locator_points_to_search(ctx):
    obs = visit({"locator": "zzzz"}, ctx)
    assert obs.is_error and "search" in obs.content


def test_long_document_is_paginated_with_directions(ctx):
    first = visit({"locator": "long.txt"}, ctx).content
    pages = paginate(LONG)
    assert len(pages) > 2 and all(len(p) <= PAGE_CHARS for p in pages)
    assert f"page 1 of {len(pages)}" in first
    assert "page=2" in first
    last = visit({"locator": "long.txt", "page": len(pages)}, ctx).content
    assert "Paragraph 39" in last and "to read on" not in last


def test_pages_cover_the_whole_text():
    assert "".join(paginate(LONG)).replace("\n", "").replace(" ", "") == LONG.replace("\n", "").replace(" ", "")


def test_page_out_of_range_is_an_error_observation(ctx):
    obs = visit({"locator": "wiki/ada.txt", "page": 3}, ctx)
    assert obs.is_error and "1 page" in obs.content
    assert visit({"locator": "wiki/ada.txt", "page": 0}, ctx).is_error


def test_goal_asks_the_model_for_the_relevant_parts(ctx):
    def extract(messages, tools):
        prompt = messages[-1].content
        assert "Goal: year of the algorithm" in prompt
        return next(s for s in prompt.split("\n") if "1843" in s)

    ctx.model = ScriptedModel([extract])
    obs = visit({"locator": "wiki/ada.txt", "goal": "year of the algorithm"}, ctx)
    assert "relevant to the goal" in obs.content
    assert "1843" in obs.content


def test_goal_without_a_model_returns_the_page(ctx):
    assert "1843" in visit({"locator": "wiki/ada.txt", "goal": "year"}, ctx).content


def test_failing_model_falls_back_to_the_page(ctx):
    ctx.model = ScriptedModel([])
    obs = visit({"locator": "wiki/ada.txt", "goal": "year"}, ctx)
    assert not obs.is_error and "extraction failed" in obs.content and "1843" in obs.content


def test_url_is_refused_when_offline(ctx):
    obs = visit({"locator": "https://example.org/"}, ctx)
    assert obs.is_error and "offline" in obs.content


def test_url_main_text_is_extracted_when_online(web, tmp_path):
    obs = visit({"locator": f"{web}/article"}, ToolContext(workspace=tmp_path))
    assert not obs.is_error
    assert "# Comet News" in obs.content
    assert "bright comet was seen over Lisbon" in obs.content
    assert "track()" not in obs.content


def test_plain_text_url(web, tmp_path):
    assert "Just plain text." in visit({"locator": f"{web}/plain"}, ToolContext(workspace=tmp_path)).content


def test_missing_page_is_an_error_observation(web, tmp_path):
    obs = visit({"locator": f"{web}/nope"}, ToolContext(workspace=tmp_path))
    assert obs.is_error and "404" in obs.content


def test_private_and_local_addresses_are_refused_online(web, tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLSELF_VISIT_PRIVATE")
    context = ToolContext(workspace=tmp_path)
    for url in (f"{web}/article", "http://169.254.169.254/latest/meta-data/", "http://localhost:9/", "http://[::1]/", "http://10.0.0.8/"):
        obs = visit({"locator": url}, context)
        assert obs.is_error and "refused" in obs.content and "private or local" in obs.content, url
