"""One request to a web service, retried the same way for every backend.

Every service fails in the same few ways, and each way has one treatment: a refused key
(401/403) or a spent quota (402) stops at once and names the variable that holds the key; a
rate limit (429) waits as long as `Retry-After` asks (capped), otherwise backs off; a server
error (5xx) or a timeout is retried a bounded number of times; anything else is an error the
model can read. `ServiceError` is a `ToolError`, so a tool that lets it through turns it into
an observation, never a crash of the attempt.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolself.tools.errors import ToolError

if TYPE_CHECKING:  # httpx loads with the first request, not with the CLI
    import httpx


class ServiceError(ToolError):
    """A web service failed in a way the model (or the user) should read verbatim."""


@dataclass(frozen=True)
class RetryPolicy:
    """attempts counts the first try; the delay before retry n is backoff * 2**n (jittered,
    capped at max_delay) unless the server asked for a longer one."""

    attempts: int = 4
    backoff: float = 0.5
    max_delay: float = 20.0
    timeout: float = 20.0


def api_key(names: tuple[str, ...]) -> str | None:
    """The first of `names` set in the environment: keys are read at request time and never
    stored on an object that is pickled, cached or recorded."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _delay(policy: RetryPolicy, attempt: int, response: httpx.Response | None) -> float:
    from toolself.models.openai_compat import MAX_RETRY_AFTER, parse_retry_after

    delay = min(policy.max_delay, policy.backoff * 2 ** attempt) * random.uniform(0.5, 1.0)
    asked = parse_retry_after(response.headers) if response is not None else None
    if asked is not None:
        delay = max(delay, min(asked, MAX_RETRY_AFTER))
    return delay


def request(service: str, method: str, url: str, *, policy: RetryPolicy, key_names: tuple[str, ...] = (),
            forbidden_hint: str = "", **kwargs: Any) -> httpx.Response:
    """The service's successful response, or `ServiceError` after the treatment above."""
    import httpx

    problem = ""
    for attempt in range(policy.attempts):
        response: httpx.Response | None = None
        try:
            response = httpx.request(method, url, timeout=policy.timeout, follow_redirects=True, **kwargs)
        except httpx.TimeoutException:
            problem = f"no answer within {policy.timeout:g} s"
        except httpx.TransportError as exc:
            problem = f"could not be reached ({type(exc).__name__}: {exc})"
        else:
            status = response.status_code
            if status < 400:
                return response
            keys = " or ".join(key_names)
            if status in (401, 403):
                hint = forbidden_hint or (f"check {keys}" if keys else "the service refused the request")
                raise ServiceError(f"{service} answered HTTP {status}: {hint}")
            if status == 402:
                raise ServiceError(f"{service} answered HTTP 402: the account's quota or credit is spent")
            if status != 429 and status < 500:
                raise ServiceError(f"{service} answered HTTP {status}: {response.text[:200].strip()}")
            problem = "rate limited (HTTP 429)" if status == 429 else f"server error (HTTP {status})"
        if attempt + 1 < policy.attempts:
            time.sleep(_delay(policy, attempt, response))
    raise ServiceError(f"{service} failed after {policy.attempts} attempts: {problem}")


def json_body(service: str, response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise ServiceError(f"{service} did not answer JSON: {response.text[:120].strip()!r}") from None
