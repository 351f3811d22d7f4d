"""How the agent loop runs: the one settings record that every method of the paper is a value of.

Kept apart from the loop so that the things that only describe a run (the variants, the
runner's run file, the CLI's options) can name and validate its settings without the loop's
machinery, and so that the loop reads as the loop. A setting is checked once, here, when the
record is made: the loop trusts what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolself.config import Configuration
from toolself.context import MODES, make_mode

FREEZABLE = ("subgoal", "strategy", "toolbox", "knowledge", "mode")
CONFIGURATORS = ("policy", "decoupled", "preset")
DIALECTS = ("toolself", "official")


@dataclass
class AgentSettings:
    """How the loop runs. The paper's variants differ only in these fields (see `variants`).

    configurator: who writes configurations: `policy` (the acting model, in its own context:
    ToolSelf), `decoupled` (a separate call that sees only the spec), `preset` (a fixed
    configuration, no reconfiguration: vanilla and static agents).
    freeze: dimensions held fixed whatever the policy writes (the one-dimension ablations):
    subgoal -> the main task, strategy -> generic, toolbox -> the whole pool, knowledge -> none,
    mode -> basic.
    max_total_steps: actions across all stages (default max_stages x max_steps_per_stage).
    context_limit: the tokens the model can read at once; an action turn whose visible context
    still exceeds it after the mode's trimming asks for the final answer instead (None: never).
    max_reply_chars: the most characters kept of a reply's text and of each call's arguments; a
    call with longer arguments is not run (the model is told the limit).
    max_observation_chars: the most characters kept of a tool's observation.
    modes: the context modes offered to the policy, with their parameters (default: one of
    each registered mode, as it comes; names or `{"type": ..., **parameters}` are accepted).
    config_attempts: configuration calls before the fallback (the first and its repairs).
    dialect: how the special tools and the knowledge field are shown to the policy: toolself's
    own, or the authors' (`reconfigure(execution_summary, update_reason, new_sub_goal,
    additional_details)`, `terminate(status, result, summary)`); both are always accepted.
    prompts: a folder under toolself/prompts whose templates replace the default ones.
    answer_on_timeout: when the time limit ends the attempt, ask the policy for its best answer
    (False: the attempt ends without one, so a timeout scores wrong).
    crash_retries: attempts run again after one that crashed (`end_reason` error).
    """

    method: str = "toolself"
    configurator: str = "policy"
    reconfigure: bool = True
    preset: Configuration | None = None
    freeze: tuple[str, ...] = ()
    modes: tuple[Any, ...] = field(default_factory=lambda: tuple(MODES))
    max_stages: int = 6
    max_steps_per_stage: int = 12
    max_total_steps: int | None = None
    max_total_tokens: int | None = 200_000
    time_limit: float | None = None
    context_budget: int = 8_000
    max_tokens_per_call: int | None = None
    config_max_text: int | None = None
    context_limit: int | None = None
    max_reply_chars: int = 100_000
    max_observation_chars: int = 100_000
    config_attempts: int = 2
    dialect: str = "toolself"
    prompts: str = ""
    answer_on_timeout: bool = True
    crash_retries: int = 0

    def __post_init__(self) -> None:
        if self.configurator not in CONFIGURATORS:
            raise ValueError(f"configurator must be one of {CONFIGURATORS}, not {self.configurator!r}")
        if self.configurator == "preset" and self.preset is None:
            raise ValueError("the preset configurator needs a preset configuration")
        unknown = [f for f in self.freeze if f not in FREEZABLE]
        if unknown:
            raise ValueError(f"cannot freeze {unknown}; freezable dimensions: {list(FREEZABLE)}")
        self.modes = tuple(make_mode(m) for m in self.modes)
        names = [m.name for m in self.modes]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"modes must name each context mode once, not {names}")
        if self.preset is not None and self.preset.context_mode not in names:
            raise ValueError(f"the preset's context mode {self.preset.context_mode!r} is not offered: {names}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, not {self.dialect!r}")
        if self.crash_retries < 0:
            raise ValueError("crash_retries must be at least 0")
        for name in ("max_stages", "max_steps_per_stage", "max_total_tokens", "context_budget", "config_attempts",
                     "max_total_steps", "context_limit", "max_reply_chars", "max_observation_chars"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    @property
    def total_steps(self) -> int:
        return self.max_total_steps or self.max_stages * self.max_steps_per_stage

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["preset"] = self.preset.to_dict() if self.preset else None
        out["freeze"] = list(self.freeze)
        out["modes"] = [m.to_dict() for m in self.modes]
        return out

    @property
    def mode_names(self) -> list[str]:
        return [m.name for m in self.modes]
