"""`toolself demo`: the zero-shot and the CAT-trained embedded model on one held-out task."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

from toolself.config import Configuration
from toolself.demo import DEMO_SUITE, StageObserver, chosen_task, demo_task, run_demo
from toolself.evals.suites.common import KEY_VARIABLE
from toolself.evals.teacher import ExpertTeacher
from toolself.trajectory import Stage, Trajectory, read_jsonl
from toolself.viewer.load import load_attempts


def console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


def text(c: Console) -> str:
    return c.file.getvalue()


def stage(index: int, request: dict | None = None, **change) -> Stage:
    config = {"subgoal": "read sales.csv", "strategy": "open the file, then sum", "toolbox": ["python", "files"],
              "knowledge": "none", "context_mode": "basic", **change}
    return Stage(index=index, configuration=Configuration(**config), config_source="policy", request=request)


def recorded(outcomes: dict[str, tuple[bool, bool]]) -> dict:
    """A provenance record whose evaluation had these (trained, zero-shot) outcomes on data tasks."""
    tasks = {name: {f"{DEMO_SUITE}/{task}": pair[i] for task, pair in outcomes.items()}
             for i, name in enumerate(("cat", "zero-shot"))}
    rates = {name: {DEMO_SUITE: sum(v.values()) / len(v)} for name, v in tasks.items()}
    return {"command": "make embedded-cat", "training_data": {"sft": {"trajectories": 108}},
            "heldout": {"suites": [DEMO_SUITE], "tasks_per_suite": len(outcomes), "success_rate": rates,
                        "tasks": tasks}}


def test_the_demo_picks_the_first_task_the_adapter_solved_and_the_zero_shot_model_failed():
    record = recorded({"data-heldout-0-0000": (True, True), "data-heldout-0-0001": (False, False),
                       "data-heldout-0-0002": (True, False), "data-heldout-0-0003": (True, False)})
    assert chosen_task(record) == "data-heldout-0-0002"


def test_an_evaluation_where_training_changed_no_outcome_has_nothing_to_show():
    with pytest.raises(ValueError, match="nothing to show"):
        chosen_task(recorded({"data-heldout-0-0000": (True, True), "data-heldout-0-0001": (False, False)}))


def test_without_the_adapter_the_demo_shows_the_zero_shot_attempt_and_how_to_build_the_adapter(tmp_path,
                                                                                                monkeypatch):
    import toolself.models

    monkeypatch.setattr(toolself.models, "shipped_adapter", lambda spec: tmp_path)
    other = demo_task("data-heldout-0-0001")
    c = console()
    out = tmp_path / "demo" / "trajectories.jsonl"
    attempts = run_demo(out, c, load=lambda spec, task: ExpertTeacher.for_task(other))
    assert [(a.model, a.correct) for a in attempts] == [("embedded", False)]
    shown = text(c)
    assert "not in this install yet" in shown and "make embedded-cat" in shown and "data-heldout-0-0000" in shown
    assert [t.metadata["correct"] for t in read_jsonl(out)] == [False]


def test_the_demo_task_is_the_published_one_whatever_key_the_environment_holds(monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.setenv(KEY_VARIABLE, "public")
    published = demo_task("data-heldout-0-0001")
    monkeypatch.setenv(KEY_VARIABLE, "a-private-key")
    task = demo_task("data-heldout-0-0001")
    assert task.id == "data-heldout-0-0001" and task.split == "heldout"
    assert (task.question, task.answer) == (published.question, published.answer)
    assert os.environ[KEY_VARIABLE] == "a-private-key"


def test_a_stage_shows_the_reason_it_was_opened_and_marks_only_the_fields_that_changed():
    c = console()
    observer = StageObserver(c)
    trajectory = Trajectory(task="t")
    observer.stage_started(trajectory, stage(0))
    observer.stage_started(trajectory, stage(1, request={"reason": "the columns are known"},
                                             subgoal="sum the West umbrella units", toolbox=["python", "shell"]))
    second = text(c).split("stage 2", 1)[1]
    assert "the columns are known" in second
    assert "changed (was: read sales.csv)" in second and "changed (+shell -files)" in second
    assert second.count("changed") == 2  # strategy, knowledge and mode were kept


def test_a_stage_that_repeats_the_previous_configuration_says_nothing_changed():
    c = console()
    observer = StageObserver(c)
    observer.stage_started(Trajectory(task="t"), stage(0))
    observer.stage_started(Trajectory(task="t"), stage(1, request={"reason": "again"}))
    assert "nothing changed from the previous stage" in text(c)


def test_the_demo_scores_both_attempts_and_writes_trajectories_the_viewer_opens(tmp_path):
    other = demo_task("data-heldout-0-0001")  # a policy answering another task's question, not 0002's

    def load(spec, task):
        return ExpertTeacher.for_task(task if spec == "solves" else other)

    record = recorded({"data-heldout-0-0000": (False, False), "data-heldout-0-0002": (True, False)})
    c = console()
    out = tmp_path / "demo" / "trajectories.jsonl"
    attempts = run_demo(out, c, contenders=[("answers another task", "fails"), ("solves it", "solves")], load=load,
                        record=record)
    assert [a.correct for a in attempts] == [False, True]
    shown = text(c)
    assert "135M" in shown and "data 0% → 50%" in shown and "data-heldout-0-0002" in shown and "FAILED" in shown and "SOLVED" in shown and "stage 1" in shown
    assert f"toolself view {out} --out {out.with_suffix('.html')} --open" in shown
    written = read_jsonl(out)
    assert [t.metadata["correct"] for t in written] == [False, True]
    assert sorted(a.outcome for a in load_attempts([out])) == ["correct", "wrong"]
