"""FRAMES and xbench-DeepSearch: an LLM judge with each benchmark's own grading prompt.

FRAMES (Krishna et al., 2024, appendix "auto-rater"): the judge decides whether the meaning and
vital facts of the ground truth are present in the answer and ends with `Decision: TRUE|FALSE`.
xbench-DeepSearch (xbench-evals): the judge extracts the final answer, explains, and ends with
`结论: 正确|错误`. Both prompts are kept in their published wording; a reply without exactly one
decision in that format counts as no verdict, never as a guess.

Without a judge the score is a normalised exact match named `exact_fallback`, so a table never
passes it off as the benchmark's number. An answer that is empty, or nothing but punctuation
and whitespace, is wrong under either scorer and is not shown to the judge.
"""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass
from typing import Callable

from toolself.evals.rules.gaia import normalize_str


@dataclass(frozen=True)
class JudgeProtocol:
    """A benchmark's grading prompt (with `{question}`, `{reference}`, `{prediction}`) and the
    parser of its decision line: True / False, or None when the reply holds no single decision."""

    name: str
    prompt: str
    parse: Callable[[str], bool | None]


def _single(pattern: re.Pattern[str], positive: str) -> Callable[[str], bool | None]:
    def parse(reply: str) -> bool | None:
        found = pattern.findall(reply or "")
        if len(set(found)) != 1:
            return None
        return found[0] == positive
    return parse


FRAMES_PROMPT = """===Task===
I need your help in evaluating an answer provided by an LLM against a ground truth answer. Your task is to determine if the ground truth answer is present in the LLM's response. Please analyze the provided data and make a decision.
===Instructions===
1. Carefully compare the "Predicted Answer" with the "Ground Truth Answer".
2. Consider the substance of the answers - look for equivalent information or correct answers. Do not focus on exact wording unless the exact wording is crucial to the meaning.
3. Your final decision should be based on whether the meaning and the vital facts of the "Ground Truth Answer" are present in the "Predicted Answer:"
===Input Data===
- Question: {question}
- Predicted Answer: {prediction}
- Ground Truth Answer: {reference}
===Output Format===
Provide your final evaluation in the following format:
"Explanation:" (How you made the decision?)
"Decision:" ("TRUE" or "FALSE" )
Please proceed with the evaluation."""

XBENCH_PROMPT = """你是一个通用人工智能助手。根据下面给出的[正确答案], 判断以下对[原问题]的[回答]的回答是否正确。

[原问题]: {question}

[正确答案]: {reference}

[回答]:{prediction}

你的判断必须按照以下格式和标准进行:

最终答案: 从[回答]中提取出的最终准确答案。如果[回答]中没有明确的最终答案, 则填写'无'。

解释: 根据[正确答案]解释为什么[最终答案]是正确的或错误的。只关注[最终答案]与[正确答案]之间是否存在实质性差异, 不要评论题目的背景, 不要尝试重新解题, 不要为任何不同于[正确答案]的答案辩护, 只专注于判断答案是否一致。

结论: 如果[最终答案]与上方给出的[正确答案]一致, 或者在数值题目中处于可接受的微小误差范围内, 则填写'正确'; 否则（即存在任何不一致、歧义、不等价或提取出的答案错误的情况）填写'错误'。"""

FRAMES = JudgeProtocol("frames", FRAMES_PROMPT,
                       _single(re.compile(r"^\W*Decision\W*\s*(TRUE|FALSE)\b", re.MULTILINE | re.IGNORECASE), "TRUE"))
XBENCH = JudgeProtocol("xbench", XBENCH_PROMPT, _single(re.compile(r"^\W*结论\s*[:：]\s*\W*(正确|错误)", re.MULTILINE), "正确"))
PROTOCOLS = {"frames": FRAMES, "xbench": XBENCH}


def _is_punctuation_or_space(char: str) -> bool:
    return char.isspace() or char in string.punctuation or unicodedata.category(char).startswith(("P", "S"))


def is_blank(answer: str | None) -> bool:
    """No answer at all: None, empty, or only whitespace and punctuation (in any script)."""
    return answer is None or all(_is_punctuation_or_space(c) for c in str(answer))


def exact_fallback(prediction: str | None, reference: str) -> tuple[bool, str]:
    """(match, why): whitespace, case and ASCII punctuation ignored; a blank answer never matches,
    even a reference that normalises to nothing."""
    if is_blank(prediction):
        return False, "the answer is empty or only punctuation"
    pred, ref = normalize_str(str(prediction)), normalize_str(reference)
    ok = pred == ref
    return ok, "normalised strings " + ("match" if ok else f"differ: {pred!r} vs {ref!r}")
