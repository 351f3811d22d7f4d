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

This module holds the loop itself; what it runs under is `agent_settings`, each model call and
tool result within its bounds is `turns`, and what a configuration becomes is `stage_setup`.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from toolself.agent_settings import FREEZABLE, AgentSettings
from toolself.config import Configuration, configuration_schema, fallback_configuration, parse_configuration
from toolself.context import ContextMode
from toolself.history import HistoryPool
from toolself.models.base import ChatModel, Completion, Message
from toolself.stage_setup import StageSetup, render
from toolself.tools.base import Observation, Tool, ToolArgumentError, ToolContext, ToolPool
from toolself.tools.special import RECONFIGURE, SPECIAL_TOOLS, TERMINATE, canonical_arguments
from toolself.trajectory import Conversation, Stage, Step, Trajectory
from toolself.turns import BudgetExhausted, Turns

__all__ = ["FREEZABLE", "Agent", "AgentSettings", "BudgetExhausted", "Observer", "interrupted_attempt", "render"]

# After the time limit, the policy's last call (its best answer) gets this share of the limit.
FINAL_ANSWER_GRACE = 0.1


class Observer:
    """Live progress hooks (the CLI prints with them). Every method is optional."""

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None: ...

    def step(self, trajectory: Trajectory, stage: Stage, step: Step) -> None: ...

    def configuration_rejected(self, trajectory: Trajectory, problems: list[str]) -> None: ...

    def finished(self, trajectory: Trajectory) -> None: ...


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
        refused = sorted(getattr(self.model, "refused_fields", ()))
        if refused:  # sent without these, the server sampled at its own defaults (`openai_compat`)
            trajectory.metadata["model_refused_fields"] = refused
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
    """The state of one attempt: its trajectory, history pool, stage and actions so far. Its turns
    with the model (and their budgets) are `Turns`'; what its configurations become, `StageSetup`'s."""

    def __init__(self, agent: Agent, trajectory: Trajectory, ctx: ToolContext, cancel: threading.Event | None):
        self.agent = agent
        self.s = agent.settings
        self.trajectory = trajectory
        self.ctx = ctx
        self.history = HistoryPool()
        self.started = time.monotonic()
        self.setup = StageSetup(agent.settings, agent.pool, trajectory, self.history)
        self.turns = Turns(agent.settings, agent.model, trajectory, cancel,
                           self.started + self.s.time_limit if self.s.time_limit else None)
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
            return self.setup.resolve_preset(), "preset", [], None
        conversation = Conversation([Message("system", self.setup.render("setup_system.j2")),
                                     Message("user", self.setup.spec(request=None))])
        model = self.agent.config_model if self.s.configurator == "decoupled" else self.agent.model
        config, source, problems = self.write_configuration(conversation, model, subgoal=self.trajectory.task)
        return config, source, problems, conversation

    def next_stage(self, request: dict[str, Any]) -> None:
        stage = self.stage
        assert stage is not None
        if self.s.configurator == "decoupled":
            spec = self.setup.spec(request)
            conversation = Conversation([Message("system", self.setup.render("setup_system.j2")),
                                         Message("user", spec)])
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
        config, frozen = self.setup.apply_freeze(config)
        index = len(self.trajectory.stages)
        system = self.setup.render("stage_system.j2", strategy=config.strategy, task=self.trajectory.task,
                                   subgoal=config.subgoal, knowledge=self.setup.knowledge(config),
                                   reconfigure=self.s.reconfigure, configuration=config,
                                   mode=self.setup.modes[config.context_mode])
        user = self.setup.render("stage_user.j2", task=self.trajectory.task, subgoal=config.subgoal,
                                 tools=[t.schema for t in self.setup.stage_tools(config)])
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
        tools = self.setup.stage_tools(stage.configuration)
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
                    Message("user", self.setup.render("no_tool_call.j2", tools=list(by_name))))
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
            result = self.setup.spec(arguments)
        self.respond(stage, tool_call, Observation(result), call_index, canonical=arguments)
        return _StageEnd("reconfigure", arguments)

    def forced_reconfigure(self, stage: Stage) -> _StageEnd:
        """One turn offering only `reconfigure`, recorded as a `forced_reconfigure` call, and the
        next stage's request marked `forced: steps`. A reply that is not a valid reconfigure
        still ends the stage, with a summary saying so and the same sub-goal."""
        reconfigure_tool = self.setup.special(RECONFIGURE)
        stage.conversation.messages.append(
            Message("user", self.setup.render("forced_reconfigure.j2", steps=self.s.max_steps_per_stage)))
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
                stage.conversation.messages.append(Message("user", self.setup.spec(arguments)))
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
        conversation.messages.append(Message("user", self.setup.render("budget.j2", budget=budget)))
        if budget in ("time", "cancelled"):
            grace = FINAL_ANSWER_GRACE * self.s.time_limit if self.s.time_limit else None
            self.turns.final_deadline = time.monotonic() + grace if grace is not None else None
        try:
            completion, _ = self.decide(conversation, "final", [self.setup.special(TERMINATE).schema], check=False)
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

    def write_configuration(self, conversation: Conversation, model: ChatModel,
                            subgoal: str) -> tuple[Configuration, str, list[str]]:
        """Ask for a configuration; one repair on a precise error; then the documented fallback."""
        form = self.s.dialect
        schema = configuration_schema(self.setup.tool_names, list(self.setup.modes), self.s.config_max_text, form)
        problems: list[str] = []
        for attempt in range(self.s.config_attempts):
            completion, call_index = self.decide(conversation, "configure", self.config_tools(conversation),
                                                 response_schema=schema, model=model, check=False)
            parsed = parse_configuration(completion.message.content, self.setup.tool_names, list(self.setup.modes),
                                         self.s.config_max_text, form)
            if parsed.configuration is not None:
                return parsed.configuration, "policy" if attempt == 0 else "repaired", problems
            conversation.calls[call_index].problems = parsed.problems
            problems.extend(parsed.problems)
            self.agent.observer.configuration_rejected(self.trajectory, parsed.problems)
            if attempt + 1 < self.s.config_attempts:
                conversation.messages.append(Message("user", self.setup.render("repair.j2", problems=parsed.problems)))
        previous = self.stage.configuration if self.stage else None
        return (fallback_configuration(subgoal, self.setup.tool_names, previous, default_mode=self.setup.default_mode),
                "fallback", problems)

    def config_tools(self, conversation: Conversation) -> list[dict[str, Any]] | None:
        """The tools shown during a configuration turn: the same as the turns before it, so the
        prompt prefix (and a backend's KV cache) is unchanged. The reply is still JSON: the
        response schema takes precedence."""
        if self.stage is not None and conversation is self.stage.conversation:
            return [t.schema for t in self.setup.stage_tools(self.stage.configuration)]
        return None

    # -- turns -------------------------------------------------------------------------------

    def decide(self, conversation: Conversation, kind: str, tools: list[dict[str, Any]] | None,
               response_schema: dict[str, Any] | None = None, model: ChatModel | None = None,
               check: bool = True) -> tuple[Completion, int]:
        """One model call, under the current stage's context mode; the reply joins the conversation."""
        mode = self.setup.modes[self.stage.configuration.context_mode] if self.stage else ContextMode()
        return self.turns.decide(conversation, kind, tools, mode, response_schema, model, check)

    def respond(self, stage: Stage, tool_call, observation: Observation, call_index: int,
                duration: float = 0.0, canonical: dict[str, Any] | None = None) -> None:
        """The observation joins the stage, and the observer hears of the step."""
        step = self.turns.respond(stage, tool_call, observation, call_index, duration, canonical)
        self.agent.observer.step(self.trajectory, stage, step)
