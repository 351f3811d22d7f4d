"""FRAMES and xbench: each benchmark's judge protocol over a real endpoint on loopback, a named
exact-match fallback without a judge, and no credit ever for a blank answer."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from http_fixtures import running_server
from toolself.evals.loaders import load_tasks
from toolself.evals.rules.judged import FRAMES, XBENCH, exact_fallback, is_blank
from toolself.evals.scorers import LLMJudge, score
from toolself.models.openai_compat import OpenAIModel

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples"


@pytest.mark.parametrize("answer, blank", [
    ("", True), (None, True), ("-----", True), ("?", True), ("  ", True), ("。！", True), ("—", True),
    ("0", False), ("北京", False), ("a", False),
])
def test_blank_means_nothing_but_punctuation_and_space(answer, blank):
    assert is_blank(answer) is blank


@pytest.mark.parametrize("answer, gold, expected", [
    ("", "-----", False),          # a gold that normalises to nothing matches no blank answer
    ("-----", "-----", False),
    ("?", "?!", False),
    ("Gustave  EIFFEL", "Gustave Eiffel", True),
    ("Eiffel", "Gustave Eiffel", False),
])
def test_exact_fallback(answer, gold, expected):
    assert exact_fallback(answer, gold)[0] is expected


@pytest.mark.parametrize("protocol, reply, verdict", [
    (FRAMES, 'Explanation: same person.\nDecision: TRUE', True),
    (FRAMES, '"Explanation:" differs.\n"Decision:" "FALSE"', False),
    (FRAMES, "Decision: TRUE\nDecision: FALSE", None),
    (FRAMES, "It is right.", None),
    (XBENCH, "最终答案: 北京\n解释: 一致。\n结论: 正确", True),
    (XBENCH, "最终答案: 上海\n解释: 不一致。\n结论: 错误", False),
    (XBENCH, "结论: 正确\n结论: 错误", None),
    (XBENCH, "正确", None),
])
def test_each_protocol_reads_only_its_own_decision_line(protocol, reply, verdict):
    assert protocol.parse(reply) is verdict


class ProtocolJudge:
    """A chat endpoint that grades in whichever protocol the prompt is written in: correct when
    the answer contains the reference."""

    def __init__(self):
        self.prompts: list[str] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        self.prompts.append(prompt)
        if "===Task===" in prompt:
            answer = re.search(r"- Predicted Answer: (.*)\n- Ground Truth Answer: (.*)\n", prompt)
            text = f"Explanation: compared.\nDecision: {'TRUE' if answer[2] in answer[1] else 'FALSE'}"
        else:
            reference = re.search(r"\[正确答案\]: (.*)\n", prompt)[1]
            answer = re.search(r"\[回答\]:(.*)\n", prompt)[1]
            text = f"最终答案: {answer}\n解释: 比较。\n结论: {'正确' if reference in answer else '错误'}"
        return JSONResponse({
            "id": "c", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


def test_frames_and_xbench_are_judged_in_their_own_protocols(tmp_path):
    frames = load_tasks(f"frames:{SAMPLES / 'frames' / 'test_sample.tsv'}", limit=1)[0]
    xbench = load_tasks(f"xbench:{SAMPLES / 'xbench_deepsearch' / 'DeepSearch-2510_sample.csv'}", limit=1)[0]
    server = ProtocolJudge()
    with running_server(server.app) as url:
        judge = LLMJudge(OpenAIModel("judge", url + "/v1", "k", max_retries=0, timeout=10), cache_dir=tmp_path)
        results = [score(frames, f"It is {frames.answer}.", judge=judge), score(frames, "nobody", judge=judge),
                   score(xbench, f"答案是{xbench.answer}", judge=judge), score(xbench, "不知道", judge=judge)]
    assert [(r.scorer, r.correct) for r in results] == [("frames_judge", True), ("frames_judge", False),
                                                       ("xbench_judge", True), ("xbench_judge", False)]
    assert "===Task===" in server.prompts[0] and "[正确答案]" in server.prompts[2]
    assert results[0].details["protocol"] == "frames" and results[2].details["protocol"] == "xbench"


def test_every_frames_and_xbench_sample_gold_is_correct_under_the_fallback_and_names_it():
    tasks = (load_tasks(f"frames:{SAMPLES / 'frames' / 'test_sample.tsv'}")
             + load_tasks(f"xbench:{SAMPLES / 'xbench_deepsearch' / 'DeepSearch-2510_sample.csv'}"))
    results = [score(t, t.answer) for t in tasks]
    assert len(results) == 13 and all(r.correct and r.scorer == "exact_fallback" for r in results)
    assert not any(score(t, "").correct for t in tasks)
