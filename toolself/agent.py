"""The one agent loop. Every method of the paper (ToolSelf, vanilla, static presets, decoupled,
ablations) is a setting of it, never a copy of it.

An attempt is a sequence of stages. Stage i runs under a configuration C_i and starts from a
fresh context built from C_i alone. The policy acts through tool calls; `reconfigure` archives
the stage's summary in the history pool and returns the configuration-generation spec as its
tool result, and the *same model in the same context* then writes C_{i+1}. `terminate` ends
the attempt. A stage that spends its step budget while stages remain is not the end: the
policy gets one forced `reconfigure` turn (the paper's shape: a stage budget moves the work
on, it does not quit). The attempt ends when its total action budget, its stages, its tokens,
its wall clock or its context run out, after asking the policy once for its best answer.
Nothing the model writes can crash the loop: each malformed output becomes an observation it
can act on, recorded in the trajectory. Nor can the model hold the loop: a call still running
at the time limit is abandoned (see `bounded`); what it wrote and what tools returned are
capped before they are recorded; and Ctrl-C ends the attempt as `interrupted`, its trajectory
kept (see `Agent.run`).
"""

from __future__ import annotations

import functools
import json
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import jinja2

from toolself.bounded import Abandoned, call_within
from toolself.config import (
    GENERIC_STRATEGY,
    Configuration,
    configuration_schema,
    fallback_configuration,
    parse_configuration,
)
from toolself.context import MODES, ContextMode, describe_modes, make_mode
from toolself.history import HistoryPool
from toolself.models.base import ChatModel, Completion, Message, ToolCall
from toolself.tools.base import Observation, Tool, ToolArgumentError, ToolContext, ToolPool
from toolself.tools.special import OFFICIAL_TOOLS, RECONFIGURE, SPECIAL_TOOLS, TERMINATE, canonical_arguments
from toolself.trajectory import Conversation, ModelCall, Stage, Step, Trajectory

FREEZABLE = ("subgoal", "strategy", "toolbox", "knowledge", "mode")
CONFIGURATORS = ("policy", "decoupled", "preset")
DIALECTS = ("toolself", "official")
# After the time limit, the policy's last call (its best answer) gets this share of the limit.
FINAL_ANSWER_GRACE = 0.1


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


class Observer:
    """Live progress hooks (the CLI prints with them). Every method is optional."""

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None: ...

    def step(self, trajectory: Trajectory, stage: Stage, step: Step) -> None: ...

    def configuration_rejected(self, trajectory: Trajectory, problems: list[str]) -> None: ...

    def finished(self, trajectory: Trajectory) -> None: ...


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


class BudgetExhausted(Exception):
    def __init__(self, budget: str):
        super().__init__(budget)
        self.budget = budget


class Agent:
    """A policy model, a tool pool and settings. Stateless between attempts, so one agent can
    run many attempts concurrently from several threads."""

    def __init__(self, model: ChatModel, pool: ToolPool, settings: AgentSettings | None = None,
                 config_model: ChatModel | None = None, observer: Observer | None = None):
        self.model = model
        self.pool = pool
        self.settings = settings or AgentSettings()
        self.config_model = config_model or model
        self.observer = observer or Observer()
        clash = [n for n in SPECIAL_TOOLS if n in pool]
        if clash:
            raise ValueError(f"the pool must not define {clash}: the agent provides them")

    def run(self, task: str, ctx: ToolContext | None = None, task_id: str = "",
            metadata: dict[str, Any] | None = None, cancel: threading.Event | None = None) -> Trajectory:
        """Run one attempt at `task` and return its trajectory (never raises for model or tool
        failures: those end the attempt with `end_reason` and `error` set).

        KeyboardInterrupt and SystemExit, wherever they come from (the user's Ctrl-C, a model),
        end the attempt as `interrupted` and then go on, carrying the trajectory so far as
        their `trajectory` attribute, so that a caller can keep it (see `interrupted_attempt`)."""
        own_ctx = ctx is None
        ctx = ctx or ToolContext.temporary(model=self.model)
        if ctx.model is None:
            ctx.model = self.model
        crashed: list[str] = []  # a crashed attempt is run again, `crash_retries` times, in the same context
        try:
            while True:
                trajectory = Trajectory(task=task, task_id=task_id, method=self.settings.method,
                                        model=getattr(self.model, "name", type(self.model).__name__),
                                        settings=self.settings.to_dict(), metadata=dict(metadata or {}))
                if crashed:
                    trajectory.metadata["crashed_before"] = list(crashed)
                self._attempt(trajectory, ctx, cancel)
                if trajectory.end_reason != "error" or len(crashed) >= self.settings.crash_retries:
                    break
                crashed.append(trajectory.error or "")
        finally:
            if own_ctx:
                ctx.close()
        self.observer.finished(trajectory)
        return trajectory

    def _attempt(self, trajectory: Trajectory, ctx: ToolContext, cancel: threading.Event | None) -> None:
        try:
            _Attempt(self, trajectory, ctx, cancel).run()
        except (KeyboardInterrupt, SystemExit) as exc:
            trajectory.end_reason = "interrupted"
            trajectory.error = None if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
            exc.trajectory = trajectory  # type: ignore[union-attr]
            raise
        finally:
            self.model.end_session(trajectory.id)


