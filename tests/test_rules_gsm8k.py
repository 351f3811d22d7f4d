"""GSM8K's strict and flexible extractions (lm-evaluation-harness), both named and reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolself.evals.loaders import load_tasks
from toolself.evals.rules import score_answer
from toolself.evals.rules.gsm8k import flexible_extract, same_answer, strict_extract
from toolself.evals.scorers import score

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples" / "gsm8k" / "test_sample.jsonl"

GOLDEN = [  # reply, gold, strict, flexible
    ("The answer is 18", "18", True, True),
    ("FINAL ANSWER: 18", "18", True, True),
    ("So the total is 18.", "18", False, True),
    ("Each costs $2, so 9 of them cost $18.", "18", False, True),
    ("#### 1,000", "1000", True, True),
    ("18", "18", True, True),
    ("$18", "18", True, True),
    ("18.00", "18", False, False),                 # compared as strings, as the harness does
    ("17 at first, then 18", "18", False, True),
    ("#### 18\nor maybe 19", "18", True, False),   # strict takes the marked number, flexible the last
    ("17", "18", False, False),
    ("I cannot tell.", "18", False, False),
    ("", "18", False, False),
]


@pytest.mark.parametrize("reply, gold, strict, flexible", GOLDEN)
def test_gsm8k_extractions_follow_the_harness(reply, gold, strict, flexible):
    assert same_answer(strict_extract(reply), gold) is strict
    assert same_answer(flexible_extract(reply), gold) is flexible


def test_a_gsm8k_record_reports_both_and_names_which_decided():
    task, = load_tasks(f"gsm8k:{SAMPLE}", limit=1)
    reply = f"So the total is {task.answer}."
    flexible = score(task, reply)
    task.metadata["scorer"] = "gsm8k_strict"
    strict = score_answer(task, reply)
    assert flexible.scorer == "gsm8k_flexible" and flexible.correct
    assert strict.scorer == "gsm8k_strict" and not strict.correct
    assert flexible.metrics == strict.metrics == {"strict": 0.0, "flexible": 1.0}


def test_every_sample_gold_solution_and_answer_score_under_both_rules():
    tasks = load_tasks(f"gsm8k:{SAMPLE}")
    solutions = [json.loads(line)["answer"] for line in SAMPLE.read_text().splitlines() if line.strip()]
    assert len(tasks) == len(solutions) == 20
    for task, solution in zip(tasks, solutions):
        for reply in (task.answer, solution):
            assert score(task, reply).metrics == {"strict": 1.0, "flexible": 1.0}, reply
