"""How a configuration becomes a stage, under the agent's settings: the prompts it is rendered
into, the tools it offers, the preset and the frozen dimensions that override what the policy
wrote, the knowledge it carries, and the specification the policy writes the next one from.

These are functions of the settings, the tool pool, the task and the history pool alone, never of
the model or of a stage in progress, so they sit apart from the loop (see `agent`), which asks
for a configuration, opens the stage and runs it. Prompts are Jinja templates under
`toolself/prompts`; a settings' `prompts` folder replaces any of them by name.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from importlib import resources
from typing import Any

import jinja2

from toolself.agent_settings import AgentSettings
from toolself.config import GENERIC_STRATEGY, Configuration
from toolself.context import describe_modes
from toolself.history import HistoryPool
from toolself.tools.base import Tool, ToolPool
from toolself.tools.special import OFFICIAL_TOOLS, RECONFIGURE, SPECIAL_TOOLS, TERMINATE
from toolself.trajectory import Trajectory


@functools.lru_cache(maxsize=None)
def _templates() -> jinja2.Environment:
    folder = resources.files("toolself") / "prompts"
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), keep_trailing_newline=False,
                              undefined=jinja2.StrictUndefined, autoescape=False)


def render(name: str, **values: Any) -> str:
    return _templates().get_template(name).render(**values).strip()


@functools.lru_cache(maxsize=None)
def template_name(folder: str, name: str) -> str:
    """`folder/name` when that folder has its own version of the template, else `name`."""
    if folder and (resources.files("toolself") / "prompts" / folder / name).is_file():
        return f"{folder}/{name}"
    return name


class StageSetup:
    """What one attempt's configurations turn into. It keeps no state of its own: the trajectory
    and the history pool are the attempt's, read as they are when a method is called."""

    def __init__(self, settings: AgentSettings, pool: ToolPool, trajectory: Trajectory, history: HistoryPool):
        self.s = settings
        self.pool = pool
        self.trajectory = trajectory
        self.history = history
        self.tool_names = pool.names
        self.modes = {m.name: m for m in settings.modes}

    def spec(self, request: dict[str, Any] | None) -> str:
        """The configuration-generation specification z_i."""
        return self.render("spec.j2", initial=request is None, stage=len(self.trajectory.stages) - 1,
                           task=self.trajectory.task, catalogue=self.pool.catalogue(),
                           modes=describe_modes(list(self.modes.values())), mode_names=list(self.modes),
                           history=self.history.render(), request=request,
                           schemas=[t.schema for t in self.pool], special=[self.special(RECONFIGURE).schema,
                                                                           self.special(TERMINATE).schema])

    def render(self, name: str, **values: Any) -> str:
        """A prompt template, from the settings' prompt folder when it has its own."""
        return render(template_name(self.s.prompts, name), **values)

    def special(self, name: str) -> Tool:
        """`reconfigure` or `terminate` as the settings' dialect shows it."""
        return (OFFICIAL_TOOLS if self.s.dialect == "official" else SPECIAL_TOOLS)[name]

    @property
    def default_mode(self) -> str:
        return "basic" if "basic" in self.modes else next(iter(self.modes))

    def resolve_preset(self) -> Configuration:
        preset = self.s.preset
        assert preset is not None
        toolbox = [n for n in preset.toolbox if n in self.pool] if preset.toolbox else list(self.tool_names)
        return replace(preset, subgoal=preset.subgoal.replace("{task}", self.trajectory.task) or self.trajectory.task,
                       toolbox=toolbox)

    def apply_freeze(self, config: Configuration) -> tuple[Configuration, list[str]]:
        frozen = list(self.s.freeze)
        if not frozen or self.s.configurator == "preset":
            return config, []
        changes: dict[str, Any] = {}
        if "subgoal" in frozen:
            changes["subgoal"] = self.trajectory.task
        if "strategy" in frozen:
            changes["strategy"] = GENERIC_STRATEGY
        if "toolbox" in frozen:
            changes["toolbox"] = list(self.tool_names)
        if "knowledge" in frozen:
            changes.update(knowledge="none", knowledge_summary="")
        if "mode" in frozen:
            changes["context_mode"] = self.default_mode
        return replace(config, **changes), frozen

    def knowledge(self, config: Configuration) -> str:
        if config.knowledge == "history":
            return self.history.render(empty="") if len(self.history) else ""
        if config.knowledge == "summary":
            return config.knowledge_summary
        return ""

    def stage_tools(self, config: Configuration) -> list[Tool]:
        tools = self.pool.subset(config.toolbox)
        if self.s.reconfigure:
            tools.append(self.special(RECONFIGURE))
        tools.append(self.special(TERMINATE))
        return tools
