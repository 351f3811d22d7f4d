"""builtin:code — fix the planted bugs of a small generated Python package.

A task's workspace holds a package of three or four small functions with unittest tests;
one or two functions carry a planted bug, so some tests fail. The task is solved when the
package's tests pass (`python -m unittest discover -s tests`), checked by running them with the
grader's own copy of the tests. Each function template has two known bugs, an obvious one
(a wrong name or operator) and a subtle one (an off-by-one, a boundary); templates are split
between `train` and `heldout`, so held-out bugs sit in functions never seen in training.

Knobs: `bugs=N` or `bugs=N-M` (planted bugs per task, default 1-2), `subtlety=0|1|2` (obvious,
subtle, or either, default 2), `functions=N` (functions per package, default 3).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import Any

from toolself.evals.suites.common import (
    DEFAULT_SIZES, ORG_ROOTS, check_split, knob_int, knob_range, reject_unknown, rng_for, split_part,
)
from toolself.evals.task import Task

CHECK_COMMAND = "python3 -m unittest discover -s tests"


def grader_check(tests: dict[str, str]) -> tuple[str, dict[str, str], dict[str, list[str]]]:
    """(command, files, expected tests) of the grader's check over these unittest files: the
    command names them, so a test file the attempt added is never imported; the files restored
    include the test package's `__init__.py`, which runs before them; every test method of every
    file must be reported passed."""
    modules, ids = [], []
    for path in sorted(tests):
        module = path[:-3].replace("/", ".")
        modules.append(module)
        for node in ast.parse(tests[path]).body:
            if isinstance(node, ast.ClassDef):
                ids += [f"{module}.{node.name}.{item.name}" for item in node.body
                        if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]
    return "python3 -m unittest " + " ".join(modules), {"tests/__init__.py": "", **tests}, {"tests": ids}


@dataclass(frozen=True)
class Template:
    name: str
    module: str
    source: str
    tests: str  # assertion lines using `self`
    obvious: tuple[str, str]  # (correct snippet, buggy snippet)
    subtle: tuple[str, str]


def _t(name: str, module: str, source: str, tests: str, obvious: tuple[str, str], subtle: tuple[str, str]) -> Template:
    return Template(name, module, textwrap.dedent(source).strip() + "\n", textwrap.dedent(tests).strip(), obvious, subtle)


TEMPLATES: list[Template] = [
    _t("clamp", "mathutils", '''
        def clamp(value, low, high):
            """Limit value to the range [low, high]."""
            if value < low:
                return low
            if value > high:
                return high
            return value
        ''', '''
        self.assertEqual(clamp(5, 0, 10), 5)
        self.assertEqual(clamp(-1, 0, 10), 0)
        self.assertEqual(clamp(15, 0, 10), 10)
        ''', ("if value > high:\n        return high", "if value > high:\n        return low"),
        ("if value < low:", "if value < low - 1:")),
    _t("mean", "mathutils", '''
        def mean(values):
            """Arithmetic mean of a non-empty list."""
            return sum(values) / len(values)
        ''', '''
        self.assertEqual(mean([2, 4, 6]), 4)
        self.assertEqual(mean([5]), 5)
        ''', ("sum(values) /", "max(values) /"), ("/ len(values)", "/ (len(values) - 1)")),
    _t("median", "mathutils", '''
        def median(values):
            """Median of a non-empty list."""
            ordered = sorted(values)
            middle = len(ordered) // 2
            if len(ordered) % 2 == 1:
                return ordered[middle]
            return (ordered[middle - 1] + ordered[middle]) / 2
        ''', '''
        self.assertEqual(median([3, 1, 2]), 2)
        self.assertEqual(median([4, 1, 3, 2]), 2.5)
        ''', ("ordered = sorted(values)", "ordered = list(values)"),
        ("(ordered[middle - 1] + ordered[middle]) / 2", "(ordered[middle] + ordered[middle + 1]) / 2")),
    _t("word_count", "textutils", '''
        def word_count(text):
            """Number of words separated by any whitespace."""
            return len(text.split())
        ''', '''
        self.assertEqual(word_count("one two  three"), 3)
        self.assertEqual(word_count(""), 0)
        ''', ("return len(text.split())", "return len(text.split()) + 1"), ("text.split()", 'text.split(" ")')),
    _t("reverse_words", "textutils", '''
        def reverse_words(sentence):
            """The words of a sentence in reverse order."""
            return " ".join(reversed(sentence.split()))
        ''', '''
        self.assertEqual(reverse_words("red green blue"), "blue green red")
        self.assertEqual(reverse_words("solo"), "solo")
        ''', ('" ".join(reversed(sentence.split()))', "sentence[::-1]"),
        ("reversed(sentence.split())", "sorted(sentence.split(), reverse=True)")),
    _t("initials", "textutils", '''
        def initials(name):
            """Upper-case initials of each part of a name: 'ada king lovelace' -> 'AKL'."""
            return "".join(part[0].upper() for part in name.split())
        ''', '''
        self.assertEqual(initials("ada king lovelace"), "AKL")
        self.assertEqual(initials("alan turing"), "AT")
        ''', ("part[0].upper()", "part[-1].upper()"), ("name.split()", "name.split()[1:]")),
    _t("range_sum", "mathutils", '''
        def range_sum(start, stop):
            """Sum of the integers from start to stop, both included."""
            return sum(range(start, stop + 1))
        ''', '''
        self.assertEqual(range_sum(1, 4), 10)
        self.assertEqual(range_sum(3, 3), 3)
        ''', ("return sum(range(", "return len(range("), ("range(start, stop + 1)", "range(start, stop)")),
    _t("last_items", "listutils", '''
        def last_items(items, count):
            """The last `count` items, in order (all of them if there are fewer)."""
            if count <= 0:
                return []
            return items[-count:]
        ''', '''
        self.assertEqual(last_items([1, 2, 3, 4], 2), [3, 4])
        self.assertEqual(last_items([1, 2, 3], 1), [3])
        self.assertEqual(last_items([1, 2, 3], 0), [])
        ''', ("if count <= 0:\n        return []", "if count <= 0:\n        return items"),
        ("items[-count:]", "items[-count + 1:]")),
    _t("running_total", "listutils", '''
        def running_total(values):
            """Cumulative sums: [1, 2, 3] -> [1, 3, 6]."""
            totals = []
            current = 0
            for value in values:
                current += value
                totals.append(current)
            return totals
        ''', '''
        self.assertEqual(running_total([1, 2, 3]), [1, 3, 6])
        self.assertEqual(running_total([]), [])
        ''', ("current += value", "current = value"),
        ("current += value\n        totals.append(current)", "totals.append(current)\n        current += value")),
    _t("max_index", "listutils", '''
        def max_index(values):
            """Index of the first largest value."""
            best = 0
            for index in range(1, len(values)):
                if values[index] > values[best]:
                    best = index
            return best
        ''', '''
        self.assertEqual(max_index([9, 1, 2]), 0)
        self.assertEqual(max_index([1, 5, 5, 2]), 1)
        ''', ("best = 0", "best = 1"), ("values[index] > values[best]", "values[index] >= values[best]")),
    _t("is_leap", "dates", '''
        def is_leap(year):
            """Whether a year is a Gregorian leap year."""
            return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        ''', '''
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(1900))
        self.assertTrue(is_leap(2000))
        self.assertFalse(is_leap(2002))
        ''', ("year % 4 == 0 and", "year % 2 == 0 and"),
        ("(year % 100 != 0 or year % 400 == 0)", "year % 100 != 0")),
    _t("days_in_month", "dates", '''
        def days_in_month(month, leap=False):
            """Days in a month (1-12) of the Gregorian calendar."""
            if month == 2:
                return 29 if leap else 28
            if month in (4, 6, 9, 11):
                return 30
            return 31
        ''', '''
        self.assertEqual(days_in_month(2), 28)
        self.assertEqual(days_in_month(2, leap=True), 29)
        self.assertEqual(days_in_month(8), 31)
        self.assertEqual(days_in_month(9), 30)
        ''', ("29 if leap else 28", "28 if leap else 29"), ("(4, 6, 9, 11)", "(4, 6, 8, 11)")),
    _t("apply_discount", "pricing", '''
        def apply_discount(price, percent):
            """Price after a percentage discount, rounded to cents."""
            return round(price * (100 - percent) / 100, 2)
        ''', '''
        self.assertEqual(apply_discount(200, 25), 150)
        self.assertEqual(apply_discount(19.99, 10), 17.99)
        ''', ("price * (100 - percent) / 100", "price * percent / 100"),
        ("round(price * (100 - percent) / 100, 2)", "round(price * (100 - percent) / 100)")),
    _t("total_with_tax", "pricing", '''
        def total_with_tax(prices, rate):
            """Sum of prices plus tax at `rate` (0.2 means 20%), rounded to cents."""
            subtotal = sum(prices)
            return round(subtotal * (1 + rate), 2)
        ''', '''
        self.assertEqual(total_with_tax([10, 5], 0.2), 18.0)
        self.assertEqual(total_with_tax([], 0.2), 0)
        ''', ("subtotal * (1 + rate)", "subtotal * rate"), ("subtotal = sum(prices)", "subtotal = sum(prices[1:])")),
    _t("celsius_to_fahrenheit", "units", '''
        def celsius_to_fahrenheit(celsius):
            """Degrees Fahrenheit for degrees Celsius."""
            return celsius * 9 / 5 + 32
        ''', '''
        self.assertEqual(celsius_to_fahrenheit(100), 212)
        self.assertEqual(celsius_to_fahrenheit(0), 32)
        ''', ("celsius * 9 / 5", "celsius * 5 / 9"), ("celsius * 9 / 5 + 32", "(celsius + 32) * 9 / 5")),
    _t("chunk", "listutils", '''
        def chunk(items, size):
            """Split items into lists of `size` items (the last may be shorter)."""
            return [items[i:i + size] for i in range(0, len(items), size)]
        ''', '''
        self.assertEqual(chunk([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])
        self.assertEqual(chunk([1, 2, 3, 4], 2), [[1, 2], [3, 4]])
        ''', ("items[i:i + size]", "items[i:size]"), ("range(0, len(items), size)", "range(0, len(items) - 1, size)")),
]


def _module_source(templates: list[Template]) -> str:
    return "\n\n".join(t.source for t in templates)


def _test_source(package: str, module: str, templates: list[Template]) -> str:
    names = ", ".join(t.name for t in templates)
    lines = ["import unittest", "", f"from {package}.{module} import {names}", "", ""]
    lines.append(f"class Test{module.capitalize()}(unittest.TestCase):")
    for t in templates:
        lines.append(f"    def test_{t.name}(self):")
        lines += ["        " + line for line in t.tests.splitlines()]
        lines.append("")
    lines += ["", 'if __name__ == "__main__":', "    unittest.main()", ""]
    return "\n".join(lines)


def generate(split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
    check_split(split)
    low, high = knob_range(knobs, "bugs", (1, 2), 1, 3)
    subtlety = knob_int(knobs, "subtlety", 2, 0, 2)
    functions = knob_int(knobs, "functions", 3, 2, 6)
    reject_unknown("code", knobs)
    if high > functions:
        raise ValueError(f"bugs={high} needs at least as many functions (functions={functions})")
    n = DEFAULT_SIZES[split] if n is None else n
    rng = rng_for("code", split, seed, low, high, subtlety, functions)
    templates = split_part(TEMPLATES, split)
    roots = split_part(ORG_ROOTS, split)
    tasks = []
    seen: set[tuple] = set()
    while len(tasks) < n:
        chosen = rng.sample(templates, functions)
        count = rng.randint(low, high)
        buggy = rng.sample(chosen, count)
        kinds = {t.name: (rng.choice(["obvious", "subtle"]) if subtlety == 2 else ("obvious", "subtle")[subtlety])
                 for t in buggy}
        package = f"{rng.choice(roots).lower()}_{rng.choice(['kit', 'lib', 'tools', 'utils', 'core'])}"
        key = (package, tuple(sorted(t.name for t in chosen)), tuple(sorted(kinds.items())))
        if key in seen and len(seen) < 50 * n:
            continue
        seen.add(key)
        modules: dict[str, list[Template]] = {}
        for t in sorted(chosen, key=lambda t: (t.module, t.name)):
            modules.setdefault(t.module, []).append(t)
        files: dict[str, str] = {f"{package}/__init__.py": f'"""The {package} package."""\n',
                                 "tests/__init__.py": ""}
        tests: dict[str, str] = {}
        bugs = []
        for module, members in modules.items():
            source = _module_source(members)
            for t in members:
                if t.name in kinds:
                    correct, wrong = getattr(t, kinds[t.name])
                    assert source.count(correct) == 1, (t.name, correct)
                    source = source.replace(correct, wrong)
                    bugs.append({"function": t.name, "path": f"{package}/{module}.py", "kind": kinds[t.name],
                                 "buggy": wrong, "fix": correct, "test": f"test_{t.name}"})
            files[f"{package}/{module}.py"] = source
            tests[f"tests/test_{module}.py"] = _test_source(package, module, members)
        files.update(tests)
        question = (f'The unit tests of the Python package "{package}" in your workspace fail. Find and fix the '
                    f"bug(s) in the package, not in the tests, so that `{CHECK_COMMAND}` passes.")
        check_command, check_files, check_tests = grader_check(tests)
        tasks.append(Task(
            id=f"code-{split}-{seed}-{len(tasks):04d}", question=question, answer=None, level=len(bugs),
            family="code", split=split, inline_files=files, check_command=check_command, check_timeout=60.0,
            check_files=check_files, check_tests=check_tests,
            metadata={"suite": "code", "seed": seed, "package": package, "bugs": bugs, "scorer": "tests",
                      "functions": [t.name for t in chosen]},
        ))
    return tasks
