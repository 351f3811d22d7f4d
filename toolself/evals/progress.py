"""Progress of an evaluation: done / running / failed, accuracy and tokens so far, ETA.

In a terminal it is a live rich line; elsewhere (CI logs, `nohup`) it prints one plain line
every `every` attempts (by default each one: a log that says nothing for ten attempts of a
slow model looks like a hung run) and at the end.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from toolself.evals.records import AttemptKey, AttemptRecord


class EvalProgress:
    """Counts what the runner reports; thread-safe, rendered by rich or as plain lines."""

    def __init__(self, console: Console | None = None, every: int = 1, live: bool | None = None):
        self.console = console or Console(stderr=True)
        self.every = max(1, every)
        self.live_enabled = self.console.is_terminal if live is None else live
        self._lock = threading.Lock()
        self.total = 0
        self.skipped = 0
        self.done = 0
        self.correct = 0
        self.failed = 0
        self.timeouts = 0
        self.tokens = 0
        self.running: set[str] = set()
        self.started = time.monotonic()
        self._live: Live | None = None

    def start(self, total: int, skipped: int) -> None:
        """`total` attempts in the run, of which `skipped` were finished by an earlier run."""
        with self._lock:
            self.total, self.skipped = total, skipped
            self.started = time.monotonic()
        if self.live_enabled:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self.console.print(f"eval: {total} attempts, {skipped} already finished, {total - skipped} to run",
                               markup=False, highlight=False, soft_wrap=True)

    def attempt_started(self, key: AttemptKey) -> None:
        with self._lock:
            self.running.add(key.id)
        self._refresh()

    def attempt_returned(self, key: AttemptKey) -> None:
        """The attempt's thread is done (its record may still be on its way to disk)."""
        with self._lock:
            self.running.discard(key.id)

    def attempt_finished(self, record: AttemptRecord) -> None:
        with self._lock:
            self.running.discard(record.key.id)
            self.done += 1
            self.correct += int(record.correct)
            self.failed += int(record.status == "error")
            self.timeouts += int(record.status == "timeout")
            self.tokens += record.total_tokens
            line_due = not self.live_enabled and (self.done % self.every == 0)
        if line_due:
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
        self._refresh()

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()
            self._live = None
        else:
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def eta(self) -> float | None:
        remaining = self.total - self.skipped - self.done
        if self.done == 0 or remaining <= 0:
            return None if remaining > 0 else 0.0
        return (time.monotonic() - self.started) / self.done * remaining

    def line(self) -> str:
        with self._lock:
            finished = self.skipped + self.done
            accuracy = f"{100 * self.correct / self.done:.1f}%" if self.done else "-"
            eta = self.eta()
            return (f"{finished}/{self.total} done, {len(self.running)} running, {self.failed} failed, "
                    f"{self.timeouts} timed out | accuracy {accuracy} | {self.tokens:,} tokens | "
                    f"elapsed {_clock(time.monotonic() - self.started)} | ETA {_clock(eta) if eta is not None else '-'}")

    def render(self) -> Text:
        return Text(self.line())

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.render())


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
