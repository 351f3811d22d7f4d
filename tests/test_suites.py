"""The built-in suites: fast, deterministic, split-disjoint, and each task solvable only by
using the tools its family needs."""

from __future__ import annotations

import subprocess
import sys
import time
import unittest

import pytest

from toolself.evals.loaders import load_tasks
from toolself.evals.scorers import score
from toolself.evals.suites import SUITES, generate_suite
from toolself.evals.suites.code import TEMPLATES
from toolself.evals.suites.research import PATTERNS, read_fact
from toolself.tools.search import search


@pytest.mark.parametrize("suite", SUITES)
def test_each_suite_makes_200_train_and_100_heldout_tasks_in_seconds(suite):
    started = time.perf_counter()
    train, heldout = generate_suite(suite, "train"), generate_suite(suite, "heldout")
    elapsed = time.perf_counter() - started
    assert (len(train), len(heldout)) == (200, 100)
    assert len({t.id for t in train + heldout}) == 300
    assert elapsed < 20, f"{suite}: {elapsed:.1f} s"


@pytest.mark.parametrize("suite", SUITES)
def test_generation_is_deterministic_in_the_seed(suite):
    def view(seed):
        return [(t.question, t.answer, sorted(t.inline_files)) for t in generate_suite(suite, "heldout", n=20, seed=seed)]
    assert view(0) == view(0)
    assert view(0) != view(1)


def names_in(tasks) -> set[str]:
    out: set[str] = set()
    for t in tasks:
        out.update(d["title"] for d in t.documents or [])
    return out


@pytest.mark.parametrize("suite", ["research", "mixed"])
def test_train_and_heldout_worlds_share_no_entity(suite):
    train, heldout = generate_suite(suite, "train", n=50), generate_suite(suite, "heldout", n=50)
    assert names_in(train) and not names_in(train) & names_in(heldout)
    heldout_text = " ".join([t.question for t in heldout] + [d["text"] for d in heldout[0].documents])
    assert not [name for name in names_in(train) if name in heldout_text]


def test_data_splits_share_no_file_content_or_vocabulary():
    train, heldout = generate_suite("data", "train"), generate_suite("data", "heldout")
    contents = lambda tasks: {c if isinstance(c, bytes) else c.encode() for t in tasks for c in t.inline_files.values()}
    assert not contents(train) & contents(heldout)
    values = lambda tasks: {v for t in tasks for v in t.metadata["params"].values() if isinstance(v, str)}
    assert values(train) and not values(train) & values(heldout)


def test_code_splits_share_no_bug():
    sites = lambda split: {(b["function"], b["buggy"]) for t in generate_suite("code", split) for b in t.metadata["bugs"]}
    packages = lambda split: {t.metadata["package"] for t in generate_suite("code", split)}
    assert not sites("train") & sites("heldout")
    assert not {f for f, _ in sites("train")} & {f for f, _ in sites("heldout")}
    assert not packages("train") & packages("heldout")


def test_research_questions_need_each_hop_read_from_its_own_entry():
    for task in generate_suite("research", "heldout", n=40):
        chain = task.metadata["chain"]
        assert 2 <= len(chain) <= 4 and task.level == len(chain)
        entries = {d["title"]: d["text"] for d in task.documents}
        for step in chain:
            assert read_fact(step["relation"], entries[step["entity"]], step["entity"]) == step["value"]
        assert task.answer == chain[-1]["value"] and task.answer not in task.question
        for later in chain[1:]:
            assert later["entity"] not in task.question  # intermediate entities must be found


def test_research_hop_entries_come_with_near_namesakes_that_a_search_of_their_shared_words_returns_beside_them():
    """A search of the full name may fill its five results with the entity's own works (a
    prolific author's namesake then ranks sixth), so the namesake is looked for where the
    suite puts it: among the results for the words the two names share."""
    def top_five(results: str, title: str) -> bool:
        return any(f"\n{i}. {title}\n" in "\n" + results + "\n" for i in range(1, 6))

    pairs = 0
    for task in generate_suite("research", "heldout", n=2):
        with task.environment() as env:
            for step in task.metadata["chain"]:
                entity, namesakes = step["entity"], task.metadata["distractors"][step["entity"]]
                assert f"locator: {step['locator']}" in search({"query": entity}, env.context).content
                pairs += len(namesakes)
                for namesake in namesakes:
                    shared = " ".join(word for word in entity.split() if word in namesake.split())
                    results = search({"query": shared}, env.context).content
                    assert top_five(results, entity) and top_five(results, namesake), (entity, namesake, results)
    assert pairs >= 2