def interrupted_attempt(exc: BaseException) -> Trajectory | None:
    """The trajectory an interrupt carried out of `Agent.run`, if it came from there."""
    trajectory = getattr(exc, "trajectory", None)
    return trajectory if isinstance(trajectory, Trajectory) else None


@dataclass
class _StageEnd:
    kind: str  # terminate | reconfigure
    arguments: dict[str, Any] = field(default_factory=dict)


class _Attempt:
    """The state of one attempt: its trajectory, history pool and budgets."""

    def __init__(self, agent: Agent, trajectory: Trajectory, ctx: ToolContext, cancel: threading.Event | None):
        self.agent = agent
        self.s = agent.settings
        self.trajectory = trajectory
        self.ctx = ctx
        self.cancel = cancel
        self.history = HistoryPool()
        self.started = time.monotonic()
        self.deadline = self.started + self.s.time_limit if self.s.time_limit else None
        self.final_deadline = self.deadline
        self.cut_arguments: dict[int, int] = {}  # id(ToolCall) -> characters its arguments had
        self.tool_names = agent.pool.names
        self.modes = {m.name: m for m in self.s.modes}
        self._token_counts: dict[int, list[int]] = {}
        self.stage: Stage | None = None
        self.actions = 0

    # -- the attempt -------------------------------------------------------------------------

    def run(self) -> None:
        t = self.trajectory
        try:
            config, source, problems, conversation = self.first_configuration()
            self.open_stage(config, source, problems, conversation, request=None)
            while True:
                end = self.run_stage()
                if end.kind == "terminate":
                    t.answer = end.arguments["answer"]
                    t.end_reason = "terminate"
                    break
                self.next_stage(end.arguments)
        except BudgetExhausted as exc:
            self.ask_final_answer(exc.budget)
        except Exception as exc:
            t.end_reason = "error"
            t.error = "".join(traceback.format_exception(exc)).strip()
        finally:
            if self.stage is not None:
                self.stage.duration = time.monotonic() - self.stage.started
            t.history = self.history.to_list()
            t.duration = time.monotonic() - self.started

    def first_configuration(self) -> tuple[Configuration, str, list[str], Conversation | None]:
        """C_0, written by the policy from the spec with an empty history (or a preset)."""
        if self.s.configurator == "preset":
            return self.resolve_preset(), "preset", [], None
        conversation = Conversation([Message("system", self.render("setup_system.j2")),
                                     Message("user", self.spec(request=None))])
        model = self.agent.config_model if self.s.configurator == "decoupled" else self.agent.model
        config, source, problems = self.write_configuration(conversation, model, subgoal=self.trajectory.task)
        return config, source, problems, conversation

    def next_stage(self, request: dict[str, Any]) -> None:
        stage = self.stage
        assert stage is not None
        if self.s.configurator == "decoupled":
            spec = self.spec(request)
            conversation = Conversation([Message("system", self.render("setup_system.j2")), Message("user", spec)])
            config, source, problems = self.write_configuration(conversation, self.agent.config_model,
                                                                request["next_subgoal"])
        else:
            conversation = None
            config, source, problems = self.write_configuration(stage.conversation, self.agent.model,
                                                                request["next_subgoal"])
        self.open_stage(config, source, problems, conversation, request)

    def open_stage(self, config: Configuration, source: str, problems: list[str],
                   config_conversation: Conversation | None, request: dict[str, Any] | None) -> None:
        if self.stage is not None:
            self.stage.duration = time.monotonic() - self.stage.started
        config, frozen = self.apply_freeze(config)
        index = len(self.trajectory.stages)
        system = self.render("stage_system.j2", strategy=config.strategy, task=self.trajectory.task,
                             subgoal=config.subgoal, knowledge=self.knowledge(config),
                             reconfigure=self.s.reconfigure, configuration=config,
                             mode=self.modes[config.context_mode])
        user = self.render("stage_user.j2", task=self.trajectory.task, subgoal=config.subgoal,
                           tools=[t.schema for t in self.stage_tools(config)])
        stage = Stage(index=index, configuration=config, config_source=source, config_problems=problems,
                      frozen=frozen, request=request, config_conversation=config_conversation,
                      conversation=Conversation([Message("system", system), Message("user", user)]),
                      started=time.monotonic())
        self.trajectory.stages.append(stage)
        self.stage = stage
        self.agent.observer.stage_started(self.trajectory, stage)

    def run_stage(self) -> _StageEnd:
        stage = self.stage
        assert stage is not None
        tools = self.stage_tools(stage.configuration)
        schemas = [t.schema for t in tools]
        by_name = {t.name: t for t in tools}
        actions = 0
        while True:
            if self.actions >= self.s.total_steps:
                raise BudgetExhausted("steps")
            if actions >= self.s.max_steps_per_stage:
                if self.s.reconfigure and len(self.trajectory.stages) < self.s.max_stages:
                    return self.forced_reconfigure(stage)
                raise BudgetExhausted("steps")
            completion, call_index = self.decide(stage.conversation, "action", schemas)
            actions += 1
            self.actions += 1
            message = completion.message
            if not message.tool_calls:
                stage.conversation.messages.append(
                    Message("user", self.render("no_tool_call.j2", tools=list(by_name))))
                continue
            end: _StageEnd | None = None
            for tool_call in message.tool_calls:
                if end is not None:
                    self.respond(stage, tool_call, Observation(
                        "Not run: an earlier call in the same reply ended the stage.", is_error=True), call_index)
                    continue
                end = self.handle_call(stage, tool_call, by_name, call_index)
            if end is not None:
                return end

    def handle_call(self, stage: Stage, tool_call, by_name: dict[str, Tool], call_index: int) -> _StageEnd | None:
        """Run one tool call; return how the stage ends if the call ends it."""
        name = tool_call.name
        if tool_call.error:
            label = f"Your call to {name!r}" if name else "Your tool call"
            self.respond(stage, tool_call, Observation(f"{label} could not be read: {tool_call.error}. "
                                                       "Send the call again with valid JSON arguments.", is_error=True),
                         call_index)
            return None
        if name not in by_name:
            available = ", ".join(by_name)
            hint = (" To get a tool that is not in this stage's toolbox, call reconfigure with a toolbox_request."
                    if self.s.reconfigure and name in self.agent.pool else "")
            self.respond(stage, tool_call, Observation(
                f"There is no tool {name!r} in this stage. Available: {available}.{hint}", is_error=True), call_index)
            return None
        tool = by_name[name]
        if name in SPECIAL_TOOLS:
            try:
                arguments = canonical_arguments(name, tool_call.arguments or {})
            except ToolArgumentError as exc:
                self.respond(stage, tool_call, Observation(str(exc), is_error=True), call_index)
                return None
            if name == TERMINATE:
                self.respond(stage, tool_call, Observation("The task is ended."), call_index, canonical=arguments)
                stage.end = "terminate"
                return _StageEnd("terminate", arguments)
            return self.reconfigure(stage, tool_call, arguments, call_index)
        started = time.perf_counter()
        observation = tool(tool_call.arguments or {}, self.ctx)
        self.respond(stage, tool_call, observation, call_index, time.perf_counter() - started)
        return None

    def reconfigure(self, stage: Stage, tool_call, arguments: dict[str, Any], call_index: int) -> _StageEnd:
        arguments = {k: v for k, v in arguments.items() if v is not None}
        stage.summary, stage.reason, stage.end = arguments["summary"], arguments["reason"], "reconfigure"
        self.history.archive(stage.index, stage.configuration.subgoal, arguments["summary"], arguments["reason"])
        if len(self.trajectory.stages) >= self.s.max_stages:
            self.respond(stage, tool_call, Observation(
                f"The summary is archived, but no stage is left (at most {self.s.max_stages}).", is_error=True),
                call_index)
            raise BudgetExhausted("stages")
        if self.s.configurator == "decoupled":
            result = "The summary is archived. The next configuration is written separately."
        else:
            result = self.spec(arguments)
        self.respond(stage, tool_call, Observation(result), call_index, canonical=arguments)
        return _StageEnd("reconfigure", arguments)

    def forced_reconfigure(self, stage: Stage) -> _StageEnd:
        """One turn offering only `reconfigure`, recorded as a `forced_reconfigure` call, and the
        next stage's request marked `forced: steps`. A reply that is not a valid reconfigure
        still ends the stage, with a summary saying so and the same sub-goal."""
        reconfigure_tool = self.special(RECONFIGURE)
        stage.conversation.messages.append(
            Message("user", self.render("forced_reconfigure.j2", steps=self.s.max_steps_per_stage)))
        completion, call_index = self.decide(stage.conversation, "forced_reconfigure", [reconfigure_tool.schema])
        end: _StageEnd | None = None
        for tool_call in completion.message.tool_calls:
            problem = "Not run: only reconfigure was allowed in this turn."
            if end is None and tool_call.name == RECONFIGURE and not tool_call.error:
                try:
                    arguments = canonical_arguments(RECONFIGURE, tool_call.arguments or {})
                    end = self.reconfigure(stage, tool_call, arguments, call_index)
                    continue
                except ToolArgumentError as exc:
                    problem = str(exc)
            self.respond(stage, tool_call, Observation(problem, is_error=True), call_index)
        if end is None:
            arguments = {"summary": "(no summary: the stage used its step budget without one)",
                         "reason": f"the stage used all {self.s.max_steps_per_stage} of its steps",
                         "next_subgoal": stage.configuration.subgoal}
            stage.summary, stage.reason, stage.end = arguments["summary"], arguments["reason"], "reconfigure"
            self.history.archive(stage.index, stage.configuration.subgoal, arguments["summary"], arguments["reason"])
            if self.s.configurator != "decoupled":
                stage.conversation.messages.append(Message("user", self.spec(arguments)))
            end = _StageEnd("reconfigure", arguments)
        end.arguments["forced"] = "steps"
        return end

    def ask_final_answer(self, budget: str) -> None:
        """A budget ran out: ask the policy once for its best answer, with `terminate` only."""
        t = self.trajectory
        t.end_reason = f"budget:{budget}"
        stage = self.stage
        if stage is None:
            return
        stage.end = stage.end or f"budget:{budget}"
        conversation = stage.conversation
        if budget == "time" and not self.s.answer_on_timeout:
            return
        conversation.messages.append(Message("user", self.render("budget.j2", budget=budget)))
        if budget in ("time", "cancelled"):
            grace = FINAL_ANSWER_GRACE * self.s.time_limit if self.s.time_limit else None
            self.final_deadline = time.monotonic() + grace if grace is not None else None
        try:
            completion, _ = self.decide(conversation, "final", [self.special(TERMINATE).schema], check=False)
        except BudgetExhausted:
            return  # no best answer within the time left: the attempt ends without one
        except Exception as exc:
            t.error = "".join(traceback.format_exception(exc)).strip()
            return
        for tool_call in completion.message.tool_calls:
            if tool_call.name == TERMINATE and not tool_call.error:
                try:
                    t.answer = canonical_arguments(TERMINATE, tool_call.arguments or {})["answer"]
                    return
                except ToolArgumentError:
                    pass
        t.answer = completion.message.content.strip() or None

    # -- configurations ----------------------------------------------------------------------

    def spec(self, request: dict[str, Any] | None) -> str:
        """The configuration-generation specification z_i."""
        return self.render("spec.j2", initial=request is None, stage=len(self.trajectory.stages) - 1,
                           task=self.trajectory.task, catalogue=self.agent.pool.catalogue(),
                           modes=describe_modes(list(self.modes.values())), mode_names=list(self.modes),
                           history=self.history.render(), request=request,
                           schemas=[t.schema for t in self.agent.pool], special=[self.special(RECONFIGURE).schema,
                                                                                 self.special(TERMINATE).schema])

    def render(self, name: str, **values: Any) -> str:
        """A prompt template, from the settings' prompt folder when it has its own."""
        return render(template_name(self.s.prompts, name), **values)

    def special(self, name: str) -> Tool:
        """`reconfigure` or `terminate` as the settings' dialect shows it."""
        return (OFFICIAL_TOOLS if self.s.dialect == "official" else SPECIAL_TOOLS)[name]

    def write_configuration(self, conversation: Conversation, model: ChatModel,
                            subgoal: str) -> tuple[Configuration, str, list[str]]:
        """Ask for a configuration; one repair on a precise error; then the documented fallback."""
        form = self.s.dialect
        schema = configuration_schema(self.tool_names, list(self.modes), self.s.config_max_text, form)
        problems: list[str] = []
        for attempt in range(self.s.config_attempts):
            completion, call_index = self.decide(conversation, "configure", self.config_tools(conversation),
                                                 response_schema=schema, model=model, check=False)
            parsed = parse_configuration(completion.message.content, self.tool_names, list(self.modes),
                                         self.s.config_max_text, form)
            if parsed.configuration is not None:
                return parsed.configuration, "policy" if attempt == 0 else "repaired", problems
            conversation.calls[call_index].problems = parsed.problems
            problems.extend(parsed.problems)
            self.agent.observer.configuration_rejected(self.trajectory, parsed.problems)
            if attempt + 1 < self.s.config_attempts:
                conversation.messages.append(Message("user", self.render("repair.j2", problems=parsed.problems)))
        previous = self.stage.configuration if self.stage else None
        return (fallback_configuration(subgoal, self.tool_names, previous, default_mode=self.default_mode),
                "fallback", problems)

    @property
    def default_mode(self) -> str:
        return "basic" if "basic" in self.modes else next(iter(self.modes))

    def config_tools(self, conversation: Conversation) -> list[dict[str, Any]] | None:
        """The tools shown during a configuration turn: the same as the turns before it, so the
        prompt prefix (and a backend's KV cache) is unchanged. The reply is still JSON: the
        response schema takes precedence."""
        if self.stage is not None and conversation is self.stage.conversation:
            return [t.schema for t in self.stage_tools(self.stage.configuration)]
        return None

    def resolve_preset(self) -> Configuration:
        preset = self.s.preset
        assert preset is not None
        toolbox = [n for n in preset.toolbox if n in self.agent.pool] if preset.toolbox else list(self.tool_names)
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
        tools = self.agent.pool.subset(config.toolbox)
        if self.s.reconfigure:
            tools.append(self.special(RECONFIGURE))
        tools.append(self.special(TERMINATE))
        return tools

    # -- model calls and observations --------------------------------------------------------

    def check_budgets(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise BudgetExhausted("cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise BudgetExhausted("time")
        if self.s.max_total_tokens is not None and self.trajectory.usage.total_tokens >= self.s.max_total_tokens:
            raise BudgetExhausted("tokens")

    def token_counts(self, conversation: Conversation) -> list[int]:
        counts = self._token_counts.setdefault(id(conversation), [])
        count = self.agent.model.count_tokens
        for message in conversation.messages[len(counts):]:
            text = message.content + "".join(c.raw_arguments or json.dumps(c.arguments) for c in message.tool_calls)
            counts.append(count(text) + 4)
        return counts

    def decide(self, conversation: Conversation, kind: str, tools: list[dict[str, Any]] | None,
               response_schema: dict[str, Any] | None = None, model: ChatModel | None = None,
               check: bool = True) -> tuple[Completion, int]:
        """One model call on the stage's current view; the reply joins the conversation."""
        if check:
            self.check_budgets()
        mode = self.modes[self.stage.configuration.context_mode] if self.stage else ContextMode()
        view = mode.view(conversation.messages, self.token_counts(conversation), self.s.context_budget)
        visible = conversation.render(view)
        if check and kind == "action" and self.s.context_limit is not None and \
                sum(self.agent.model.count_tokens(m.content) + 4 for m in visible) > self.s.context_limit:
            raise BudgetExhausted("context")
        model = model or self.agent.model
        deadline, cancel = (self.final_deadline, None) if kind == "final" else (self.deadline, self.cancel)
        try:
            completion = call_within(lambda: model.complete(
                visible, tools=tools, response_schema=response_schema, session=self.trajectory.id,
                max_tokens=self.s.max_tokens_per_call), deadline, cancel)
        except Abandoned as exc:
            raise BudgetExhausted(exc.reason) from None
        message = self.bounded_reply(completion.message)
        completion = replace(completion, message=message)
        conversation.messages.append(message)
        conversation.calls.append(ModelCall(
            kind=kind, view=view, output=len(conversation.messages) - 1,
            tools=[t["function"]["name"] for t in tools or []], response_schema=response_schema is not None,
            usage=completion.usage, latency=completion.latency, completion_token_ids=completion.completion_token_ids))
        self.trajectory.usage = self.trajectory.usage + completion.usage
        return completion, len(conversation.calls) - 1

    def bounded_reply(self, message: Message) -> Message:
        """The reply as the loop records and acts on it: an assistant message whose text is a
        string (None from a backend is an empty reply), with text and reasoning cut at the
        limit, and each call whose arguments are over it kept unrun, as a call that could not
        be read, so that the model is told and the trajectory stays bounded."""
        limit = self.s.max_reply_chars
        calls = []
        for call in message.tool_calls or []:
            raw = call.raw_arguments or (json.dumps(call.arguments) if call.arguments is not None else "")
            if len(raw) > limit or len(call.name or "") > limit:
                call = ToolCall(name=(call.name or "")[:limit], arguments=None, id=call.id, raw_arguments=raw[:limit],
                                error=f"its arguments are {len(raw):,} characters, over the limit of {limit:,}; "
                                      "send the content in smaller pieces")
                self.cut_arguments[id(call)] = len(raw)
            calls.append(call)
        reasoning = _cut(_as_text(message.reasoning), limit) if message.reasoning is not None else None
        return replace(message, role="assistant", content=_cut(_as_text(message.content), limit), tool_calls=calls,
                       reasoning=reasoning)

    def respond(self, stage: Stage, tool_call, observation: Observation, call_index: int,
                duration: float = 0.0, canonical: dict[str, Any] | None = None) -> None:
        content = _as_text(observation.content)
        cut = {"observation": len(content)} if len(content) > self.s.max_observation_chars else {}
        if id(tool_call) in self.cut_arguments:
            cut["arguments"] = self.cut_arguments[id(tool_call)]
        content = _cut(content, self.s.max_observation_chars)
        stage.conversation.messages.append(Message("tool", content, tool_call_id=tool_call.id,
                                                   name=tool_call.name or None))
        step = Step(tool=tool_call.name, arguments=tool_call.arguments, observation=content,
                    is_error=observation.is_error, duration=duration, call=call_index, cut=cut,
                    canonical=canonical if canonical is not None and canonical != tool_call.arguments else None)
        stage.steps.append(step)
        self.agent.observer.step(self.trajectory, stage, step)


def _as_text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit:,} more characters cut: the limit is {limit:,} ...]"
