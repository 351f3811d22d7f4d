"""GAIA's leaderboard scorer, case by case (gaia-benchmark/leaderboard scorer.py), and the
lenient variant only where a task or spec asks for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolself.evals.loaders import load_tasks
from toolself.evals.rules.gaia import gaia_lenient_match, gaia_match
from toolself.evals.scorers import score

GOLDEN = [
    ("$1,000", "1000", True),            # $ , % removed before a float comparison
    ("17%", "17", True),
    ("3.50", "3.5", True),
    (" 17 ", "17", True),                # float() ignores surrounding whitespace
    ("17 km", "17", False),              # a unit is not removed
    ("3.5.", "3.5", False),              # nor a trailing period
    ("2 or 3", "2", False),
    ("1-2", "1", False),
    ("3/4", "3", False),
    ("2021-05-04", "2021", False),
    ("10^6", "10", False),
    ("seventeen", "17", False),
    ("The Eiffel Tower!", "the eiffel tower", True),   # strings: spaces, case, punctuation ignored
    ("Paris", "London", False),
    ("hydrogen; Oxygen", "hydrogen, oxygen", True),    # lists split on , or ;
    ("oxygen, hydrogen", "hydrogen, oxygen", False),   # order matters
    ("hydrogen", "hydrogen, oxygen", False),           # lengths differ
    ("1, 2.0, $3", "1, 2, 3", True),                   # numeric items compared as numbers
    ("St. Louis, MO", "St Louis, MO", False),          # list items keep their punctuation
    (None, "17", False),
]


@pytest.mark.parametrize("answer, gold, expected", GOLDEN)
def test_gaia_scores_as_the_leaderboard_does(answer, gold, expected):
    assert gaia_match(answer, gold)[0] is expected


@pytest.mark.parametrize("answer, gold", [("17 km", "17"), ("3.5 hours", "3.5")])
def test_the_lenient_variant_reads_a_number_with_a_unit(answer, gold):
    assert gaia_lenient_match(answer, gold)[0] and not gaia_match(answer, gold)[0]


def test_the_lenient_scorer_is_only_used_when_the_spec_names_it(tmp_path: Path):
    path = tmp_path / "metadata.jsonl"
    path.write_text('{"task_id": "g1", "Question": "How far?", "Level": 1, "Final answer": "17", "file_name": ""}\n')
    official, = load_tasks(f"gaia:{path}")
    lenient, = load_tasks(f"gaia:{path}?scorer=gaia_lenient")
    assert not score(official, "17 km").correct and score(official, "17 km").scorer == "gaia"
    assert score(lenient, "17 km").correct and score(lenient, "17 km").scorer == "gaia_lenient"


def test_an_unknown_scorer_in_a_spec_is_refused(tmp_path: Path):
    path = tmp_path / "metadata.jsonl"
    path.write_text('{"task_id": "g1", "Question": "q", "Level": 1, "Final answer": "17", "file_name": ""}\n')
    with pytest.raises(ValueError, match="unknown scorer"):
        load_tasks(f"gaia:{path}?scorer=lenient")


def test_the_reason_names_the_differing_list_item():
    ok, why = gaia_match("oxygen, hydrogen", "hydrogen, oxygen")
    assert not ok and "item 1" in why