def test_research_knobs_set_hops_and_distractors():
    tasks = load_tasks("builtin:research?hops=3&distractors=2", split="train", limit=30)
    assert {t.level for t in tasks} == {3}
    cities = {d["title"] for d in tasks[0].documents if " is a city in the province of " in d["text"]}
    assert all(len(v) == 2 for t in tasks for name, v in t.metadata["distractors"].items() if name not in cities)
    with pytest.raises(ValueError, match="no knob"):
        load_tasks("builtin:research?depth=3")
    with pytest.raises(ValueError, match="between|within"):
        load_tasks("builtin:research?hops=9")


def run_solution(task) -> str:
    with task.environment() as env:
        code = task.metadata["solution_code"]
        if task.family == "mixed":
            code = code.format(fact=task.metadata["fact"])
        out = subprocess.run([sys.executable, "-c", code], cwd=env.workspace, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_data_answers_are_what_the_solution_computes_from_the_files():
    tasks = generate_suite("data", "heldout", n=10)
    assert {t.metadata["variant"] for t in tasks} == {"filter_sum", "join_revenue", "xlsx_join", "count_threshold",
                                                      "price_spread"}
    for task in tasks:
        assert run_solution(task) == task.answer
        assert set(task.metadata["inspect"]) <= set(task.inline_files)


def test_no_data_question_has_the_answer_zero():
    """A filter that matches nothing would let a model that guesses 0 without reading score."""
    for split in ("train", "heldout"):
        for seed in (0, 1, 2):
            assert all(t.answer != "0" for t in generate_suite("data", split, n=100, seed=seed))


def test_data_rows_knob_sizes_the_files():
    task = load_tasks("builtin:data?rows=10", split="train", limit=1)[0]
    assert task.inline_files["sales.csv"].count("\n") == 11


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_every_planted_bug_breaks_its_tests_and_the_correct_code_passes(template):
    def run(source):
        namespace: dict = {}
        exec(source, namespace)
        exec(template.tests, {**namespace, "self": unittest.TestCase()})

    run(template.source)
    for correct, wrong in (template.obvious, template.subtle):
        assert template.source.count(correct) == 1
        with pytest.raises(Exception):
            run(template.source.replace(correct, wrong))


def test_code_tasks_fail_as_given_and_pass_once_the_planted_bugs_are_fixed():
    for task in generate_suite("code", "heldout", n=3, bugs="2"):
        assert len(task.metadata["bugs"]) == 2
        with task.environment() as env:
            before = score(task, None, env)
            for bug in task.metadata["bugs"]:
                path = env.workspace / bug["path"]
                assert path.read_text().count(bug["buggy"]) == 1
                path.write_text(path.read_text().replace(bug["buggy"], bug["fix"]))
            after = score(task, None, env)
        assert not before.correct and "FAILED" in before.details["output"]
        assert after.correct, after.details["output"]


def test_code_buggy_snippets_are_unique_in_their_files():
    for task in generate_suite("code", "train") + generate_suite("code", "heldout"):
        for bug in task.metadata["bugs"]:
            assert task.inline_files[bug["path"]].count(bug["buggy"]) == 1


def test_editing_the_tests_does_not_pass_the_check():
    task = generate_suite("code", "heldout", n=1, bugs="1")[0]
    with task.environment() as env:
        for test_file in task.check_files:
            (env.workspace / test_file).write_text("")
        assert not score(task, None, env).correct


def test_mixed_tasks_need_a_fact_from_the_collection_then_a_file_or_the_code():
    tasks = generate_suite("mixed", "heldout", n=30)
    assert {t.metadata["variant"] for t in tasks} == {"city_units", "year_orders", "city_setting"}
    for task in tasks:
        fact = task.metadata["fact"]
        assert fact not in task.question
        assert any(fact in d["text"] for d in task.documents)
        if task.metadata["variant"] == "city_setting":
            assert fact not in str(task.inline_files)
        else:  # the file holds the fact among other values; only the collection says which
            assert run_solution(task) == task.answer


def test_a_mixed_setting_task_is_solved_only_by_writing_the_found_fact():
    task = next(t for t in generate_suite("mixed", "heldout", n=30) if t.metadata["variant"] == "city_setting")
    meta = task.metadata
    for value, solved in (("Nowhere", False), (meta["fact"], True)):
        with task.environment() as env:
            path = env.workspace / meta["path"]
            path.write_text(path.read_text().replace(meta["old"], meta["new"].format(fact=value)))
            result = score(task, None, env)
        assert result.correct is solved and result.scorer == "tests"


def test_unknown_suite_and_split_are_refused():
    with pytest.raises(ValueError, match="unknown built-in suite"):
        load_tasks("builtin:poetry")
    with pytest.raises(ValueError, match="unknown split"):
        load_tasks("builtin:data", split="test")


def test_the_patterns_cover_every_relation():
    from toolself.evals.suites.research import RELATIONS
    assert set(PATTERNS) == set(RELATIONS)
