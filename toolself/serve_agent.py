"""The ToolSelf agent as a model of `toolself serve`.

A chat completion addressed to the agent's name (`toolself:METHOD`) runs one whole attempt
of the agent loop, as `toolself run` makes it (the same `Agent`, settings and tool pool), on
the request's last user message, in a fresh sandboxed workspace, and answers with the
attempt's final answer. Earlier messages are not shown to the agent: each request is one task.

The trajectory is appended to `OUT/trajectories.jsonl`, which `toolself view OUT` opens, and
the reply says which one it is: the `X-Toolself-Trajectory` header holds its id, and the
body's `toolself` field (`Served`) its id, file, end reason, stages and actions.

A streamed reply shows the attempt as it runs: the attempt's id, each stage's configuration
and each action come as `reasoning_content` deltas (where reasoning models put their
thinking, so a client that reads only `content` gets only the answer), then the answer as
`content`; the last chunk carries the `toolself` field (a stream's headers leave before the
attempt has an id, so they carry none).

At most `concurrency` attempts run at once; later requests wait their turn. A client that goes
away and a server that shuts down cancel the attempt through the loop's cancel event: it ends
as `budget:cancelled` and its trajectory is kept. A request field the agent cannot honour
(tools, sampling, a response format, stop sequences, a token limit: the agent's are the
server's settings) is refused with a 400, as the model endpoint refuses what it cannot honour;
an attempt that fails is a 500 in OpenAI's error format, and the server serves on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from toolself.agent import Agent, AgentSettings, Observer, interrupted_attempt
from toolself.evals.records import TRAJECTORIES
from toolself.models.base import ChatModel
from toolself.progress import call_arguments
from toolself.serve_wire import ChatRequest, error_body, error_response, usage_body
from toolself.tools.base import ToolContext, ToolPool
from toolself.trajectory import Stage, Step, Trajectory, write_jsonl

log = logging.getLogger(__name__)

HEADER = "X-Toolself-Trajectory"
# Request fields that would change a plain model's reply but mean nothing to an attempt.
REFUSED = ("tools", "tool_choice", "response_format", "stop", "max_tokens", "max_completion_tokens",
           "temperature", "top_p", "seed")
# How often a request that waits for its attempt looks whether its client is still there.
DISCONNECT_POLL_S = 0.25


@dataclass(frozen=True)
class Served:
    """What a reply says about its attempt: the body's `toolself` field."""

    trajectory_id: str
    trajectory_file: str
    end_reason: str
    stages: int
    actions: int

    @classmethod
    def of(cls, trajectory: Trajectory, file: Path) -> "Served":
        return cls(trajectory.id, str(file.resolve()), trajectory.end_reason, len(trajectory.stages),
                   trajectory.num_steps)


class NotStarted(Exception):
    """An attempt cancelled while it waited its turn: nothing ran, nothing is saved."""


def _short(text: str, width: int = 160) -> str:
    return textwrap.shorten(str(text), width, placeholder=" …") or "(empty)"


class _Progress(Observer):
    """An attempt's progress as lines on the event loop's queue, from the attempt's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop, self.queue = loop, queue

    def say(self, line: str) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, line)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None:
        c = stage.configuration
        head = f"attempt {trajectory.id}\n" if stage.index == 0 else ""
        self.say(f"{head}stage {stage.index + 1}: {_short(c.subgoal, 300)}\n"
                 f"  tools: {', '.join(c.toolbox) or '(none)'}; context: {c.context_mode}\n")

    def step(self, trajectory: Trajectory, stage: Stage, step: Step) -> None:
        args = call_arguments(step)
        self.say(f"  {len(stage.steps)}. {step.tool or '?'} {_short(args, 120)}\n"
                 f"    -> {_short(step.observation)}\n")


@dataclass
class _Attempt:
    """One request's attempt: its id, cancel event and (once started) its future."""

    task: str
    id: str
    cancel: threading.Event
    future: asyncio.Future | None = None
    created: int = 0


