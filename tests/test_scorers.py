"""Scorers: the dispatch to each benchmark's rules, an LLM judge over a real HTTP endpoint on
loopback, and test execution in the attempt's workspace."""

from __future__ import annotations

import re
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from http_fixtures import running_server
from toolself.evals.judge import LLMJudge, Score, judge_prompt, parse_verdict
from toolself.evals.scorers import score
from toolself.evals.task import Task
from toolself.models.openai_compat import OpenAIModel


def test_an_answer_is_scored_by_the_rules_its_task_names():
    gaia = score(Task(id="t", question="q", answer="42"), "42.0")
    hotpot = score(Task(id="t", question="q", answer="the Beatles", metadata={"scorer": "hotpotqa_em"}), "Beatles")
    assert gaia == Score(True, "gaia", gaia.reason, gaia.details) and "42" in gaia.reason
    assert hotpot.correct and hotpot.scorer == "hotpotqa_em" and hotpot.metrics == {"em": 1.0, "f1": 1.0}


def test_an_unknown_scorer_is_an_error_not_a_silent_default():
    with pytest.raises(ValueError, match="unknown scorer 'gaia_exact'"):
        score(Task(id="t", question="q", answer="1", metadata={"scorer": "gaia_exact"}), "1")


def test_task_without_reference_or_check_is_never_correct():
    assert not score(Task(id="t", question="q"), "anything").correct


@pytest.mark.parametrize("reply, verdict", [
    ("The answers agree.\nVERDICT: CORRECT", True),
    ("They differ.\nVERDICT: INCORRECT", False),
    ("VERDICT: CORRECT\nVERDICT: INCORRECT", None),   # both: no guessing
    ("verdict: correct", None),                      # the exact form only
    ("It is correct.", None),
    ("", None),
])
def test_verdicts_are_parsed_strictly(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_the_judge_prompt_is_a_text_file_with_the_three_slots():
    prompt = judge_prompt()
    assert all(slot in prompt for slot in ("{question}", "{reference}", "{prediction}"))


class FakeJudgeServer:
    """An OpenAI chat-completions endpoint whose 'model' says CORRECT when the prediction
    contains the reference, or replies with nonsense when asked to."""

    def __init__(self, nonsense: bool = False):
        self.requests = 0
        self.nonsense = nonsense
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request) -> JSONResponse:
        self.requests += 1
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        reference = re.search(r"Reference answer:\n(.*?)\n\n", prompt, re.S).group(1).strip().lower()
        prediction = re.search(r"Assistant's answer:\n(.*?)\n\n", prompt, re.S).group(1).strip().lower()
        if self.nonsense:
            text = "I am not sure."
        elif reference in prediction:
            text = "The answer names the reference.\nVERDICT: CORRECT"
        else:
            text = "The answer does not name the reference.\nVERDICT: INCORRECT"
        return JSONResponse({
            "id": "cmpl-1", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


def judge_for(url: str, tmp_path) -> LLMJudge:
    model = OpenAIModel("judge", url + "/v1", "key", max_retries=0, timeout=10)
    return LLMJudge(model, cache_dir=tmp_path / "cache")


FRAMES_LIKE = Task(id="f1", question="Who designed the tower?", answer="Gustave Eiffel", metadata={"scorer": "judge"})


def test_judge_over_an_openai_compatible_endpoint(tmp_path):
    server = FakeJudgeServer()
    with running_server(server.app) as url:
        judge = judge_for(url, tmp_path)
        right = score(FRAMES_LIKE, "It was designed by Gustave Eiffel's company.", judge=judge)
        wrong = score(FRAMES_LIKE, "Le Corbusier", judge=judge)
    assert right.correct and right.scorer == "llm_judge" and "CORRECT" in right.reason
    assert not wrong.correct and wrong.scorer == "llm_judge"


def test_judge_verdicts_are_cached_on_disk(tmp_path):
    server = FakeJudgeServer()
    with running_server(server.app) as url:
        first = judge_for(url, tmp_path).judge("q", "Gustave Eiffel", "Gustave Eiffel, engineer")
        again = judge_for(url, tmp_path).judge("q", "Gustave Eiffel", "Gustave Eiffel, engineer")
    assert server.requests == 1
    assert first.correct and again.correct and again.details["cached"]


def test_an_unparsable_verdict_is_incorrect_and_not_cached(tmp_path):
    server = FakeJudgeServer(nonsense=True)
    with running_server(server.app) as url:
        judge = judge_for(url, tmp_path)
        result = judge.judge("q", "a", "a")
        judge.judge("q", "a", "a")
    assert not result.correct and "no strict verdict" in result.reason
    assert server.requests == 2 * judge.attempts


def test_the_judge_decides_even_an_exact_match(tmp_path):
    server = FakeJudgeServer()
    with running_server(server.app) as url:
        result = score(FRAMES_LIKE, "gustave eiffel", judge=judge_for(url, tmp_path))
    assert result.correct and result.scorer == "llm_judge" and server.requests == 1


def test_a_blank_answer_is_wrong_without_asking_the_judge_even_when_the_reference_is_punctuation(tmp_path):
    dashes = Task(id="f2", question="q", answer="-----", metadata={"scorer": "judge"})
    server = FakeJudgeServer()
    with running_server(server.app) as url:
        results = [score(dashes, answer, judge=judge_for(url, tmp_path)) for answer in ("", "-----", "?", "  ")]
    assert not any(r.correct for r in results) and server.requests == 0


def test_a_judge_task_without_a_judge_falls_back_to_a_named_exact_match():
    wrong, right = score(FRAMES_LIKE, "Eiffel"), score(FRAMES_LIKE, "gustave  EIFFEL")
    assert wrong.scorer == right.scorer == "exact_fallback" and right.correct and not wrong.correct
    assert "no judge configured" in wrong.reason


DONE_TEST = """import unittest


class TestDone(unittest.TestCase):
    def test_done(self):
        with open("done.txt") as handle:
            self.assertEqual(handle.read(), "yes")
"""


def check_task(command: str = "python3 -m unittest tests.test_done", timeout: float = 30.0) -> Task:
    files = {"tests/__init__.py": "", "tests/test_done.py": DONE_TEST}
    return Task(id="check", question="make done.txt", family="code", check_command=command, check_timeout=timeout,
                inline_files=files, check_files=files, check_tests={"tests": ["tests.test_done.TestDone.test_done"]})


def test_test_execution_runs_the_check_in_the_workspace():
    task = check_task()
    with task.environment() as env:
        before = score(task, None, env)
        (env.workspace / "done.txt").write_text("yes")
        after = score(task, None, env)
    assert not before.correct and before.scorer == "tests" and before.details["exit_status"] == 1
    assert after.correct and after.reason == "all 1 expected tests passed"


def test_a_check_that_runs_too_long_is_killed_and_fails():
    task = check_task("sleep 30", timeout=0.5)
    started = time.monotonic()
    with task.environment() as env:
        result = score(task, None, env)
    assert time.monotonic() - started < 10
    assert not result.correct and "timed out" in result.reason


def test_the_graders_copy_of_the_tests_is_restored_before_the_check():
    task = check_task()
    with task.environment() as env:
        (env.workspace / "tests" / "test_done.py").write_text(DONE_TEST.replace('"yes"', "handle.read()"))
        result = score(task, None, env)
    assert not result.correct and result.details["tests"] == {"tests.test_done.TestDone.test_done": "error"}
