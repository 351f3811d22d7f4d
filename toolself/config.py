"""The configuration C_i = (sub-goal, strategy, toolbox, knowledge, context mode).

The model writes a configuration as one JSON object. One pydantic model, built for the pool
and the registered context modes (`configuration_model`), is both what the policy is shown
(`configuration_schema`: tool names and modes enumerated, free text bounded) and what the loop
applies (`parse_configuration`): the two cannot drift apart. Its errors become precise problems
(unparsable JSON, missing field, unknown tool, unknown mode, text over its bound), which the
agent sends back for repair before falling back (see `fallback_configuration`).

`knowledge_form="official"` is the authors' way of writing knowledge: one string that is empty
(nothing), `ALL` (every archived summary) or the summary itself; it is read into the same
`Configuration`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

KnowledgeSource = Literal["none", "history", "summary"]
KNOWLEDGE_SOURCES: tuple[str, ...] = ("none", "history", "summary")
KnowledgeForm = Literal["toolself", "official"]
OFFICIAL_ALL = "ALL"

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

_DESCRIPTIONS = {
    "subgoal": "What this stage must achieve.",
    "strategy": "A persona and a step-by-step plan for the sub-goal, naming tools and decision points.",
    "toolbox": "Names of the tools to expose in this stage.",
    "knowledge": "none | history (all archived stage summaries) | summary (knowledge_summary).",
    "knowledge_official": 'What carries over: "" (nothing), "ALL" (every archived stage summary), or the '
                          "summary itself.",
    "knowledge_summary": "The knowledge to carry over, when knowledge is 'summary'.",
    "context_mode": "How this stage keeps its context within budget.",
}


class _ConfigurationBase(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("subgoal", check_fields=False)
    @classmethod
    def _subgoal_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("field 'subgoal' must not be empty")
        return value

    @model_validator(mode="after")
    def _summary_present(self) -> "_ConfigurationBase":
        if getattr(self, "knowledge", None) == "summary" and not str(getattr(self, "knowledge_summary", "")).strip():
            raise ValueError("knowledge is 'summary' but 'knowledge_summary' is empty")
        return self

    def to_configuration(self) -> Configuration:
        data = self.model_dump()
        knowledge, summary = data["knowledge"], str(data.get("knowledge_summary", "")).strip()
        if knowledge not in KNOWLEDGE_SOURCES:  # the official form: "", "ALL" or the summary itself
            knowledge, summary = ("none", "") if not knowledge.strip() else (
                ("history", "") if knowledge.strip() == OFFICIAL_ALL else ("summary", knowledge.strip()))
        return Configuration(subgoal=data["subgoal"].strip(), strategy=data["strategy"].strip(),
                             toolbox=list(dict.fromkeys(data["toolbox"])), knowledge=knowledge,
                             knowledge_summary=summary, context_mode=data["context_mode"])


def _choice(names: list[str] | tuple[str, ...]) -> Any:
    return Literal[tuple(names)] if names else str  # type: ignore[valid-type]


@functools.lru_cache(maxsize=64)
def configuration_model(tool_names: tuple[str, ...], modes: tuple[str, ...], max_text: int | None = None,
                        knowledge_form: KnowledgeForm = "toolself") -> type[_ConfigurationBase]:
    """The pydantic model of a configuration for this pool and these modes. `max_text` bounds
    the free-text fields, so a small model cannot run on forever inside a string (and a reply
    that does is rejected, not silently accepted)."""

    def text(name: str) -> Any:
        return Annotated[str, Field(description=_DESCRIPTIONS[name], max_length=max_text)]

    if knowledge_form == "official":
        knowledge: Any = (Annotated[str, Field(description=_DESCRIPTIONS["knowledge_official"],
                                               max_length=max_text)], ...)
    else:
        knowledge = (Annotated[KnowledgeSource, Field(description=_DESCRIPTIONS["knowledge"])], ...)
    fields: dict[str, Any] = {
        "subgoal": (text("subgoal"), ...),
        "strategy": (text("strategy"), ...),
        "toolbox": (Annotated[list[_choice(tool_names)], Field(description=_DESCRIPTIONS["toolbox"])], ...),
        "knowledge": knowledge,
        "knowledge_summary": (text("knowledge_summary"), ""),
        "context_mode": (Annotated[_choice(modes), Field(description=_DESCRIPTIONS["context_mode"])], ...),
    }
    if knowledge_form == "official":
        del fields["knowledge_summary"]
    return create_model("Configuration", __base__=_ConfigurationBase, **fields)


def _plain(schema: Any) -> Any:
    """pydantic's schema without its titles and defaults: what a constrained decoder and a
    model read needs no more."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k not in ("title", "default")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def configuration_schema(tool_names: list[str], modes: list[str], max_text: int | None = None,
                         knowledge_form: KnowledgeForm = "toolself") -> dict[str, Any]:
    """The JSON schema a configuration must match: the schema of `configuration_model`."""
    model = configuration_model(tuple(tool_names), tuple(modes), max_text, knowledge_form)
    schema = _plain(model.model_json_schema())
    schema["additionalProperties"] = False
    return schema


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


