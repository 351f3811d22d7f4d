"""HotpotQA's official EM and F1 (hotpot_evaluate_v1.py), both on every record."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolself.evals.loaders import load_tasks
from toolself.evals.rules.hotpotqa import exact_match, f1
from toolself.evals.scorers import score

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples"

GOLDEN = [  # answer, gold, EM, F1
    ("9984", "9,984", True, 1.0),                                      # punctuation removed
    ("Greenwich Village New York City", "Greenwich Village, New York City", True, 1.0),
    ("Beatles", "the Beatles", True, 1.0),                            # articles removed
    ("Paris.", "Paris", True, 1.0),                                   # trailing period
    ("Chicago", "Chicago,", True, 1.0),                               # a stray comma in the gold
    ("Greenwich Village", "Greenwich Village, New York City", False, 2 * 0.4 / 1.4),
    ("yes", "yes indeed", False, 0.0),                                # yes/no only match themselves
    ("no", "no", True, 1.0),
    ("London", "Paris", False, 0.0),
    ("", "Paris", False, 0.0),
]


@pytest.mark.parametrize("answer, gold, em, expected_f1", GOLDEN)
def test_hotpotqa_em_and_f1_follow_the_official_script(answer, gold, em, expected_f1):
    assert exact_match(answer, gold) is em
    assert f1(answer, gold) == pytest.approx(expected_f1)


def test_a_hotpotqa_record_carries_em_as_its_verdict_and_f1_beside_it():
    tasks = load_tasks(f"hotpotqa:{SAMPLES / 'hotpotqa' / 'dev_sample.jsonl'}")
    partial = score(tasks[0], tasks[0].answer + " and more words")
    assert partial.scorer == "hotpotqa_em" and not partial.correct and 0 < partial.metrics["f1"] < 1


def test_every_sample_gold_answer_scores_full_marks():
    tasks = load_tasks(f"hotpotqa:{SAMPLES / 'hotpotqa' / 'dev_sample.jsonl'}")
    results = [score(t, t.answer) for t in tasks]
    assert len(results) == 20 and all(r.correct and r.metrics == {"em": 1.0, "f1": 1.0} for r in results)
