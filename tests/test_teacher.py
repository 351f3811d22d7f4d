"""The expert teacher solves the built-in suites through the real tools, writes configurations
the loop accepts as they are, and with noise takes wrong turns that it mostly repairs."""

from __future__ import annotations

import re

import pytest

from toolself.agent import Agent, AgentSettings
from toolself.config import Configuration, parse_configuration
from toolself.evals.loaders import load_tasks
from toolself.evals.scorers import score
from toolself.evals.suites import SUITES
from toolself.evals.teacher import ExpertTeacher
from toolself.models.base import Message
from toolself.tools.base import ToolPool
from toolself.tools.registry import default_pool

REAL_TOOLS = {"research": {"search", "visit"}, "data": {"code_interpreter"},
              "code": {"execute_bash", "str_replace_editor"}, "mixed": {"search", "visit"}}


@pytest.fixture(scope="module")
def pool():
    return default_pool()


def attempt(task, pool, noise=0.0, seed=0, settings=None):
    teacher = ExpertTeacher(task, noise=noise, seed=seed)
    with task.environment() as env:
        trajectory = Agent(teacher, pool, settings or AgentSettings()).run(task.question, ctx=env.context,
                                                                          task_id=task.id)
        verdict = score(task, trajectory.answer, env)
    return teacher, trajectory, verdict


@pytest.mark.parametrize("suite", SUITES)
def test_the_teacher_solves_heldout_tasks_through_the_real_tools(suite, pool):
    for task in load_tasks(f"builtin:{suite}", split="heldout", limit=5):
        teacher, trajectory, verdict = attempt(task, pool)
        assert verdict.correct, (task.id, trajectory.answer, verdict.reason)
        assert trajectory.end_reason == "terminate" and not teacher.events
        assert [s.config_source for s in trajectory.stages] == ["policy"] * len(trajectory.stages)
        assert not any(s.config_problems for s in trajectory.stages)
        assert len(trajectory.stages) >= 2 and trajectory.stages[0].end == "reconfigure"
        used = {step.tool for stage in trajectory.stages for step in stage.steps}
        assert REAL_TOOLS[suite] <= used
        if suite == "mixed":  # the second stage computes or edits, with a toolbox of its own
            assert {"code_interpreter", "str_replace_editor"} & set(trajectory.stages[1].configuration.toolbox)
            assert not {"search", "visit"} & set(trajectory.stages[1].configuration.toolbox)
        assert not any(step.is_error for stage in trajectory.stages for step in stage.steps)


def test_its_configurations_validate_against_the_pool_like_a_models(pool):
    task = next(t for t in load_tasks("builtin:mixed", split="heldout", limit=10)
                if t.metadata["variant"] != "city_setting")
    _, trajectory, _ = attempt(task, pool)
    first, second = (s.configuration for s in trajectory.stages)
    assert first.toolbox == ["search", "visit"] and first.knowledge == "none"
    assert second.toolbox == ["code_interpreter"] and second.knowledge == "summary"
    assert trajectory.stages[0].summary in second.knowledge_summary
    parsed = parse_configuration(second.to_json(), pool.names, ["basic", "truncation"])
    assert parsed.configuration == second


def test_its_summaries_carry_what_it_read(pool):
    task = load_tasks("builtin:research?hops=2", split="heldout", limit=1)[0]
    _, trajectory, _ = attempt(task, pool)
    middle = task.metadata["chain"][0]["value"]
    assert middle in trajectory.stages[0].summary
    assert middle in trajectory.stages[1].configuration.knowledge_summary


def test_code_stages_use_truncation_and_research_stages_basic(pool):
    code = load_tasks("builtin:code", split="heldout", limit=1)[0]
    _, trajectory, _ = attempt(code, pool)
    assert {s.configuration.context_mode for s in trajectory.stages} == {"truncation"}
    research = load_tasks("builtin:research", split="heldout", limit=1)[0]
    _, trajectory, _ = attempt(research, pool)
    assert {s.configuration.context_mode for s in trajectory.stages} == {"basic"}


def test_noise_makes_wrong_turns_that_are_mostly_repaired_through_reconfigure(pool):
    tasks = load_tasks("builtin:research", split="train", limit=12)
    outcomes, reasons = [], []
    for task in tasks:
        teacher, trajectory, verdict = attempt(task, pool, noise=1.0)
        assert trajectory.end_reason == "terminate"
        assert any(e.kind == "wrong_turn" for e in teacher.events)
        outcomes.append(verdict.correct)
        reasons += [s.reason for s in trajectory.stages if s.reason]
    assert any(r.startswith("approach failed") for r in reasons)
    assert any(outcomes) and not all(outcomes)  # rejection sampling has something to keep and to reject


