"""`file_analyzer` on images: a PNG, JPEG, GIF or WebP file (known by its bytes) goes with the
goal to the run's vision model as an OpenAI `image_url` data URL, against a loopback server
that answers in the chat-completions format; refusals and failures are clear observations."""

from __future__ import annotations

import base64
import os
import struct
import zlib

import pytest

from test_web_judge import completion
from toolself.evals.preflight import PreflightError, Provided, check
from toolself.evals.task import Task
from toolself.models.base import Message
from toolself.tools.base import ToolContext
from toolself.tools.files import file_analyzer_tool, goal_file_analyzer
from toolself.tools.options import ToolOptions
from toolself.tools.vision import DESCRIBE_GOAL, MAX_IMAGE_BYTES, image_type
from toolself.tools.web.http import RetryPolicy
from toolself.tools.web.settings import WebSettings
from web_fakes import FakeService, Reply

VISION_VARIABLES = ("TOOLSELF_VISION_MODEL", "FILE_ANALYZER_VISION_MODEL", "FILE_ANALYZER_API_BASE_URL")
ANSWER = completion('{"evidence": "The bar for 2019 reads 42.", "summary": "Sales in 2019 were 42."}')
FAST = RetryPolicy(attempts=2, backoff=0.01, max_delay=0.05)


