"""Context-management modes: how a stage's visible context is kept within its token budget.

A mode is part of the configuration: the policy chooses it for each stage, among the modes the
run offers. Each mode is a small pydantic class carrying its own parameters and named by its
`type`, in the manner of SWE-agent's history processors: a run file or a preset picks and tunes
them (`make_mode({"type": "truncation", "keep_last": 10})`), and adding one is adding a class
and `register_mode`: it is then offered in the configuration spec, accepted by validation and
used by the loop. A name nobody registered is an error, never a silent substitute.

A mode never edits the stage's messages; it returns a *view* (which messages to show, and how
far to cut each), so the trajectory keeps everything and training can rebuild exactly what the
policy saw. The first `pinned` messages of a stage (its system prompt, built from C_i, and the
opening user turn) are always shown. Turns are dropped whole: an assistant message travels with
the tool results that answer it, because chat APIs reject a tool result without its call.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from toolself.models.base import Message
from toolself.trajectory import ELIDED

View = list[list[Any]]


def _turns(messages: list[Message], start: int) -> list[list[int]]:
    """Group message indices from `start` into turns: an assistant message and what follows it."""
    turns: list[list[int]] = []
    for i in range(start, len(messages)):
        if messages[i].role == "assistant" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return turns


class ContextMode(BaseModel):
    """The base of every mode: the budget-driven clearing of old turns.

    window: when set, the authors' pruning instead of budget-driven clearing: each time a call
    would see more than the budget, the stage is cut back to the pinned messages and its last
    `window` messages (widened to whole turns), and it grows again from there, as if the
    conversation had been pruned in place before that call.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    pinned: int = Field(2, ge=0)
    window: int | None = Field(None, ge=1)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name, **self.model_dump()}

    def cuts(self, messages: list[Message]) -> dict[int, int]:
        """Message index -> characters to keep, for modes that shorten content."""
        return {}

    def view(self, messages: list[Message], tokens: list[int], budget: int) -> View:
        """The pinned messages and the recent turns that fit in `budget` (or the `window`).

        The most recent turn is always kept, even over budget: the policy must see the
        observation it is acting on.
        """
        cuts = self.cuts(messages)

        def cost(i: int) -> int:
            keep = cuts.get(i)
            if keep is None:
                return tokens[i]
            return max(1, tokens[i] * keep // max(1, len(messages[i].content))) + 12

        pinned = min(self.pinned, len(messages))
        if self.window is not None:
            kept = [list(range(self._window_start(messages, cost, budget, pinned), len(messages)))]
        else:
            used = sum(cost(i) for i in range(pinned))
            kept = []
            for turn in reversed(_turns(messages, pinned)):
                turn_cost = sum(cost(i) for i in turn)
                if kept and used + turn_cost > budget:
                    break
                kept.append(turn)
                used += turn_cost
            kept.reverse()
        view: View = [[i, cuts.get(i)] for i in range(pinned)]
        if sum(len(t) for t in kept) < len(messages) - pinned:
            view.append([ELIDED, None])
        for turn in kept:
            view.extend([i, cuts.get(i)] for i in turn)
        return view

    def _window_start(self, messages: list[Message], cost: Any, budget: int, pinned: int) -> int:
        """Replay the in-place pruning: a call was made before each assistant message and is
        being made now; each one that saw more than `budget` kept only the last `window`."""
        prefix = [0, *accumulate(cost(i) for i in range(len(messages)))]
        start = pinned
        calls = [i for i in range(pinned, len(messages)) if messages[i].role == "assistant"] + [len(messages)]
        for end in calls:
            if prefix[pinned] + prefix[end] - prefix[start] > budget and end - start > (self.window or 0):
                start = end - (self.window or 0)
                while start > pinned and messages[start].role != "assistant":
                    start -= 1
        return start


class BasicMode(ContextMode):
    name: ClassVar[str] = "basic"
    description: ClassVar[str] = (
        "ordinary reasoning, search and tool use; when the context outgrows its budget, older "
        "turns are cleared and the most recent ones kept"
    )


class TruncationMode(ContextMode):
    """keep_last: observations kept whole; older ones longer than `max_chars` keep their first
    `max_chars` characters (0: only a one-line stub saying what was removed).
    message_max_chars: when set, any message longer than this is cut to it, recent ones too."""

    name: ClassVar[str] = "truncation"
    description: ClassVar[str] = (
        "for very long tool outputs (software engineering, long documents, file editing): long "
        "earlier observations are truncated to a short head; only the last few stay whole"
    )
    keep_last: int = Field(2, ge=0)
    max_chars: int = Field(400, ge=0)
    message_max_chars: int | None = Field(None, ge=1)

    def cuts(self, messages: list[Message]) -> dict[int, int]:
        out: dict[int, int] = {}
        if self.message_max_chars is not None:
            out = {i: self.message_max_chars for i, m in enumerate(messages) if len(m.content) > self.message_max_chars}
        tool_indices = [i for i in range(self.pinned, len(messages)) if messages[i].role == "tool"]
        old = tool_indices[: max(0, len(tool_indices) - self.keep_last)]
        out.update({i: self.max_chars for i in old if len(messages[i].content) > self.max_chars})
        return out


MODES: dict[str, type[ContextMode]] = {BasicMode.name: BasicMode, TruncationMode.name: TruncationMode}


def register_mode(mode: type[ContextMode]) -> type[ContextMode]:
    """Make a mode available: `AgentSettings` offers every registered mode by default, the
    configuration spec lists it and validation accepts it. Usable as a class decorator."""
    if not (isinstance(mode, type) and issubclass(mode, ContextMode)) or not mode.name:
        raise TypeError("a context mode is a ContextMode subclass with a `name`")
    MODES[mode.name] = mode
    return mode


def make_mode(spec: str | dict[str, Any] | ContextMode) -> ContextMode:
    """A mode from its name, from `{"type": NAME, **parameters}`, or as given."""
    if isinstance(spec, ContextMode):
        return spec
    params = dict(spec) if isinstance(spec, dict) else {"type": spec}
    name = params.pop("type", None)
    if name not in MODES:
        raise ValueError(f"unknown context mode {name!r}; registered: {list(MODES)}")
    return MODES[name](**params)


def describe_modes(modes: list[ContextMode]) -> str:
    return "\n".join(f"- {m.name}: {m.description}" for m in modes)