class ServedAgent:
    """The agent endpoint `toolself.serve.create_app` routes requests named `name` to.

    `model`, `pool` and `settings` are the agent's, built as `toolself run` builds them;
    `collection` is the `--docs` collection each attempt's tools read. The pool belongs to
    the caller, who closes it after `close()`."""

    def __init__(self, model: ChatModel, pool: ToolPool, settings: AgentSettings, out: Path,
                 name: str | None = None, concurrency: int = 2, collection: Any = None,
                 preset: str | None = None, config_model: ChatModel | None = None):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.model, self.pool, self.settings, self.collection = model, pool, settings, collection
        self.config_model = config_model  # `decoupled`'s configuration writer
        self.name = name or f"toolself:{settings.method}"
        self.file = Path(out) / TRAJECTORIES
        self.preset = preset
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="toolself-agent")
        self._lock = threading.Lock()  # the file's appends and the set of running attempts
        self._running: set[threading.Event] = set()
        self._closing = False

    def model_entry(self, created: int) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": created, "owned_by": "toolself",
                "toolself": {"kind": "agent", "method": self.settings.method, "preset": self.preset,
                             "policy": getattr(self.model, "name", type(self.model).__name__)}}

    def cancel_all(self) -> None:
        """Cancel every attempt, and refuse new ones: the server is shutting down."""
        with self._lock:
            self._closing = True
            for cancel in self._running:
                cancel.set()

    def close(self) -> None:
        self.cancel_all()
        self._executor.shutdown(wait=True, cancel_futures=True)

    # -- a request ------------------------------------------------------------------------------

    async def respond(self, request: Request, req: ChatRequest) -> Response:
        refused = [f for f in REFUSED if getattr(req, f) is not None]
        if refused:
            return error_response(400, f"{refused[0]}: the agent {self.name} runs with the server's own settings "
                                       f"and does not take {', '.join(refused)}", param=refused[0])
        users = [m.text().strip() for m in req.messages if m.role == "user"]
        if not users or not users[-1]:
            return error_response(400, "messages: the agent's task is the last user message, and there is none",
                                  param="messages")
        if self._closing:
            return error_response(503, "the server is shutting down", type_="server_error")
        attempt = _Attempt(users[-1], "chatcmpl-" + uuid.uuid4().hex, threading.Event(), created=int(time.time()))
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(self._events(attempt, include_usage), media_type="text/event-stream")
        self._start(attempt, Observer())
        try:
            trajectory = await self._outlive_client(request, attempt)
        except NotStarted as exc:
            return error_response(503, str(exc), type_="server_error")
        except Exception as exc:
            return error_response(500, f"the attempt failed: {type(exc).__name__}: {exc}", type_="server_error")
        status, body = self._reply(attempt, trajectory)
        return JSONResponse(body, status_code=status, headers={HEADER: trajectory.id})

    def _start(self, attempt: _Attempt, observer: Observer) -> None:
        with self._lock:
            self._running.add(attempt.cancel)
            if self._closing:  # it came in as the server began to shut down
                attempt.cancel.set()
        attempt.future = asyncio.get_running_loop().run_in_executor(self._executor, self._run, attempt, observer)
        attempt.future.add_done_callback(lambda future: self._forget(attempt, future))

    def _forget(self, attempt: _Attempt, future: asyncio.Future) -> None:
        """Drop a finished attempt, logging a failure (whether or not its client still waits)."""
        with self._lock:
            self._running.discard(attempt.cancel)
        failure = None if future.cancelled() else future.exception()
        if failure is not None and not isinstance(failure, NotStarted):
            log.error("the attempt of %s failed", attempt.id, exc_info=failure)

    def _run(self, attempt: _Attempt, observer: Observer) -> Trajectory:
        """The attempt, in a worker thread; its trajectory is saved whether or not anyone waits for it."""
        if attempt.cancel.is_set():
            raise NotStarted("the attempt was cancelled before it started: its client left or the server is "
                             "shutting down")
        ctx = ToolContext.temporary(collection=self.collection, model=self.model)
        try:
            agent = Agent(self.model, self.pool, self.settings, config_model=self.config_model, observer=observer)
            trajectory = agent.run(attempt.task, ctx, task_id=attempt.id, metadata={"served_as": self.name},
                                   cancel=attempt.cancel)
        except (KeyboardInterrupt, SystemExit) as exc:  # from a model: never out of a worker thread
            trajectory = interrupted_attempt(exc)
            if trajectory is None:
                raise RuntimeError(f"the attempt was interrupted by {type(exc).__name__}") from None
        finally:
            ctx.close()
        with self._lock:
            write_jsonl(self.file, [trajectory])
        return trajectory

    async def _outlive_client(self, request: Request, attempt: _Attempt) -> Trajectory:
        """The attempt's trajectory; a client that goes away cancels it (it is still saved)."""
        future = attempt.future
        assert future is not None
        try:
            while not future.done():
                await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
                if not future.done() and not attempt.cancel.is_set() and await request.is_disconnected():
                    attempt.cancel.set()
        finally:  # the server cancelled this request
            if not future.done():
                attempt.cancel.set()
        return future.result()

    def _reply(self, attempt: _Attempt, trajectory: Trajectory) -> tuple[int, dict[str, Any]]:
        """The HTTP status and body for a finished attempt: its answer, or an OpenAI error."""
        served = asdict(Served.of(trajectory, self.file))
        if trajectory.end_reason in ("error", "interrupted"):
            last = (trajectory.error or trajectory.end_reason).strip().splitlines()[-1]
            return 500, {**error_body(f"the attempt failed: {last}", "server_error"), "toolself": served}
        if trajectory.end_reason == "budget:cancelled":
            why = "the attempt was cancelled: its client left or the server is shutting down"
            return 503, {**error_body(why, "server_error"), "toolself": served}
        finish = "stop" if trajectory.end_reason == "terminate" else "length"
        choice = {"index": 0, "message": {"role": "assistant", "content": trajectory.answer},
                  "finish_reason": finish, "logprobs": None}
        return 200, {"id": attempt.id, "object": "chat.completion", "created": attempt.created, "model": self.name,
                     "choices": [choice], "usage": usage_body(trajectory.usage), "toolself": served}

    async def _events(self, attempt: _Attempt, include_usage: bool) -> AsyncIterator[str]:
        base = {"id": attempt.id, "object": "chat.completion.chunk", "created": attempt.created, "model": self.name}

        def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return f"data: {json.dumps({**base, 'choices': [choice], **extra})}\n\n"

        queue: asyncio.Queue = asyncio.Queue()
        self._start(attempt, _Progress(asyncio.get_running_loop(), queue))
        future = attempt.future
        assert future is not None
        future.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            yield event({"role": "assistant", "content": ""})
            while (line := await queue.get()) is not None:
                yield event({"reasoning_content": line})
            trajectory = future.result()
        except Exception as exc:  # headers are gone: the error travels in the stream
            why = str(exc) if isinstance(exc, NotStarted) else f"the attempt failed: {type(exc).__name__}: {exc}"
            yield f"data: {json.dumps(error_body(why, 'server_error'))}\n\n"
            return
        finally:  # the client left, or the server cancelled this request
            if not future.done():
                attempt.cancel.set()
        status, body = self._reply(attempt, trajectory)
        if status != 200:
            yield f"data: {json.dumps(body)}\n\n"
            return
        choice = body["choices"][0]
        if choice["message"]["content"]:
            yield event({"content": choice["message"]["content"]})
        yield event({}, choice["finish_reason"], toolself=body["toolself"])
        if include_usage:
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': body['usage']})}\n\n"
        yield "data: [DONE]\n\n"
