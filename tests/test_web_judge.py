"""The LLM judge against a loopback OpenAI-compatible server that misbehaves: rate limits and
server errors are retried, and a judge that stays down, answers too slowly or answers
something that is not a chat completion is a recorded failure (never a crash, never cached)."""

import time

import pytest

from toolself.evals.scorers import LLMJudge
from toolself.models.openai_compat import OpenAIModel
from web_fakes import FakeService, Reply


def completion(text):
    return {"id": "c1", "object": "chat.completion", "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


CORRECT = completion("Same city.\nVERDICT: CORRECT")


def judge_at(url, tmp_path, timeout=5.0):
    model = OpenAIModel("judge", url + "/v1", api_key="k", max_retries=2, backoff_base=0.01, timeout=timeout)
    return LLMJudge(model, cache_dir=tmp_path / "verdicts")


def test_a_rate_limited_judge_is_asked_again_after_the_time_it_asks(tmp_path):
    service = FakeService([Reply(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})],
                          default=Reply(200, CORRECT))
    started = time.monotonic()
    with service.running() as url:
        verdict = judge_at(url, tmp_path).judge("Where?", "Paris", "paris, France")
    assert verdict.correct and verdict.scorer == "llm_judge"
    assert time.monotonic() - started >= 1.0 and len(service.requests) == 2


def test_server_errors_of_the_judge_are_retried(tmp_path):
    service = FakeService([Reply(500, "oops"), Reply(503, "busy")], default=Reply(200, CORRECT))
    with service.running() as url:
        assert judge_at(url, tmp_path).judge("Where?", "Paris", "Paris").correct


def test_a_judge_that_stays_down_is_a_recorded_failure_that_is_not_cached(tmp_path):
    service = FakeService([], default=Reply(500, "down"))
    with service.running() as url:
        judge = judge_at(url, tmp_path)
        verdict = judge.judge("Where?", "Paris", "Paris!")
    assert not verdict.correct and verdict.details["judge_failed"]
    assert "the judge failed" in verdict.reason and "500" in verdict.reason
    assert not list((tmp_path / "verdicts").rglob("*.json"))


def test_a_judge_that_answers_too_slowly_is_a_recorded_failure(tmp_path):
    service = FakeService([], default=Reply(200, CORRECT, delay=3.0))
    with service.running() as url:
        verdict = judge_at(url, tmp_path, timeout=0.3).judge("Where?", "Paris", "Lyon")
    assert not verdict.correct and verdict.details["judge_failed"]


@pytest.mark.parametrize("body", ["<html>gateway</html>", {"choices": []}, {"object": "error"}])
def test_a_body_that_is_not_a_completion_is_a_recorded_failure(tmp_path, body):
    service = FakeService([], default=Reply(200, body))
    with service.running() as url:
        verdict = judge_at(url, tmp_path).judge("Where?", "Paris", "Lyon")
    assert not verdict.correct and verdict.details["judge_failed"]


def test_a_failed_judge_is_asked_again_on_the_next_run(tmp_path):
    down = FakeService([], default=Reply(500, "down"))
    with down.running() as url:
        assert judge_at(url, tmp_path).judge("Where?", "Paris", "Paris!").details["judge_failed"]
    up = FakeService([], default=Reply(200, CORRECT))
    with up.running() as url:
        assert judge_at(url, tmp_path).judge("Where?", "Paris", "Paris!").correct


def test_a_judge_that_refuses_temperature_0_judges_at_its_default_and_the_verdict_says_so(tmp_path):
    refusal = Reply(400, {"error": {"message": "Unsupported value: 'temperature' does not support 0 with this model. "
                                               "Only the default (1) value is supported.",
                                    "type": "invalid_request_error", "param": "temperature",
                                    "code": "unsupported_value"}})
    service = FakeService([refusal], default=Reply(200, CORRECT))
    with service.running() as url:
        model = OpenAIModel("gpt-5", url + "/v1", api_key="k", temperature=0.0, max_retries=0)
        verdict = LLMJudge(model, cache_dir=tmp_path / "verdicts").judge("Where?", "Paris", "Paris")
    assert verdict.correct and verdict.details["judge_refused_fields"] == ["temperature"]
    assert [("temperature" in r["body"]) for r in service.requests] == [True, False]


def test_an_attempts_record_names_the_fields_its_judge_refused():
    from toolself.agent import AgentSettings
    from toolself.evals.attempt import Job, record
    from toolself.evals.judge import Score
    from toolself.evals.records import AttemptKey
    from toolself.evals.task import Task
    from toolself.trajectory import Trajectory

    job = Job(AttemptKey("frames:f.tsv", "q1", "toolself"), Task(id="q1", question="Where?"), AgentSettings())
    answered = Trajectory(task="Where?", answer="Paris", end_reason="terminate")
    verdict = Score(True, "llm_judge", "the judge said CORRECT", {"judge_refused_fields": ["temperature"]})
    assert record(job, answered, verdict, None, 1.0).extra == {"judge_refused_fields": ["temperature"]}
    assert record(job, answered, Score(True, "llm_judge", "the judge said CORRECT"), None, 1.0).extra == {}
