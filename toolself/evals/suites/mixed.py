"""builtin:mixed — find a fact with the research tools, then compute with it over a file.

The first part is a 1-2 hop question over the split's encyclopedia (a city, or an
organisation's founding year); the second part uses that fact either to filter a data file in
the workspace and compute an exact number (`city_units`, `year_orders`: the Python tool), or to
set a value in a small package whose tests the grader checks with its own copy
(`city_setting`: the editor and the shell). Neither part can be done with the other's tools, so
the right toolbox changes in the middle of the task: the situation `reconfigure` is for.

Knobs: `hops=N` or `hops=N-M` (research hops, default 1-2), `rows=N` (default 24),
`distractors=N` (default 1).
"""

from __future__ import annotations

from typing import Any

from toolself.evals.suites.code import CHECK_COMMAND, grader_check
from toolself.evals.suites.common import (
    DEFAULT_SIZES, MONTHS, ORG_ROOTS, PRODUCTS, check_split, knob_int, knob_range, reject_unknown, rng_for,
    split_part,
)
from toolself.evals.suites.data import READ_SALES, csv_text
from toolself.evals.suites.research import NOUN_PHRASES, World, build_world, sample_chain, start_phrase
from toolself.evals.task import Task


VARIANTS = ("city_units", "year_orders", "city_setting")

CONFIG = '''"""Settings of the service."""

# The city the service is configured for: {phrase}.
HOME_CITY = "TODO"
'''

VISIBLE_TEST = '''import unittest

from {package} import config


class TestConfig(unittest.TestCase):
    def test_home_city_is_set(self):
        self.assertIsInstance(config.HOME_CITY, str)
        self.assertNotEqual(config.HOME_CITY, "TODO")
'''

# The grader's copy replaces the visible test at check time, so the value is never shown.
GRADER_TEST = '''import unittest

from {package} import config


class TestConfig(unittest.TestCase):
    def test_home_city_is_set(self):
        self.assertEqual(config.HOME_CITY, {fact!r})
'''


def _phrase(world: World, chain: list[dict[str, str]]) -> str:
    phrase = start_phrase(world.entities[chain[0]["entity"]])
    for step in chain:
        if step["relation"] in NOUN_PHRASES:
            phrase = NOUN_PHRASES[step["relation"]].format(x=phrase)
    return phrase


def generate(split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
    check_split(split)
    low, high = knob_range(knobs, "hops", (1, 2), 1, 4)
    rows = knob_int(knobs, "rows", 24, 5, 100_000)
    distractors = knob_int(knobs, "distractors", 1, 0, 3)
    reject_unknown("mixed", knobs)
    n = DEFAULT_SIZES[split] if n is None else n
    world = build_world("mixed", split, seed, distractors, size=0.6)
    rng = rng_for("mixed", split, seed, "tasks", low, high, rows, distractors)
    cities = [e.name for e in world.of_kind("city")]
    products = split_part(PRODUCTS, split)
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * max(n, 1):
            raise RuntimeError(f"could only make {len(tasks)} distinct mixed tasks")
        hops = rng.randint(low, high)
        variant = rng.choice(VARIANTS)
        if variant in ("city_units", "city_setting"):
            chain = sample_chain(world, rng, hops, end_kinds=("city",))
        else:
            chain = sample_chain(world, rng, hops - 1, end_kinds=("org",)) if hops > 1 else []
            if chain is None:
                continue
            if not chain:
                start = rng.choice(world.of_kind("org"))
                chain = [{"entity": start.name, "locator": start.locator, "relation": "org_year",
                          "value": str(start.facts["org_year"])}]
            else:
                org = world.entities[chain[-1]["value"]]
                chain = chain + [{"entity": org.name, "locator": org.locator, "relation": "org_year",
                                  "value": str(org.facts["org_year"])}]
        if chain is None:
            continue
        fact = chain[-1]["value"]
        extra: dict[str, Any] = {}
        if variant == "city_setting":
            package = f"{rng.choice(split_part(ORG_ROOTS, split)).lower()}_settings"
            phrase = _phrase(world, chain)
            files = {f"{package}/__init__.py": "", f"{package}/config.py": CONFIG.format(phrase=phrase),
                     "tests/__init__.py": "", "tests/test_config.py": VISIBLE_TEST.format(package=package)}
            question = (f'In the package "{package}", set HOME_CITY in {package}/config.py to {phrase}, then check '
                        f"that `{CHECK_COMMAND}` passes.")
            check_command, check_files, check_tests = grader_check(
                {"tests/test_config.py": GRADER_TEST.format(package=package, fact=fact)})
            extra = {"check_command": check_command, "check_timeout": 60.0, "check_files": check_files,
                     "check_tests": check_tests}
            answer, code, wrong = None, "", ""
            second = f"write it into {package}/config.py and run the tests"
            extra_meta = {"package": package, "path": f"{package}/config.py", "old": 'HOME_CITY = "TODO"',
                          "new": 'HOME_CITY = "{fact}"'}
        elif variant == "city_units":
            others = rng.sample([c for c in cities if c != fact], 3)
            places = [fact] + others
            table = [[1001 + i, rng.choice(places), rng.choice(products), rng.choice(MONTHS), rng.randrange(1, 20)]
                     for i in range(rows)]
            if not any(r[1] == fact for r in table):
                table[0][1] = fact
            files = {"sales.csv": csv_text(["order_id", "city", "product", "month", "units"], table)}
            answer = sum(r[4] for r in table if r[1] == fact)
            question = (f"The file sales.csv lists orders by city. How many units in total were sold in "
                        f"{_phrase(world, chain)}? Answer with a number.")
            code = READ_SALES + "print(sum(int(r['units']) for r in rows if r['city'] == {fact!r}))"
            wrong = READ_SALES + "print(sum(int(r['units']) for r in rows if r['city'] != {fact!r}))"
            second = "sum the units of the orders from that city in sales.csv"
        else:
            year = int(fact)
            table = [[2001 + i, rng.choice(products), year + rng.randrange(-40, 41), rng.randrange(1, 20)]
                     for i in range(rows)]
            files = {"contracts.csv": csv_text(["contract_id", "product", "year", "units"], table)}
            answer = sum(1 for r in table if r[2] > year)
            subject = _phrase(world, chain[:-1]) if len(chain) > 1 else start_phrase(world.entities[chain[0]["entity"]])
            question = (f"How many contracts in contracts.csv were signed after the year in which {subject} was "
                        f"founded? Answer with a number.")
            code = ("import csv\nrows = list(csv.DictReader(open('contracts.csv', newline='')))\n"
                    "print(sum(1 for r in rows if int(r['year']) > {fact}))")
            wrong = ("import csv\nrows = list(csv.DictReader(open('contracts.csv', newline='')))\n"
                     "print(sum(1 for r in rows if int(r['year']) >= {fact}))")
            second = "count the contracts in contracts.csv signed after that year"
        if variant != "city_setting":
            extra_meta = {}
        if question in seen:
            continue
        seen.add(question)
        tasks.append(Task(
            id=f"mixed-{split}-{seed}-{len(tasks):04d}", question=question,
            answer=None if answer is None else str(answer), level=len(chain) + 1,
            family="mixed", split=split, documents=world.documents, inline_files=files, **extra,
            metadata={"suite": "mixed", "seed": seed, "variant": variant, "chain": chain, "fact": fact,
                      "solution_code": code, "wrong_code": wrong, "second_part": second,
                      "inspect": list(files), **extra_meta,
                      "distractors": {s["entity"]: world.siblings.get(s["entity"], []) for s in chain}},
        ))
    return tasks
