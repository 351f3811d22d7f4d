"""A scripted web service on loopback, for testing the search, reader, summariser and judge
clients against real HTTP.

    service = FakeService([Reply(429, {"error": "slow down"}, {"Retry-After": "1"}),
                           Reply(200, {"organic": [...]})])
    with service.running() as url:
        ...
    service.requests  # what the client sent: method, path, query, headers, body

Each request takes the next reply; after the script ends `default` is repeated. A reply with
`delay` sleeps first (a timeout test); a dict or list is sent as JSON, bytes as they are, and
anything else as text.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from http_fixtures import running_server


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    content_type: str | None = None


class FakeService:
    def __init__(self, replies: list[Reply], default: Reply | None = None):
        self.replies = list(replies)
        self.default = default
        self.requests: list[dict[str, Any]] = []

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append({"method": request.method, "path": request.url.path,
                              "query": dict(request.query_params), "headers": dict(request.headers), "body": body})
        reply = self.replies.pop(0) if self.replies else self.default
        if reply is None:
            return Response("the script ended", status_code=599)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if isinstance(reply.body, (dict, list)):
            content, kind = json.dumps(reply.body), "application/json"
        elif isinstance(reply.body, bytes):
            content, kind = reply.body, "application/octet-stream"
        else:
            content, kind = str(reply.body or ""), "text/plain"
        return Response(content, status_code=reply.status, headers=reply.headers,
                        media_type=reply.content_type or kind)

    @contextmanager
    def running(self) -> Iterator[str]:
        methods = ["GET", "POST", "DELETE"]
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=methods)])
        with running_server(app) as url:
            yield url
