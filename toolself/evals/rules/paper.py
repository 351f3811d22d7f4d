"""The authors' evaluator chain (scorer `paper`): how the paper's numbers were made.

Every dataset, GAIA included, goes through the same four steps, and the first that says
correct decides:
1. exact: the answer equals the reference (surrounding whitespace ignored);
2. normalised: equal after lower-casing and removing punctuation, articles and extra spaces;
3. numeric: the first number of the answer is within 1% of the first number of the reference;
4. an LLM judge (temperature 0: the `paper` preset builds it so) asked for YES or NO, with
   extra context around a correct answer counting as correct.

This differs from GAIA's leaderboard rules (`gaia`): a numeric answer 1% off, or a right answer
inside a sentence, passes here and fails there. Without a judge the chain stops after step 3,
and its verdict is named `paper_without_judge` so that a table never passes it off as the
paper's number.
"""

from __future__ import annotations

import re
from importlib import resources

from toolself.evals.rules.hotpotqa import normalize_answer
from toolself.evals.rules.judged import JudgeProtocol, is_blank
from toolself.evals.judge import LLMJudge, Score
from toolself.evals.task import Task

NAME = "paper"
TOLERANCE = 0.01
STEPS = ("exact", "normalised", "numeric", "judge")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_YES_NO = re.compile(r"\b(YES|NO)\b")


def first_number(text: str) -> float | None:
    found = _NUMBER.search(text.replace("\u2212", "-"))
    if found is None:
        return None
    try:
        return float(found.group(0).replace(",", ""))
    except ValueError:
        return None


def within_tolerance(prediction: str, reference: str, tolerance: float = TOLERANCE) -> bool:
    """Whether the first numbers of both are within `tolerance` of the reference's (a zero
    reference needs an exact zero)."""
    got, want = first_number(prediction), first_number(reference)
    if got is None or want is None:
        return False
    return abs(got - want) <= tolerance * abs(want)


def parse_yes_no(reply: str) -> bool | None:
    """YES -> True, NO -> False; a reply with neither, or with both, is no verdict."""
    found = set(_YES_NO.findall((reply or "").upper()))
    return found == {"YES"} if len(found) == 1 else None


JUDGE = JudgeProtocol("paper", resources.files("toolself").joinpath("prompts/paper/judge.txt").read_text(
    encoding="utf-8"), parse_yes_no)


def paper_score(task: Task, prediction: str | None, judge: LLMJudge | None) -> Score:
    details = {"reference": task.answer, "prediction": prediction}
    if is_blank(prediction):
        return Score(False, NAME, "the answer is empty or only punctuation", {**details, "step": None})
    answer, reference = str(prediction), str(task.answer)
    checks = {
        "exact": lambda: answer.strip() == reference.strip(),
        "normalised": lambda: normalize_answer(answer) == normalize_answer(reference),
        "numeric": lambda: within_tolerance(answer, reference),
    }
    for step, check in checks.items():
        if check():
            return Score(True, NAME, f"correct at the {step} step", {**details, "step": step})
    if judge is None:
        return Score(False, f"{NAME}_without_judge", "no exact, normalised or numeric match, and no judge "
                     "configured for the last step", {**details, "step": None})
    verdict = judge.judge(task.question, reference, answer, protocol=JUDGE)
    verdict.scorer = NAME
    verdict.details = {**verdict.details, **details, "step": "judge"}
    return verdict
