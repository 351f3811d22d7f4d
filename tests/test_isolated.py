"""A pipeline step in a process of its own: its result comes back, its exception is raised in the
caller, and a child that dies without a result is reported, not waited on forever."""

from __future__ import annotations

import os

import pytest

from toolself.train.pipeline import StepDied, isolated


def test_the_function_runs_in_another_process_and_its_result_comes_back():
    assert isolated(os.getpid) != os.getpid()


def test_the_childs_exception_is_raised_in_the_caller_with_the_childs_traceback():
    with pytest.raises(ValueError, match="invalid literal") as caught:
        isolated(int, "not a number")
    assert any("in the step's process" in note for note in getattr(caught.value, "__notes__", []))


def test_a_child_that_exits_without_a_result_raises_step_died_with_its_exit_code():
    with pytest.raises(StepDied, match="exit code 3"):
        isolated(os._exit, 3)
