"""The built-in offline suites: generated tasks with train and held-out splits.

`generate_suite("research" | "data" | "code" | "mixed", split, n, seed, **knobs)` returns the
same tasks for the same arguments and the same secret key (`common.suite_key`) on any machine. The code in mixed tasks is a template whose
`{fact}` the solver fills with what it found in the first part; see each module for its knobs.
"""

from __future__ import annotations

from typing import Any

from toolself.evals.task import Task

SUITES = ("research", "data", "code", "mixed")


def generate_suite(name: str, split: str = "heldout", n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
    if name not in SUITES:
        raise ValueError(f"unknown built-in suite {name!r}; available: {', '.join(SUITES)}")
    if name == "research":
        from toolself.evals.suites.research import generate
    elif name == "data":
        from toolself.evals.suites.data import generate
    elif name == "code":
        from toolself.evals.suites.code import generate
    else:
        from toolself.evals.suites.mixed import generate
    return generate(split, n=n, seed=seed, **knobs)
