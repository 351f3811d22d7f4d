"""Context-management modes: how a stage's visible context is kept within its token budget.

A mode is part of the configuration: the policy chooses it for each stage. A mode never edits
the stage's messages; it returns a *view* (which messages to show, and how far to cut each),
so the trajectory keeps everything and training can rebuild exactly what the policy saw.

The first `pinned` messages of a stage (its system prompt, built from C_i, and the opening
user turn) are always shown. Turns are dropped whole: an assistant message travels with the
tool results that answer it, because chat APIs reject a tool result without its call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

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


@dataclass
class ContextMode:
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    pinned: int = 2

    def cuts(self, messages: list[Message]) -> dict[int, int]:
        """Message index -> characters to keep, for modes that shorten content."""
        return {}

    def view(self, messages: list[Message], tokens: list[int], budget: int) -> View:
        """Keep the pinned messages and as many of the most recent turns as fit in `budget`.

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
        used = sum(cost(i) for i in range(pinned))
        kept: list[list[int]] = []
        for turn in reversed(_turns(messages, pinned)):
            turn_cost = sum(cost(i) for i in turn)
            if kept and used + turn_cost > budget:
                break
            kept.append(turn)
            used += turn_cost
        view: View = [[i, cuts.get(i)] for i in range(pinned)]
        shown = sum(len(t) for t in kept)
        if shown < len(messages) - pinned:
            view.append([ELIDED, None])
        for turn in reversed(kept):
            view.extend([i, cuts.get(i)] for i in turn)
        return view


@dataclass
class BasicMode(ContextMode):
    name: ClassVar[str] = "basic"
    description: ClassVar[str] = (
        "ordinary reasoning, search and tool use; when the context outgrows its budget, older "
        "turns are cleared and the most recent ones kept"
    )


@dataclass
class TruncationMode(ContextMode):
    name: ClassVar[str] = "truncation"
    description: ClassVar[str] = (
        "for very long tool outputs (software engineering, long documents, file editing): long "
        "earlier observations are truncated to a short head; only the last few stay whole"
    )
    keep_last: int = 2
    max_chars: int = 400

    def cuts(self, messages: list[Message]) -> dict[int, int]:
        tool_indices = [i for i in range(self.pinned, len(messages)) if messages[i].role == "tool"]
        old = tool_indices[: max(0, len(tool_indices) - self.keep_last)]
        return {i: self.max_chars for i in old if len(messages[i].content) > self.max_chars}


MODES: dict[str, type[ContextMode]] = {BasicMode.name: BasicMode, TruncationMode.name: TruncationMode}


def register_mode(mode: type[ContextMode]) -> type[ContextMode]:
    """Add a context mode; it then appears in every configuration-generation spec."""
    MODES[mode.name] = mode
    return mode


def describe_modes(names: list[str] | None = None) -> str:
    return "\n".join(f"- {n}: {MODES[n].description}" for n in (names or list(MODES)))