def parse_configuration(text: str, tool_names: list[str], modes: list[str], max_text: int | None = None,
                        knowledge_form: KnowledgeForm = "toolself") -> ParsedConfiguration:
    """Parse and validate a configuration written by the model against the pool and modes."""
    if not text or not text.strip():
        return ParsedConfiguration(None, ["the reply was empty; write the configuration as one JSON object"])
    try:
        data = json.loads(_extract_json_object(text))
    except json.JSONDecodeError as exc:
        return ParsedConfiguration(None, [f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"])
    if not isinstance(data, dict):
        return ParsedConfiguration(None, [f"the configuration must be a JSON object, not {type(data).__name__}"])
    return validate_configuration(data, tool_names, modes, max_text, knowledge_form)


def validate_configuration(data: dict[str, Any], tool_names: list[str], modes: list[str],
                           max_text: int | None = None,
                           knowledge_form: KnowledgeForm = "toolself") -> ParsedConfiguration:
    """Validate with `configuration_model`; each of its errors becomes one sentence the policy
    can act on."""
    model = configuration_model(tuple(tool_names), tuple(modes), max_text, knowledge_form)
    try:
        return ParsedConfiguration(model.model_validate(data).to_configuration(), [], data)
    except ValidationError as exc:
        return ParsedConfiguration(None, _problems(exc, data, tool_names, modes), data)


def _problems(exc: ValidationError, data: dict[str, Any], tool_names: list[str], modes: list[str]) -> list[str]:
    problems: list[str] = []
    unknown_fields: list[str] = []
    unknown_tools: list[str] = []
    for error in exc.errors():
        loc, kind = error["loc"], error["type"]
        name = str(loc[0]) if loc else ""
        if kind == "missing":
            problems.append(f"missing field '{name}'")
        elif kind == "extra_forbidden":
            unknown_fields.append(name)
        elif name == "toolbox" and len(loc) == 2 and isinstance(data["toolbox"][loc[1]], str):
            unknown_tools.append(data["toolbox"][loc[1]])
        elif name == "toolbox":
            problems.append("field 'toolbox' must be a list of tool names")
        elif name == "context_mode" and kind == "literal_error":
            problems.append(f"unknown context mode {data[name]!r}; available: {list(modes)}")
        elif name == "knowledge" and kind == "literal_error":
            problems.append(f"unknown knowledge source {data[name]!r}; use one of {list(KNOWLEDGE_SOURCES)}")
        elif kind == "string_type":
            problems.append(f"field '{name}' must be a string")
        elif kind == "string_too_long":
            limit = error.get("ctx", {}).get("max_length")
            problems.append(f"field '{name}' has {len(data[name]):,} characters, over the limit of {limit:,}")
        elif kind == "value_error":
            problems.append(str(error["ctx"]["error"]))
        else:
            problems.append(f"field '{name}': {error['msg']}" if name else error["msg"])
    if unknown_tools:
        problems.append(f"unknown tool(s) {list(dict.fromkeys(unknown_tools))}; the pool has {list(tool_names)}")
    if unknown_fields:
        problems.append(f"unknown field(s) {sorted(unknown_fields)}; allowed: {list(FIELDS)}")
    return list(dict.fromkeys(problems))


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
