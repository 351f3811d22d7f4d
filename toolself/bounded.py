"""Calls that the caller stops waiting for at a deadline: a model call under an attempt's
time limit.

A Python thread cannot be killed, so a bounded call runs in a daemon thread of its own and the
caller waits for it until the deadline, or until a cancel event is set; then the caller goes on
and the call is abandoned: it runs on until its backend answers, and that late answer is
dropped. Whatever the call raises, KeyboardInterrupt and SystemExit included, is raised in the
caller, as if the call had been made there. A call with neither a deadline nor a cancel event
runs in the caller's own thread, as a plain call.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")

# How often a waiting caller looks at the cancel event: the event cannot be waited on together
# with the call, and a twentieth of a second is well below any model call's latency.
CANCEL_POLL_S = 0.05


class Abandoned(Exception):
    """The caller stopped waiting: `reason` is `time` (the deadline passed) or `cancelled`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def call_within(fn: Callable[[], T], deadline: float | None, cancel: threading.Event | None = None) -> T:
    """`fn()`, or Abandoned once `time.monotonic()` reaches `deadline` or `cancel` is set."""
    if deadline is None and cancel is None:
        return fn()
    finished = threading.Event()
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # carried to the caller, whatever it is
            outcome["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=work, name="toolself-bounded-call", daemon=True).start()
    while not finished.is_set():
        if cancel is not None and cancel.is_set():
            raise Abandoned("cancelled")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise Abandoned("time")
        waits = [w for w in (left, CANCEL_POLL_S if cancel is not None else None) if w is not None]
        finished.wait(min(waits))
    if "error" in outcome:
        raise outcome.pop("error")  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
