"""The paper's comparisons as settings of the one agent loop.

    toolself          unified: the acting policy writes every configuration in its own context
    vanilla           one ReAct stage, whole pool, generic prompt, no reconfigure tool
    static:NAME       a fixed specialised preset (research, general, swe), no reconfigure tool
                      (both single-stage methods get ToolSelf's whole action budget,
                      its max_total_steps, in their one stage)
    decoupled         configurations written by a separate call that sees only the spec

Ablations freeze one or more dimensions of ToolSelf (`toolself --freeze knowledge`, or the
method name `toolself-freeze:knowledge+subgoal`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from toolself.agent import FREEZABLE, AgentSettings
from toolself.config import GENERIC_STRATEGY, Configuration


@dataclass(frozen=True)
class Method:
    name: str
    summary: str


def _preset_names() -> list[str]:
    folder = resources.files("toolself") / "presets"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> Configuration:
    folder = resources.files("toolself") / "presets"
    path = folder / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown static preset {name!r}; available: {_preset_names()}")
    return Configuration.from_dict(json.loads(path.read_text()))


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