@pytest.mark.parametrize("suite", ["data", "code", "mixed"])
def test_noise_wrong_turns_in_computing_and_editing(suite, pool):
    kinds = []
    for seed in range(3):
        task = load_tasks(f"builtin:{suite}", split="train", limit=1)[0]
        teacher, trajectory, verdict = attempt(task, pool, noise=1.0, seed=seed)
        assert trajectory.end_reason == "terminate"
        events = [e.kind for e in teacher.events]
        kinds += events
        if "gave_up" not in events:  # every wrong turn was repaired
            assert verdict.correct
        if "recovered" in events:
            assert any((s.reason or "").startswith("approach failed") for s in trajectory.stages)
    assert "wrong_turn" in kinds


def test_the_same_seed_gives_the_same_trajectory(pool):
    task = load_tasks("builtin:research", split="train", limit=1)[0]

    def steps(seed):
        _, trajectory, _ = attempt(task, pool, noise=0.5, seed=seed)
        return [(st.tool, st.arguments) for stage in trajectory.stages for st in stage.steps]
    assert steps(3) == steps(3)


def test_a_code_attempt_reads_the_same_wherever_its_workspace_is(pool, tmp_path):
    task = load_tasks("builtin:code", split="train", limit=1)[0]

    def observations(root):
        teacher = ExpertTeacher(task)
        with task.environment(root=root) as env:
            trajectory = Agent(teacher, pool, AgentSettings()).run(task.question, ctx=env.context, task_id=task.id)
        return [re.sub(r"in \d+\.\d+s", "in <time>", step.observation)  # unittest's own timing
                for stage in trajectory.stages for step in stage.steps]

    here, there = observations(tmp_path / "a"), observations(tmp_path / "b" / "deeper")
    assert here == there
    assert any('File "./tests/' in seen for seen in here)
    assert not any(str(tmp_path) in seen for seen in here)


def test_without_reconfigure_it_still_finishes_in_one_stage(pool):
    task = load_tasks("builtin:research", split="heldout", limit=1)[0]
    preset = Configuration(subgoal="{task}", strategy="Answer.", toolbox=["search", "visit"], knowledge="none")
    settings = AgentSettings(method="static", configurator="preset", reconfigure=False, preset=preset,
                             max_steps_per_stage=30)
    _, trajectory, verdict = attempt(task, pool, settings=settings)
    assert verdict.correct and len(trajectory.stages) == 1 and trajectory.stages[0].config_source == "preset"


def test_a_missing_tool_ends_the_attempt_with_its_best_answer():
    from toolself.tools.search import search
    task = load_tasks("builtin:research", split="heldout", limit=1)[0]
    teacher, trajectory, verdict = attempt(task, ToolPool([search]))
    assert trajectory.end_reason == "terminate" and trajectory.answer == "unknown"
    assert teacher.events[-1].kind == "fallback"


def test_an_unexpected_question_gets_a_configuration_or_a_terminate_never_an_exception():
    task = load_tasks("builtin:data", split="heldout", limit=1)[0]
    teacher = ExpertTeacher(task)
    tools = [{"type": "function", "function": {"name": "terminate", "parameters": {}}}]
    reply = teacher.complete([Message("user", "budget exhausted")], tools=tools).message
    assert reply.tool_calls[0].name == "terminate"
    schema = {"properties": {"toolbox": {"items": {"enum": ["code_interpreter"]}}, "context_mode": {"enum": ["basic"]}}}
    assert parse_configuration(teacher.complete([Message("user", "?")], response_schema=schema).text,
                               ["code_interpreter"], ["basic"]).configuration is not None


def test_the_teacher_only_takes_built_in_tasks():
    task = load_tasks("builtin:data", split="heldout", limit=1)[0]
    task.family = "gaia"
    with pytest.raises(ValueError, match="built-in"):
        ExpertTeacher(task)


def test_it_writes_configuration_fields_in_the_schemas_order(pool):
    """A student decoding under the schema's grammar can only write the fields in the schema's
    order (xgrammar keeps it), so that is the order it must be trained on."""
    import json

    from toolself.config import FIELDS

    written = []
    for suite in SUITES:
        for task in load_tasks(f"builtin:{suite}", split="train", limit=2):
            _, trajectory, _ = attempt(task, pool)
            conversations = [c for s in trajectory.stages for c in (s.config_conversation, s.conversation) if c]
            written += [json.loads(m.content) for c in conversations for m in c.messages
                        if m.role == "assistant" and m.content.startswith('{"subgoal"')]
    assert any(config.get("knowledge") == "summary" for config in written)
    for config in written:
        assert list(config) == [f for f in FIELDS if f in config]
