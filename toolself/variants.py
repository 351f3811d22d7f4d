"""The paper's comparisons as settings of the one agent loop.

    toolself          unified: the acting policy writes every configuration in its own context
    vanilla           one ReAct stage, whole pool, generic prompt, no reconfigure tool
    static:NAME       a fixed specialised preset (research, general, swe), no reconfigure tool
                      (both single-stage methods get ToolSelf's whole action budget,
                      its max_total_steps, in their one stage)
    decoupled         configurations written by a separate call that sees only the spec

Ablations freeze one or more dimensions of ToolSelf (`toolself --freeze knowledge`, or the
method name `toolself-freeze:knowledge+subgoal`).

A *run preset* (`--preset paper`) is another kind of file in the same folder: not a
configuration but a whole setting (agent budgets and prompts, sampling, the text protocol, tool
behaviour, the scorer), applied on top of any method. `paper` is the authors' setting point by
point (docs/paper.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from toolself.agent import FREEZABLE, AgentSettings
from toolself.config import GENERIC_STRATEGY, Configuration


@dataclass(frozen=True)
class Method:
    name: str
    summary: str


def _preset_files() -> dict[str, dict[str, Any]]:
    folder = resources.files("toolself") / "presets"
    return {p.name[: -len(".json")]: json.loads(p.read_text()) for p in folder.iterdir() if p.name.endswith(".json")}


def _preset_names() -> list[str]:
    return sorted(name for name, data in _preset_files().items() if "preset" not in data)


def run_preset_names() -> list[str]:
    return sorted(name for name, data in _preset_files().items() if "preset" in data)


def load_preset(name: str) -> Configuration:
    data = _preset_files().get(name)
    if data is None or "preset" in data:
        raise ValueError(f"unknown static preset {name!r}; available: {_preset_names()}")
    return Configuration.from_dict(data)


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)


class Protocol(BaseModel):
    """How a policy's tool calls travel: `tool_protocol` and `text_protocol` as `OpenAIModel`
    takes them (an in-process model takes `text_protocol` too, so that a model trained on the
    preset's rendering is prompted the same way wherever it runs); own_tokenizer: count a
    served model's tokens with its weights' tokenizer when this machine has it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tool_protocol: str
    text_protocol: str
    own_tokenizer: bool


class ToolProfile(BaseModel):
    """search_results: results per query; search_dates: each with its publication date (when
    the service gives one); visit_max_chars: the most characters of each page a goal-directed
    `visit` reads; file_max_chars: the same for `file_analyzer`'s goal reading."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    search_results: int = Field(ge=1)
    search_dates: bool
    visit_max_chars: int = Field(ge=1)
    file_max_chars: int = Field(ge=1)


class RunPreset(BaseModel):
    """A whole run setting, from `toolself/presets/NAME.json` (see the module docs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    preset: str
    summary: str
    agent: dict[str, Any]
    sampling: Sampling
    protocol: Protocol
    tools: ToolProfile
    scorer: str
    judge_temperature: float = Field(ge=0)
    timeout: float = Field(gt=0, description="seconds per attempt; a timed-out attempt scores wrong")

    def settings(self) -> dict[str, Any]:
        """`AgentSettings` overrides (checked: a preset that names a setting the loop lacks fails here)."""
        AgentSettings(**self.agent)
        return dict(self.agent)

    def model_options(self, spec: str) -> dict[str, Any]:
        """Load options for the policy `spec` names: sampling and the text protocol for every
        model; for a served one also its own tokenizer."""
        if not spec.startswith("openai:"):  # a model this process runs: its own sampler takes both
            return {"temperature": self.sampling.temperature, "top_p": self.sampling.top_p,
                    "text_protocol": self.protocol.text_protocol}
        options: dict[str, Any] = {"temperature": self.sampling.temperature,
                                   "extra_body": {"top_p": self.sampling.top_p},
                                   "tool_protocol": self.protocol.tool_protocol,
                                   "text_protocol": self.protocol.text_protocol}
        if self.protocol.own_tokenizer:
            options["tokenizer"] = spec[len("openai:"):].rpartition("@http")[0] or spec[len("openai:"):]
        return options

    def judge(self, spec: str | None) -> Any:
        """The judge `spec` names, sampled at the preset's judge temperature, or None."""
        if spec is None:
            return None
        from toolself.evals.scorers import LLMJudge
        from toolself.models import load_model

        return LLMJudge(load_model(spec, temperature=self.judge_temperature))

    def adapt_pool(self, pool: Any, web: Any = None, docs: Any = None) -> None:
        """Give the pool's `search`, `visit` and `file_analyzer` the preset's behaviour."""
        from toolself.tools.files import goal_file_analyzer
        from toolself.tools.search import search_tool
        from toolself.tools.visit import goal_visit_tool

        for bound in (search_tool(web, docs, k=self.tools.search_results, dates=self.tools.search_dates),
                      goal_visit_tool(web, docs, max_chars=self.tools.visit_max_chars),
                      goal_file_analyzer(self.tools.file_max_chars, web)):
            if bound.name in pool:
                pool.replace(bound)

    def retarget(self, loader: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        """`loader` with every answer-scored task scored by the preset's scorer (tasks decided
        by their tests keep them)."""
        def load(*args: Any, **kwargs: Any) -> list[Any]:
            tasks = loader(*args, **kwargs)
            for task in tasks:
                if not task.check_command and task.metadata.get("scorer") not in ("tests", "swebench"):
                    task.metadata["scorer"] = self.scorer
            return tasks
        return load


def load_run_preset(name: str) -> RunPreset:
    data = _preset_files().get(name)
    if data is None or "preset" not in data:
        raise ValueError(f"unknown preset {name!r}; available: {run_preset_names()}")
    return RunPreset.model_validate(data)


VANILLA = Configuration(subgoal="{task}", strategy=GENERIC_STRATEGY, toolbox=[], knowledge="none",
                        context_mode="basic")


def methods() -> list[Method]:
    out = [
        Method("toolself", "unified: the policy reconfigures itself in its own execution context"),
        Method("vanilla", "one ReAct stage with the whole pool and a generic prompt; no reconfigure"),
    ]
    for name in _preset_names():
        preset = load_preset(name)
        out.append(Method(f"static:{name}", f"fixed {name} preset: tools {', '.join(preset.toolbox)}, "
                                            f"{preset.context_mode} context; no reconfigure"))
    out.append(Method("decoupled", "a separate call writes configurations, seeing only the spec"))
    for dim in FREEZABLE:
        out.append(Method(f"toolself-freeze:{dim}", f"ablation: ToolSelf with the {dim} held fixed"))
    return out


def presets() -> list[Method]:
    """The run presets (`--preset NAME`), for `toolself methods`."""
    return [Method(f"--preset {name}", load_run_preset(name).summary) for name in run_preset_names()]


def settings_for(method: str, freeze: tuple[str, ...] = (), **overrides: Any) -> AgentSettings:
    """AgentSettings for a method name; `overrides` set budgets and the like."""
    if method.startswith("toolself-freeze:"):
        freeze = tuple(freeze) + tuple(method.split(":", 1)[1].split("+"))
        method_base = "toolself"
    else:
        method_base = method
    if method_base == "toolself":
        settings = AgentSettings(method=method, freeze=tuple(dict.fromkeys(freeze)), **overrides)
    elif method_base == "decoupled":
        settings = AgentSettings(method=method, configurator="decoupled", freeze=tuple(freeze), **overrides)
    elif method_base == "vanilla" or method_base.startswith("static:"):
        if freeze:
            raise ValueError(f"{method} has no configuration to freeze")
        preset = VANILLA if method_base == "vanilla" else load_preset(method_base.split(":", 1)[1])
        # One stage holding ToolSelf's whole action budget: compared at equal actions, not at
        # one stage's worth of them.
        total = AgentSettings(**overrides).total_steps
        settings = AgentSettings(method=method, configurator="preset", reconfigure=False, preset=preset,
                                 **{**overrides, "max_stages": 1, "max_steps_per_stage": total,
                                    "max_total_steps": total})
    else:
        raise ValueError(f"unknown method {method!r}; see `toolself methods`")
    if freeze and method_base == "toolself" and not method.startswith("toolself-freeze:"):
        settings = replace(settings, method=f"toolself-freeze:{'+'.join(settings.freeze)}")
    return settings