def png() -> bytes:
    """A real 1x1 PNG, written by hand so the test needs no image library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
            + chunk(b"IEND", b""))


JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"


@pytest.fixture(autouse=True)
def _no_vision_from_the_environment(monkeypatch):
    for name in VISION_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ctx():
    context = ToolContext.temporary()
    yield context
    context.close()


def settings(url: str | None) -> WebSettings:
    return WebSettings(vision_model=f"openai:qwen-vl@{url}/v1" if url else None, retry=FAST)


def analyse(ctx, url, path="chart.png", goal="What were the sales in 2019?"):
    return goal_file_analyzer(settings=settings(url))({"path": path, "goal": goal}, ctx)


def parts(request) -> dict[str, list]:
    """The content parts of the one message the vision model was sent, by type."""
    (message,) = request["body"]["messages"]
    found: dict[str, list] = {}
    for part in message["content"]:
        found.setdefault(part["type"], []).append(part)
    return found


def test_an_image_goes_to_the_vision_model_as_a_data_url_with_the_goal(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        obs = analyse(ctx, url)
    (request,) = service.requests
    sent = parts(request)
    assert request["path"] == "/v1/chat/completions" and request["body"]["model"] == "qwen-vl"
    assert sent["image_url"] == [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(png()).decode()}}]
    assert "What were the sales in 2019?" in sent["text"][0]["text"]
    assert not obs.is_error
    assert obs.content == "chart.png\n\nEvidence:\nThe bar for 2019 reads 42.\n\nSummary:\nSales in 2019 were 42."


def test_an_image_is_known_by_its_bytes_whatever_its_name(ctx):
    (ctx.workspace / "scan.dat").write_bytes(JPEG)
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        obs = analyse(ctx, url, path="scan.dat")
    assert not obs.is_error
    assert parts(service.requests[0])["image_url"][0]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_a_text_file_named_like_an_image_is_not_sent_to_the_vision_model(ctx):
    (ctx.workspace / "notes.png").write_text("plain words, not pixels")
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        obs = analyse(ctx, url, path="notes.png")
    assert not obs.is_error and obs.content.startswith("notes.png")
    assert service.requests == []


@pytest.mark.parametrize("head, mime", [(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png"),
                                        (b"\xff\xd8\xff\xdb\x00C", "image/jpeg"),
                                        (b"GIF87a\x01\x00\x01\x00", "image/gif"),
                                        (b"GIF89a\x01\x00\x01\x00", "image/gif"),
                                        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp"),
                                        (b"RIFF\x24\x00\x00\x00WAVEfmt ", None),
                                        (b"%PDF-1.4\n", None), (b"", None)])
def test_images_are_recognised_by_their_signature(head, mime):
    assert image_type(head) == mime


@pytest.mark.parametrize("name, data", [("chart.png", png()), ("notes.txt", b"plain words, not pixels")])
def test_a_file_is_judged_and_read_through_one_opening(ctx, monkeypatch, name, data):
    """Opened twice, a file the model swapped in between could be judged an image and read as
    another (or the reverse)."""
    from toolself.tools.workspace import Workspace

    (ctx.workspace / name).write_bytes(data)
    opened = []
    open_file = Workspace.open_file
    monkeypatch.setattr(Workspace, "open_file", lambda ws, loc: opened.append(loc.shown) or open_file(ws, loc))
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        assert not analyse(ctx, url, path=name).is_error
    assert opened == [name]


def test_without_a_vision_model_the_observation_names_the_option(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    obs = analyse(ctx, None)
    assert obs.is_error
    assert "chart.png is a PNG image" in obs.content and "could not be analysed" in obs.content
    assert "--vision-model openai:NAME@URL" in obs.content


def test_a_rate_limited_vision_model_is_retried(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([Reply(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"})],
                          default=Reply(200, ANSWER))
    with service.running() as url:
        obs = analyse(ctx, url)
    assert not obs.is_error and "Sales in 2019 were 42." in obs.content
    assert len(service.requests) == 2


def test_a_vision_model_that_keeps_failing_is_a_clear_observation(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([], default=Reply(503, {"error": {"message": "overloaded"}}))
    with service.running() as url:
        obs = analyse(ctx, url)
    assert obs.is_error and len(service.requests) == FAST.attempts
    assert "chart.png is a PNG image; the vision model could not analyse it" in obs.content
    assert "HTTP 503: overloaded" in obs.content


def test_a_malformed_answer_is_a_clear_observation(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([], default=Reply(200, "<html>proxy error</html>", content_type="application/json"))
    with service.running() as url:
        obs = analyse(ctx, url)
    assert obs.is_error
    assert "the vision model could not analyse it" in obs.content and "not JSON" in obs.content


def test_an_answer_with_no_choices_is_a_clear_observation(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([], default=Reply(200, {"object": "chat.completion"}))
    with service.running() as url:
        obs = analyse(ctx, url)
    assert obs.is_error and "returned no choices" in obs.content


def test_a_symlink_named_like_an_image_is_refused(ctx, tmp_path):
    outside = tmp_path / "secret.png"
    outside.write_bytes(png())
    os.symlink(outside, ctx.workspace / "photo.png")
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        obs = analyse(ctx, url, path="photo.png")
    assert obs.is_error and "refused" in obs.content and "symbolic link" in obs.content
    assert service.requests == []


def test_an_image_over_the_cap_is_refused(ctx):
    with open(ctx.workspace / "huge.png", "wb") as handle:
        handle.write(png())
        handle.truncate(MAX_IMAGE_BYTES + 1)
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        obs = analyse(ctx, url, path="huge.png")
    assert obs.is_error and f"up to {MAX_IMAGE_BYTES >> 20} MB" in obs.content
    assert service.requests == []


def test_an_image_read_once_is_served_from_the_runs_web_cache_the_next_time(ctx, tmp_path):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        cached = WebSettings(vision_model=f"openai:qwen-vl@{url}/v1", retry=FAST, cache_dir=tmp_path / "web")
        first, again = (goal_file_analyzer(settings=cached)({"path": "chart.png", "goal": "Sales in 2019?"}, ctx)
                        for _ in range(2))
        assert len(service.requests) == 1 and again.content == first.content and not again.is_error
        goal_file_analyzer(settings=cached)({"path": "chart.png", "goal": "Sales in 2020?"}, ctx)
        (ctx.workspace / "chart.png").write_bytes(JPEG)  # another image under the same name
        goal_file_analyzer(settings=cached)({"path": "chart.png", "goal": "Sales in 2019?"}, ctx)
    assert len(service.requests) == 3  # a new goal and a new image are read anew


def test_without_a_goal_the_image_is_described(ctx):
    (ctx.workspace / "chart.png").write_bytes(png())
    service = FakeService([], default=Reply(200, ANSWER))
    with service.running() as url:
        obs = file_analyzer_tool(settings(url))({"path": "chart.png"}, ctx)
    assert DESCRIBE_GOAL in parts(service.requests[0])["text"][0]["text"]
    assert not obs.is_error and "The bar for 2019 reads 42." in obs.content


def test_a_message_with_images_carries_them_as_content_parts():
    wire = Message("user", "What is this?", images=["data:image/gif;base64,R0lG"]).to_openai()
    assert wire["content"] == [{"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lG"}},
                               {"type": "text", "text": "What is this?"}]
    assert Message("user", "plain").to_openai()["content"] == "plain"
    assert "images" not in Message("user", "plain").to_dict()


def test_the_vision_model_is_an_option_recorded_and_bound_to_the_tool():
    options = ToolOptions.parse(vision_model="openai:qwen-vl@http://127.0.0.1:9/v1", tools="file_analyzer")
    assert options.to_dict()["web"]["vision_model"] == "openai:qwen-vl@http://127.0.0.1:9/v1"
    assert ToolOptions.from_dict(options.to_dict()).web.vision_model == options.web.vision_model
    pool = options.pool()
    try:
        assert pool["file_analyzer"].fn.__self__.settings.vision_model == options.web.vision_model
    finally:
        pool.close()
    with pytest.raises(ValueError, match="--vision-model takes openai:NAME@URL"):
        ToolOptions.parse(vision_model="qwen-vl")


def test_the_vision_model_comes_from_the_official_variables():
    env = {"FILE_ANALYZER_VISION_MODEL": "Qwen/Qwen3-VL-30B-A3B-Instruct",
           "FILE_ANALYZER_API_BASE_URL": "http://127.0.0.1:8001/v1"}
    assert WebSettings.from_env(env).vision_model == "openai:Qwen/Qwen3-VL-30B-A3B-Instruct@http://127.0.0.1:8001/v1"
    assert WebSettings.from_env({**env, "TOOLSELF_VISION_MODEL": "openai:v@http://h/v1"}).vision_model == \
        "openai:v@http://h/v1"


def test_the_preflight_asks_for_a_vision_model_for_an_image_attachment(tmp_path):
    (tmp_path / "photo.jpg").write_bytes(JPEG)
    task = Task(id="g", question="q", answer="1", family="gaia", files=[tmp_path / "photo.jpg"],
                documents=[{"id": "a", "title": "A", "text": "x"}])
    tools = frozenset({"file_analyzer"})
    with pytest.raises(PreflightError, match=r"photo.jpg is an image and there is no --vision-model.*"
                                             r"--vision-model openai:NAME@URL"):
        check({"gaia:G": [task]}, Provided(tools, WebSettings(), False))
    assert check({"gaia:G": [task]}, Provided(tools, WebSettings(vision_model="openai:v@http://h/v1"), False)) == []
