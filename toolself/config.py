"""The configuration C_i = (sub-goal, strategy, toolbox, knowledge, context mode).

The model writes a configuration as one JSON object. `parse_configuration` turns that text
into a `Configuration` or into a list of precise problems (unparsable JSON, missing field,
unknown tool, unknown mode), which the agent sends back once for repair before falling back
(see `fallback_configuration`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

KnowledgeSource = Literal["none", "history", "summary"]
KNOWLEDGE_SOURCES: tuple[str, ...] = ("none", "history", "summary")

GENERIC_STRATEGY = (
    "You are a careful, resourceful assistant. Work step by step: gather the information you "
    "need with the tools, check it, and answer precisely."
)


@dataclass
class Configuration:
    """One stage's configuration.

    knowledge: what carries over from earlier stages: `none`, `history` (every summary in the
    history pool) or `summary` (the text in `knowledge_summary`, written by the policy).
    """

    subgoal: str
    strategy: str
    toolbox: list[str]
    knowledge: KnowledgeSource = "history"
    knowledge_summary: str = ""
    context_mode: str = "basic"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Configuration":
        return cls(**data)


FIELDS = ("subgoal", "strategy", "toolbox", "knowledge", "knowledge_summary", "context_mode")
REQUIRED = ("subgoal", "strategy", "toolbox", "knowledge", "context_mode")


def configuration_schema(tool_names: list[str], modes: list[str], max_text: int | None = None) -> dict[str, Any]:
    """The JSON schema a configuration must match. Tool names and modes are enumerated, so a
    constrained decoder can only write existing ones; `max_text` bounds free-text fields so a
    small model cannot run on forever inside a string."""

    def text(description: str, limit: int | None = max_text) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "description": description}
        if limit:
            out["maxLength"] = limit
        return out

    return {
        "type": "object",
        "properties": {
            "subgoal": text("What this stage must achieve."),
            "strategy": text("A persona and a step-by-step plan for the sub-goal, naming tools and decision points."),
            "toolbox": {
                "type": "array",
                "items": {"type": "string", "enum": list(tool_names)},
                "description": "Names of the tools to expose in this stage.",
            },
            "knowledge": {"type": "string", "enum": list(KNOWLEDGE_SOURCES),
                          "description": "none | history (all archived stage summaries) | summary (knowledge_summary)."},
            "knowledge_summary": text("The knowledge to carry over, when knowledge is 'summary'."),
            "context_mode": {"type": "string", "enum": list(modes)},
        },
        "required": list(REQUIRED),
        "additionalProperties": False,
    }


@dataclass
class ParsedConfiguration:
    configuration: Configuration | None
    problems: list[str] = field(default_factory=list)
    data: dict[str, Any] | None = None  # the parsed object, even when invalid


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _extract_json_object(text: str) -> str:
    """The JSON object in a reply: fenced, bare, or the outermost braces."""
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        return text[start : end + 1]
    return text.strip()


def parse_configuration(text: str, tool_names: list[str], modes: list[str]) -> ParsedConfiguration:
    """Parse and validate a configuration written by the model against the pool and modes."""
    if not text or not text.strip():
        return ParsedConfiguration(None, ["the reply was empty; write the configuration as one JSON object"])
    try:
        data = json.loads(_extract_json_object(text))
    except json.JSONDecodeError as exc:
        return ParsedConfiguration(None, [f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"])
    if not isinstance(data, dict):
        return ParsedConfiguration(None, [f"the configuration must be a JSON object, not {type(data).__name__}"])
    return validate_configuration(data, tool_names, modes)


def validate_configuration(data: dict[str, Any], tool_names: list[str], modes: list[str]) -> ParsedConfiguration:
    problems: list[str] = []
    for name in REQUIRED:
        if name not in data:
            problems.append(f"missing field '{name}'")
    unknown_fields = sorted(set(data) - set(FIELDS))
    if unknown_fields:
        problems.append(f"unknown field(s) {unknown_fields}; allowed: {list(FIELDS)}")
    for name in ("subgoal", "strategy", "knowledge_summary"):
        if name in data and not isinstance(data[name], str):
            problems.append(f"field '{name}' must be a string")
    if "subgoal" in data and isinstance(data["subgoal"], str) and not data["subgoal"].strip():
        problems.append("field 'subgoal' must not be empty")
    toolbox = data.get("toolbox")
    if toolbox is not None:
        if not isinstance(toolbox, list) or not all(isinstance(t, str) for t in toolbox):
            problems.append("field 'toolbox' must be a list of tool names")
        else:
            unknown = [t for t in toolbox if t not in tool_names]
            if unknown:
                problems.append(f"unknown tool(s) {unknown}; the pool has {list(tool_names)}")
    if "knowledge" in data and data["knowledge"] not in KNOWLEDGE_SOURCES:
        problems.append(f"unknown knowledge source {data['knowledge']!r}; use one of {list(KNOWLEDGE_SOURCES)}")
    if "context_mode" in data and data["context_mode"] not in modes:
        problems.append(f"unknown context mode {data['context_mode']!r}; available: {list(modes)}")
    if data.get("knowledge") == "summary" and not str(data.get("knowledge_summary", "")).strip():
        problems.append("knowledge is 'summary' but 'knowledge_summary' is empty")
    if problems:
        return ParsedConfiguration(None, problems, data)
    toolbox_unique = list(dict.fromkeys(data["toolbox"]))
    config = Configuration(
        subgoal=data["subgoal"].strip(),
        strategy=data["strategy"].strip(),
        toolbox=toolbox_unique,
        knowledge=data["knowledge"],
        knowledge_summary=str(data.get("knowledge_summary", "")).strip(),
        context_mode=data["context_mode"],
    )
    return ParsedConfiguration(config, [], data)


def fallback_configuration(
    subgoal: str, tool_names: list[str], previous: Configuration | None, default_mode: str = "basic"
) -> Configuration:
    """The documented fallback after a failed repair: the requested sub-goal, the generic
    strategy, the whole pool, every archived summary as knowledge, and the previous stage's
    context mode (or the default for the first stage). It is always valid, so a model that
    cannot write JSON still gets a working stage instead of a crash."""
    return Configuration(
        subgoal=subgoal,
        strategy=GENERIC_STRATEGY,
        toolbox=list(tool_names),
        knowledge="history",
        context_mode=previous.context_mode if previous else default_mode,
    )
