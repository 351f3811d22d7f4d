"""The expert teacher: the offline stand-in for the paper's large teacher model.

CAT's first stage fine-tunes a student on successful trajectories of a strong teacher (the
paper uses Qwen3-235B). Without such a model offline, `ExpertTeacher` plays its part on the
built-in suites. It knows the generator's ground truth (the hop chain of a research question,
the code that computes a data answer, the planted bugs) but it *acts only through the real
tools*: it searches, visits entries and reads each fact out of the observation text, runs its
Python in the real interpreter and reads the printed result, edits files with the real editor
and runs the real tests. When its reading and the truth part ways (a near-namesake's entry, a
wrong filter) it carries on with what it read, as a model would. So every trajectory it
produces is genuine ToolSelf behaviour: configurations written as JSON on configuration turns
and validated by the loop like any model's, `reconfigure` calls with summaries of what it
actually found at stage boundaries, and a final `terminate`.

`noise` is the probability, at each decision point, of taking a wrong turn: visiting a
near-namesake, computing with the wrong filter or column, editing the wrong line. Most wrong
turns are then noticed and repaired through `reconfigure` with reason "approach failed"; some
are not, and the attempt fails, so rejection sampling has something to reject. All of it is
seeded by (task, seed).

The teacher never crashes the loop: whatever it is shown (an error observation, a budget
message, a preset configuration it did not write, a toolbox without the tool it wanted) it
falls back to terminating with its best answer so far.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Generator

from toolself.config import FIELDS, GENERIC_STRATEGY
from toolself.evals.suites.common import slug
from toolself.evals.suites.research import read_fact
from toolself.evals.task import Task
from toolself.models.base import Completion, Message, SyncModelBase, Usage
from toolself.models.grammar import DEFAULT_MAX_STRING, cap_strings, tool_name, tool_parameters
from toolself.models.scripted import call

RECOVERY_PROBABILITY = 0.75
MAX_WRONG_TURNS = 2

FACTS = {
    "author": "{x} was written by {v}", "publisher": "{x} was published by {v}",
    "work_year": "{x} was published in {v}", "founder": "{x} was founded by {v}",
    "org_year": "{x} was founded in {v}", "hq": "{x} is headquartered in {v}",
    "born_city": "{x} was born in {v}", "birth_year": "{x} was born in {v}",
    "employer": "{x} works for {v}", "province": "{x} is in the province of {v}",
}
WANTS = {
    "author": "author", "publisher": "publisher", "work_year": "publication year", "founder": "founder",
    "org_year": "founding year", "hq": "headquarters city", "born_city": "birthplace",
    "birth_year": "birth year", "employer": "employer", "province": "province",
}


@dataclass
class Config:
    subgoal: str
    strategy: str
    toolbox: list[str]
    knowledge: str = "none"
    knowledge_summary: str = ""
    context_mode: str = "basic"


@dataclass
class TeacherEvent:
    kind: str  # wrong_turn | recovered | gave_up | fallback
    detail: str


@dataclass
class _Walk:
    facts: list[str] = field(default_factory=list)


Plan = Generator[Any, Any, None]

RESEARCH_STRATEGY = (
    "You are a meticulous researcher answering a multi-hop question one hop at a time. For each hop: "
    "1) search for the entity by its exact name; 2) among the results pick the entry whose title is exactly "
    "that name (decision point: near-namesakes such as relatives, sister organisations and sequels also "
    "appear; never take one of them); 3) visit it and read the one fact the hop needs; 4) use that value as "
    "the entity of the next hop. Call reconfigure when the sub-goal's hops are done or if you read the wrong "
    "entry.")
DATA_INSPECT_STRATEGY = (
    "You are a data analyst. Use code_interpreter to print the header and the first rows of each file the "
    "question names, and note the exact column names and value formats. Decision point: if a file does not "
    "look as expected, inspect it further before computing anything. Then reconfigure with what you saw.")
DATA_COMPUTE_STRATEGY = (
    "You are a data analyst. Write Python in code_interpreter that reads the files with the csv / json / "
    "openpyxl modules, applies exactly the filters and joins the question asks for, and prints one number. "
    "Decision point: check that every condition of the question is in the code before trusting the number. "
    "Then terminate with the number alone.")
CODE_LOCATE_STRATEGY = (
    "You are a careful software engineer. 1) Run the test command with execute_bash and read which tests "
    "fail and why. 2) Open the module of each failing test with str_replace_editor view. 3) Find the line "
    "that contradicts the function's docstring and the failing assertion. Reconfigure with the exact file, "
    "line and fix once every failure is explained.")
CODE_FIX_STRATEGY = (
    "You are a careful software engineer. Apply each fix with str_replace_editor str_replace (old_str copied "
    "exactly), then rerun the tests with execute_bash. Decision point: if tests still fail, undo the edit that "
    "did not help and reconsider. Never edit the tests. Terminate once the whole test suite passes.")

SETTING_STRATEGY = (
    "You are a careful software engineer. Open the file with str_replace_editor view, replace the placeholder "
    "with the value found earlier using str_replace (old_str copied exactly), then run the tests with "
    "execute_bash. Decision point: if the tests fail, read why before changing anything else. Terminate once "
    "they pass.")


def one_line(text: str, limit: int | None = None) -> str:
    """`text` as the constrained student can write it in a capped string (one line, no double
    quote, no backslash, at most `limit` characters): the student is trained on what the
    teacher writes, so the teacher writes nothing the student's grammar forbids
    (docs/notes/2026-12-02-x2-top-12-layers-and-three-grammar-mismatches.md)."""
    text = re.sub(r"\s*\n\s*", " | ", text.strip())
    text = re.sub(r"[\x00-\x1f]", " ", text.replace('"', "'").replace("\\", "/"))
    if limit is not None and len(text) > limit:
        text = text[:limit - 3].rstrip() + "..."
    return text


def _number(text: str | None) -> str | None:
    """The last number printed in a Python observation."""
    if not text:
        return None
    body = text.split("[error]")[0]
    found = re.findall(r"^\s*(-?\d+(?:\.\d+)?)\s*$", body, re.MULTILINE)
    if not found:
        return None
    value = found[-1]
    return value[:-2] if value.endswith(".0") else value


class ExpertTeacher(SyncModelBase):
    """A per-task scripted expert that acts through the real tools (see the module docs)."""

    def __init__(self, task: Task, noise: float = 0.0, seed: int = 0, name: str = "expert-teacher"):
        if task.family not in ("research", "data", "code", "mixed"):
            raise ValueError(f"the expert teacher solves the built-in suites, not {task.family!r} tasks")
        if not 0.0 <= noise <= 1.0:
            raise ValueError("noise must be between 0 and 1")
        self.task = task
        self.noise = noise
        self.name = name
        self.rng = random.Random(f"teacher:{task.id}:{seed}")
        self.best_answer: str | None = None
        self.events: list[TeacherEvent] = []
        self._plan: Plan = getattr(self, f"_plan_{task.family}")()
        self._started = False
        self._done = False
        self._pending: Any = None
        self._current: Config | None = None
        self._pool_tools: list[str] | None = None
        self._modes: list[str] | None = None
        self._text_limit: int | None = None

    @classmethod
    def for_task(cls, task: Task, noise: float = 0.0, seed: int = 0) -> "ExpertTeacher":
        return cls(task, noise=noise, seed=seed)

    # -- the ChatModel surface -------------------------------------------------------------

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        start = time.perf_counter()
        try:
            message = self._reply(messages, tools, response_schema)
        except Exception as exc:  # the teacher must never take the loop down
            self.events.append(TeacherEvent("fallback", f"{type(exc).__name__}: {exc}"))
            self._done = True
            message = self._fallback(tools, response_schema)
        prompt = sum(self.count_tokens(m.content) for m in messages)
        out = self.count_tokens(message.content + "".join(c.raw_arguments for c in message.tool_calls))
        return Completion(message=message, usage=Usage(prompt, out), latency=time.perf_counter() - start)

    def _reply(self, messages: list[Message], tools, response_schema) -> Message:
        want_config = response_schema is not None
        if want_config:
            self._read_schema(response_schema)
        offered = [t["function"]["name"] for t in tools or []]
        observation = messages[-1].content if messages and messages[-1].role == "tool" else None
        while True:
            item = self._next(observation)
            observation = None
            if item is None:
                return self._fallback(tools, response_schema)
            if isinstance(item, Config):
                if want_config:
                    self._current = item
                    return self._config_message(item)
                continue  # a configuration the loop did not ask for (a preset stage): skip it
            if want_config:  # asked again (a repair turn): restate, keep the action for later
                self._pending = item
                return self._config_message(self._current or self._generic_config())
            name = item.tool_calls[0].name
            if name in offered:
                return self._writable(item, next(t for t in tools if tool_name(t) == name))
            if name == "reconfigure":  # no reconfigure in this variant: go on in the same stage
                observation = ""
                continue
            self.events.append(TeacherEvent("fallback", f"{name} is not offered ({offered})"))
            self._done = True
            return self._fallback(tools, response_schema)

    def _next(self, observation: str | None) -> Any:
        if self._pending is not None:
            item, self._pending = self._pending, None
            return item
        if self._done:
            return None
        try:
            if not self._started:
                self._started = True
                return next(self._plan)
            return self._plan.send(observation)
        except StopIteration:
            self._done = True
            return None

    def _read_schema(self, schema: dict[str, Any]) -> None:
        props = schema.get("properties", {})
        self._pool_tools = props.get("toolbox", {}).get("items", {}).get("enum") or self._pool_tools
        self._modes = props.get("context_mode", {}).get("enum") or self._modes
        self._text_limit = props.get("strategy", {}).get("maxLength", self._text_limit)

    @staticmethod
    def _writable(message: Message, tool: dict[str, Any]) -> Message:
        """The call with each capped argument (see `cap_strings`) made `one_line`; verbatim
        arguments (code, commands, excerpts of files) are left exactly as they are."""
        capped = cap_strings(tool_parameters(tool), DEFAULT_MAX_STRING).get("properties", {})
        args = dict(message.tool_calls[0].arguments or {})
        for key, value in args.items():
            limit = capped.get(key, {}).get("maxLength")
            if isinstance(value, str) and limit is not None:
                args[key] = one_line(value, limit)
        return call(message.tool_calls[0].name, **args)

    def _config_message(self, config: Config) -> Message:
        toolbox = [t for t in config.toolbox if self._pool_tools is None or t in self._pool_tools]
        modes = self._modes or ["basic"]
        values = {"subgoal": one_line(config.subgoal, self._text_limit),
                  "strategy": one_line(config.strategy, self._text_limit), "toolbox": toolbox,
                  "knowledge": config.knowledge,
                  "knowledge_summary": one_line(config.knowledge_summary, self._text_limit),
                  "context_mode": config.context_mode if config.context_mode in modes else modes[0]}
        # In the schema's field order: a student decoding under the schema's grammar can only
        # write the fields in that order, so that is the order it must be trained on.
        data = {f: values[f] for f in FIELDS if f != "knowledge_summary" or config.knowledge == "summary"}
        return Message(role="assistant", content=json.dumps(data, ensure_ascii=False))

    def _generic_config(self) -> Config:
        return Config(subgoal=self.task.question, strategy=GENERIC_STRATEGY, toolbox=list(self._pool_tools or []),
                      knowledge="history")

    def _fallback(self, tools, response_schema) -> Message:
        if response_schema is not None:
            return self._config_message(self._current or self._generic_config())
        return call("terminate", answer=self.best_answer or "unknown")

    # -- research ---------------------------------------------------------------------------

    def _hop(self, entity: str, step: dict[str, str], walk: _Walk, stage_goal: str) -> Plan:
        """Search for `entity`, visit its entry, read the relation's value from the page."""
        relation = step["relation"]
        locator = slug(entity)
        results = yield call("search", query=entity)
        siblings = self.task.metadata.get("distractors", {}).get(entity, []) if entity == step["entity"] else []
        if siblings and self._wrong_turn():
            shown = [s for s in siblings if slug(s) in (results or "")] or siblings
            decoy = self.rng.choice(shown)
            page = yield call("visit", locator=slug(decoy))
            misread = read_fact(relation, page or "")
            self.events.append(TeacherEvent("wrong_turn", f"visited {decoy!r} instead of {entity!r}"))
            if misread is not None and self.rng.random() >= RECOVERY_PROBABILITY:
                self.events.append(TeacherEvent("gave_up", f"took {misread!r} from {decoy!r}"))
                walk.facts.append(FACTS[relation].format(x=entity, v=misread))
                return misread
            self.events.append(TeacherEvent("recovered", f"noticed the entry is about {decoy!r}"))
            yield call("reconfigure",
                       summary=self._summary(walk, f"The entry I opened, {decoy}, is a near-namesake of {entity} and "
                                                   f"does not describe it."),
                       reason="approach failed: I read the entry of a near-namesake",
                       next_subgoal=f"Find the entry titled exactly {entity} and read its {WANTS[relation]}; "
                                    f"then {stage_goal}")
            yield Config(subgoal=f"Read the {WANTS[relation]} of {entity} from its own entry, then {stage_goal}",
                         strategy=RESEARCH_STRATEGY, toolbox=["search", "visit"], knowledge="summary",
                         knowledge_summary=self._summary(walk, f"Avoid {decoy}: it is a different entry."))
            results = yield call("search", query=f"{entity} {WANTS[relation]}")
        if locator not in (results or ""):
            results = yield call("search", query=f"{entity} {WANTS[relation]}")
        page = yield call("visit", locator=locator)
        value = read_fact(relation, page or "", entity)
        if value is not None:
            walk.facts.append(FACTS[relation].format(x=entity, v=value))
        return value

    def _summary(self, walk: _Walk, extra: str = "") -> str:
        text = ". ".join(walk.facts) + "." if walk.facts else "Nothing established yet."
        return f"{text} {extra}".strip()

    def _walk_chain(self, chain: list[dict[str, str]], walk: _Walk, boundaries: set[int], goal: str,
                    last_goal: str) -> Plan:
        """Follow the chain from its first entity, reading each hop's value from the tools. The
        sub-goals name how many hops are left, not their relations: a teacher that wrote the
        hop plan out taught the student no more
        (docs/notes/2026-12-04-x11-a-teacher-that-writes-its-hop-plan.md)."""
        entity = chain[0]["entity"]
        for index, step in enumerate(chain):
            if index in boundaries:
                summary = self._summary(walk)
                remaining = len(chain) - index
                next_goal = f"Follow the remaining {remaining} hop(s) starting from {entity}" + last_goal
                yield call("reconfigure", summary=summary,
                           reason="sub-goal done: the first hops are resolved and the next ones start from a new entity",
                           next_subgoal=next_goal)
                yield Config(subgoal=next_goal, strategy=RESEARCH_STRATEGY, toolbox=["search", "visit"],
                             knowledge="summary", knowledge_summary=summary)
            value = yield from self._hop(entity, step, walk, goal)
            if value is None:
                return None
            self.best_answer = value
            entity = value
        return entity

    def _plan_research(self) -> Plan:
        chain = self.task.metadata["chain"]
        hops = len(chain)
        boundary = math.ceil(hops / 2)
        walk = _Walk()
        first = (f"Resolve the first {boundary} hop(s) of the question, starting from {chain[0]['entity']}"
                 if hops > 1 else f"Answer the question starting from {chain[0]['entity']}")
        yield Config(subgoal=first, strategy=RESEARCH_STRATEGY, toolbox=["search", "visit"], knowledge="none",
                     context_mode="basic")
        answer = yield from self._walk_chain(chain, walk, {boundary} if hops > 1 else set(),
                                             "continue the chain", ", and answer the question")
        yield call("terminate", answer=answer or self.best_answer or "unknown")

    # -- data -------------------------------------------------------------------------------

    def _inspect_code(self, files: list[str]) -> str:
        lines = []
        for name in files:
            if name.endswith(".csv"):
                lines.append(f"print({name!r}); print(''.join(open({name!r}).readlines()[:3]))")
            elif name.endswith(".json"):
                lines.append(f"import json; data = json.load(open({name!r})); print({name!r}, type(data).__name__, "
                             f"len(data)); print(json.dumps(data[:2]))")
            elif name.endswith(".xlsx"):
                lines.append("from openpyxl import load_workbook\n"
                             f"sheet = load_workbook({name!r}).active\nprint({name!r}, sheet.title)\n"
                             "for row in sheet.iter_rows(max_row=3, values_only=True): print(row)")
        return "\n".join(lines)

    def _compute(self, code: str, wrong_code: str, goal: str, walk: _Walk) -> Plan:
        """Run the computation (after a possible wrong attempt) and return the printed number."""
        truth = self.task.answer
        if self._wrong_turn():
            output = yield call("code_interpreter", code=wrong_code)
            value = _number(output)
            if value is not None and value != truth:
                self.events.append(TeacherEvent("wrong_turn", f"computed {value} with a wrong filter or column"))
                if self.rng.random() >= RECOVERY_PROBABILITY:
                    self.events.append(TeacherEvent("gave_up", f"answered {value}"))
                    return value
                self.events.append(TeacherEvent("recovered", "rechecked the conditions of the question"))
                summary = self._summary(walk, f"A first computation printed {value}, but its code did not apply every "
                                              f"condition of the question (a filter or the column was wrong).")
                yield call("reconfigure", summary=summary,
                           reason="approach failed: the computation did not match the question's conditions",
                           next_subgoal=goal)
                yield Config(subgoal=goal, strategy=DATA_COMPUTE_STRATEGY, toolbox=["code_interpreter"],
                             knowledge="summary", knowledge_summary=summary)
        output = yield call("code_interpreter", code=code)
        return _number(output)

    def _plan_data(self) -> Plan:
        meta = self.task.metadata
        files = meta["inspect"]
        yield Config(subgoal=f"Inspect {', '.join(files)}: columns, value formats and size",
                     strategy=DATA_INSPECT_STRATEGY, toolbox=["code_interpreter"], knowledge="none")
        seen = yield call("code_interpreter", code=self._inspect_code(files))
        summary = "What the files look like:\n" + (seen or "").strip()[:600]
        goal = "Compute the number the question asks for with Python and answer with it"
        walk = _Walk([summary])
        yield call("reconfigure", summary=summary, reason="sub-goal done: the layout of the files is known",
                   next_subgoal=goal)
        yield Config(subgoal=goal, strategy=DATA_COMPUTE_STRATEGY, toolbox=["code_interpreter"], knowledge="summary",
                     knowledge_summary=summary)
        value = yield from self._compute(meta["solution_code"], meta["wrong_code"], goal, walk)
        self.best_answer = value
        yield call("terminate", answer=value or "unknown")

    # -- code -------------------------------------------------------------------------------

    def _plan_code(self) -> Plan:
        meta = self.task.metadata
        command = self.task.check_command or "python3 -m unittest discover -s tests"
        bugs = meta["bugs"]
        self.best_answer = "could not make the tests pass"
        yield Config(subgoal="Run the tests and locate the bug(s) behind the failures",
                     strategy=CODE_LOCATE_STRATEGY, toolbox=["execute_bash", "str_replace_editor"],
                     knowledge="none", context_mode="truncation")
        report = yield call("execute_bash", command=f"{command} 2>&1 | tail -n 40")
        failing = sorted(set(re.findall(r"^(?:FAIL|ERROR): (test_\w+)", report or "", re.MULTILINE)))
        located = []
        for path in dict.fromkeys(b["path"] for b in bugs):
            listing = yield call("str_replace_editor", command="view", path=path)
            for bug in (b for b in bugs if b["path"] == path):
                first = bug["buggy"].splitlines()[0].strip()
                line = next((m.group(1) for m in re.finditer(r"^\s*(\d+)\t(.*)$", listing or "", re.MULTILINE)
                             if first in m.group(2)), "?")
                located.append(f"{bug['path']} line {line}, in {bug['function']}: `{first}` is wrong")
        summary = (f"Failing tests: {', '.join(failing) or 'none reported'}. "
                   + " ".join(f"Bug: {l}." for l in located))
        goal = "Fix the located bug(s) in the package and make the whole test suite pass"
        yield call("reconfigure", summary=summary, reason="sub-goal done: every failure is traced to a line",
                   next_subgoal=goal)
        yield Config(subgoal=goal, strategy=CODE_FIX_STRATEGY, toolbox=["execute_bash", "str_replace_editor"],
                     knowledge="summary", knowledge_summary=summary, context_mode="truncation")
        if self._wrong_turn():
            bug = self.rng.choice(bugs)
            old, new, applies = self._decoy_edit(bug)
            self.events.append(TeacherEvent("wrong_turn", f"edited {old!r} in {bug['function']}"))
            yield call("str_replace_editor", command="str_replace", path=bug["path"], old_str=old, new_str=new)
            result = yield call("execute_bash", command=command)
            if self.rng.random() >= RECOVERY_PROBABILITY:
                self.events.append(TeacherEvent("gave_up", "stopped after an edit that did not fix the tests"))
                yield call("terminate", answer="I changed the code but the tests may still fail")
                return
            self.events.append(TeacherEvent("recovered", "undid the edit" if applies else "the edit did not apply"))
            if applies:
                yield call("str_replace_editor", command="undo_edit", path=bug["path"])
            tail = " ".join((result or "").strip().splitlines()[-1:])
            retry = (f"{summary} Changing `{old.strip()}` in {bug['function']} did not make the tests pass "
                     f"({tail}){'; the edit was undone' if applies else ''}.")
            yield call("reconfigure", summary=retry, reason="approach failed: my first edit did not fix the failing test",
                       next_subgoal=goal)
            yield Config(subgoal=goal, strategy=CODE_FIX_STRATEGY, toolbox=["execute_bash", "str_replace_editor"],
                         knowledge="summary", knowledge_summary=retry, context_mode="truncation")
        for bug in bugs:
            yield call("str_replace_editor", command="str_replace", path=bug["path"], old_str=bug["buggy"],
                       new_str=bug["fix"])
        result = yield call("execute_bash", command=command)
        passed = bool(re.search(r"^OK\b", result or "", re.MULTILINE)) and "FAILED" not in (result or "")
        fixed = ", ".join(b["function"] for b in bugs)
        self.best_answer = f"Fixed {fixed}; the tests pass." if passed else f"Fixed {fixed}; tests still fail."
        yield call("terminate", answer=self.best_answer)

    def _decoy_edit(self, bug: dict[str, Any]) -> tuple[str, str, bool]:
        """A plausible edit that does not fix the bug: the function's other classic mistake, made
        in a part of it that was right. (old, new, whether old occurs exactly once in the file.)"""
        from toolself.evals.suites.code import TEMPLATES

        template = next(t for t in TEMPLATES if t.name == bug["function"])
        other = template.subtle if bug["kind"] == "obvious" else template.obvious
        source = str(self.task.inline_files.get(bug["path"], ""))
        return other[0], other[1], source.count(other[0]) == 1

    # -- mixed ------------------------------------------------------------------------------

    def _plan_mixed(self) -> Plan:
        meta = self.task.metadata
        chain = meta["chain"]
        walk = _Walk()
        what = WANTS[chain[-1]["relation"]]
        first = f"Find the {what} the question depends on, starting from {chain[0]['entity']}"
        yield Config(subgoal=first, strategy=RESEARCH_STRATEGY, toolbox=["search", "visit"], knowledge="none",
                     context_mode="basic")
        fact = yield from self._walk_chain(chain, walk, set(), "continue", "")
        if fact is None:
            yield call("terminate", answer="unknown")
            return
        if meta["variant"] == "city_setting":
            yield from self._set_value(fact, walk)
            return
        goal = f"Use the fact {fact!r} to {meta['second_part']}, and answer with the number"
        summary = self._summary(walk, f"The value the computation needs is {fact}.")
        yield call("reconfigure", summary=summary,
                   reason="sub-goal done: the fact is found; the rest needs computing over a file",
                   next_subgoal=goal, toolbox_request="code_interpreter")
        yield Config(subgoal=goal, strategy=DATA_COMPUTE_STRATEGY, toolbox=["code_interpreter"], knowledge="summary",
                     knowledge_summary=summary, context_mode="basic")
        value = yield from self._compute(meta["solution_code"].format(fact=fact),
                                         meta["wrong_code"].format(fact=fact), goal, walk)
        self.best_answer = value
        yield call("terminate", answer=value or "unknown")

    def _set_value(self, fact: str, walk: _Walk) -> Plan:
        """The code half of a mixed task: write the fact into the package and run its tests."""
        meta = self.task.metadata
        command = self.task.check_command or "python3 -m unittest discover -s tests"
        goal = f"Write {fact!r} into {meta['path']} as asked and make the tests pass"
        summary = self._summary(walk, f"The value to write is {fact}.")
        yield call("reconfigure", summary=summary,
                   reason="sub-goal done: the fact is found; the rest is an edit to the code",
                   next_subgoal=goal, toolbox_request="str_replace_editor, execute_bash")
        yield Config(subgoal=goal, strategy=SETTING_STRATEGY, toolbox=["str_replace_editor", "execute_bash"],
                     knowledge="summary", knowledge_summary=summary, context_mode="truncation")
        yield call("str_replace_editor", command="view", path=meta["path"])
        yield call("str_replace_editor", command="str_replace", path=meta["path"], old_str=meta["old"],
                   new_str=meta["new"].format(fact=fact))
        result = yield call("execute_bash", command=command)
        passed = bool(re.search(r"^OK\b", result or "", re.MULTILINE))
        self.best_answer = f"HOME_CITY is set to {fact}" + ("; the tests pass." if passed else "; the tests fail.")
        yield call("terminate", answer=self.best_answer)

    # -- noise ------------------------------------------------------------------------------

    def _wrong_turn(self) -> bool:
        taken = sum(1 for e in self.events if e.kind == "wrong_turn")
        return taken < MAX_WRONG_TURNS and self.noise > 0 and self.rng.random() < self.noise


def scored_attempts(spec: str, *, limit: int, noises: tuple[float, ...] = (0.0,), split: str = "train",
                    pool: Any = None, context_budget: int = 3000) -> list[Any]:
    """The teacher's attempts at the first `limit` tasks of `spec`, once per noise level,
    run through the real agent loop and tools and scored (`metadata["correct"]`): training
    data for tests and benchmarks without a runner folder."""
    from toolself.agent import Agent, AgentSettings
    from toolself.evals.loaders import load_tasks
    from toolself.evals.scorers import score
    from toolself.tools.registry import default_pool

    pool = pool if pool is not None else default_pool()
    out = []
    for i, task in enumerate(load_tasks(spec, split=split, limit=limit)):
        for noise in noises:
            teacher = ExpertTeacher(task, noise=noise, seed=i)
            with task.environment(model=teacher) as env:
                t = Agent(teacher, pool, AgentSettings(context_budget=context_budget)).run(
                    task.question, ctx=env.context, task_id=task.id)
                t.metadata["correct"] = bool(score(task, t.answer, env).correct)
            out.append(t)
    return out
