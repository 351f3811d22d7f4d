"""Trajectory records: everything an attempt did, written as one JSON line, read back losslessly.

Each message is stored once, in the conversation it belongs to. Each model call stores its
*view* (which messages it saw, and how far each was cut by the context mode) instead of a copy
of the prompt, so a 100-step trajectory stays linear in size while training can still rebuild
exactly what the policy saw at every decision (`Conversation.visible`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from toolself.config import Configuration
from toolself.models.base import Message, Usage

ELIDED = -1  # a view entry standing for "older turns were cleared here"
ELIDED_NOTE = "[Earlier turns of this stage were cleared to keep the context within budget.]"
SCHEMA_VERSION = 1


def truncate_text(text: str, keep: int) -> str:
    """The placeholder a context mode leaves where it cut an old observation (with `keep` 0, a
    one-line stub in its place)."""
    if keep == 0:
        return f"[an earlier output of {len(text)} characters was removed to keep the context short]"
    return text[:keep] + f"\n[... {len(text) - keep} more characters of this earlier output were truncated ...]"


@dataclass
class ModelCall:
    """One decision of the policy (or of a decoupled configuration writer).

    kind: `configure` (wrote a configuration), `action` (chose tool calls), `final` (asked
    for its best answer when a budget ran out).
    view: [message index, characters kept or None] pairs, ELIDED marking cleared turns.
    """

    kind: str
    view: list[list[Any]]
    output: int
    tools: list[str] = field(default_factory=list)
    response_schema: bool = False
    usage: Usage = field(default_factory=Usage)
    latency: float = 0.0
    completion_token_ids: list[int] | None = None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["completion_token_ids"] is None:
            del out["completion_token_ids"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelCall":
        data = dict(data)
        data["usage"] = Usage(**data.get("usage", {}))
        return cls(**data)


@dataclass
class Conversation:
    messages: list[Message] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)

    def visible(self, call: ModelCall) -> list[Message]:
        """The exact messages the policy saw for `call`."""
        return self.render(call.view)

    def render(self, view: list[list[Any]]) -> list[Message]:
        out = []
        for index, keep in view:
            if index == ELIDED:
                out.append(Message(role="user", content=ELIDED_NOTE))
                continue
            message = self.messages[index]
            if keep is not None:
                message = Message(role=message.role, content=truncate_text(message.content, keep),
                                  tool_calls=message.tool_calls, tool_call_id=message.tool_call_id, name=message.name)
            out.append(message)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"messages": [m.to_dict() for m in self.messages], "calls": [c.to_dict() for c in self.calls]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Conversation":
        return cls([Message.from_dict(m) for m in data["messages"]], [ModelCall.from_dict(c) for c in data["calls"]])


@dataclass
class Step:
    """One tool call and its observation, for reading and analysis.

    cut: what was over its limit and how many characters it had, e.g. {"observation": 20971520}:
    an observation is kept cut (the model saw the same cut text), a call's arguments are kept cut
    and the call was not run (see `AgentSettings.max_reply_chars`).
    canonical: for `reconfigure` and `terminate` written with the authors' argument names
    (`execution_summary`, `result`, ...), the same call in toolself's names; `arguments` keeps
    what the model wrote. None when the two are the same."""

    tool: str
    arguments: dict[str, Any] | None
    observation: str
    is_error: bool = False
    duration: float = 0.0
    call: int = -1  # index of the ModelCall that chose it
    cut: dict[str, int] = field(default_factory=dict)
    canonical: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Step":
        return cls(**data)


@dataclass
class Stage:
    index: int
    configuration: Configuration
    config_source: str  # policy | repaired | fallback | preset
    config_problems: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    request: dict[str, Any] | None = None  # the reconfigure arguments that opened this stage
    # Where the configuration was written when not inside the previous stage's context:
    # the first stage's setup turn, or a decoupled writer's separate call.
    config_conversation: Conversation | None = None
    conversation: Conversation = field(default_factory=Conversation)
    steps: list[Step] = field(default_factory=list)
    summary: str | None = None
    reason: str | None = None
    end: str = ""
    started: float = 0.0
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("configuration", "conversation", "config_conversation", "steps")}
        out["configuration"] = self.configuration.to_dict()
        out["conversation"] = self.conversation.to_dict()
        out["config_conversation"] = self.config_conversation.to_dict() if self.config_conversation else None
        out["steps"] = [asdict(s) for s in self.steps]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Stage":
        data = dict(data)
        data["configuration"] = Configuration.from_dict(data["configuration"])
        data["conversation"] = Conversation.from_dict(data["conversation"])
        if data.get("config_conversation"):
            data["config_conversation"] = Conversation.from_dict(data["config_conversation"])
        data["steps"] = [Step.from_dict(s) for s in data.get("steps", [])]
        return cls(**data)


@dataclass
class Trajectory:
    task: str
    task_id: str = ""
    method: str = "toolself"
    model: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    stages: list[Stage] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None
    end_reason: str = ""
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    started_at: float = field(default_factory=time.time)
    duration: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    version: int = SCHEMA_VERSION

    @property
    def num_steps(self) -> int:
        return sum(len(s.steps) for s in self.stages)

    @property
    def num_reconfigurations(self) -> int:
        return sum(1 for s in self.stages if s.end == "reconfigure")

    def conversations(self) -> Iterator[Conversation]:
        """Every conversation of the attempt in order: where each decision was made."""
        for stage in self.stages:
            if stage.config_conversation is not None:
                yield stage.config_conversation
            yield stage.conversation

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("stages", "usage")}
        out["usage"] = asdict(self.usage)
        out["stages"] = [s.to_dict() for s in self.stages]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        data = dict(data)
        data["usage"] = Usage(**data.get("usage", {}))
        data["stages"] = [Stage.from_dict(s) for s in data.get("stages", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, line: str) -> "Trajectory":
        return cls.from_dict(json.loads(line))


def write_jsonl(path: str | Path, trajectories: list[Trajectory], append: bool = True) -> None:
    """Append trajectories as JSON lines, flushed and fsynced so that a crash loses nothing
    already written."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(t.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories back; a torn last line (a crash mid-write) is ignored, any other bad
    line is an error naming it."""
    out = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_json(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a trajectory record") from None
    return out
