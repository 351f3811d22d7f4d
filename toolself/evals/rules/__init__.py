"""Each benchmark scored by its own published rules, under a name every score record carries.

| scorer           | benchmark          | `correct` means                       | also reported          |
|------------------|--------------------|---------------------------------------|------------------------|
| `gaia`           | GAIA (default)     | the leaderboard's question_scorer     |                        |
| `gaia_lenient`   | opt-in             | the same, units after numbers allowed |                        |
| `hotpotqa_em`    | HotpotQA           | official EM                           | `em`, `f1`             |
| `gsm8k_flexible` | GSM8K (default)    | last number equals the reference      | `strict`, `flexible`   |
| `gsm8k_strict`   | GSM8K              | `#### N` / `The answer is N` equals   | `strict`, `flexible`   |
| `frames_judge`   | FRAMES             | the FRAMES auto-rater said TRUE       |                        |
| `xbench_judge`   | xbench-DeepSearch  | the xbench judge said 正确            |                        |
| `judge`          | any JSONL          | toolself's generic judge              |                        |
| `exact_fallback` | the judged ones    | normalised exact match, no judge given|                        |
| `paper`          | any (`--preset`)   | exact, normalised, 1% numeric, judge  | the deciding step      |

SWE-bench is decided from the test log (`toolself.evals.rules.swebench`), not from an answer.
A task names its scorer in `metadata["scorer"]` (the loaders set it); without one it is `gaia`.
"""

from __future__ import annotations

from typing import Callable

from toolself.evals.rules import gaia, gsm8k, hotpotqa, judged, paper
from toolself.evals.judge import LLMJudge, Score
from toolself.evals.task import Task


def _gaia(match: Callable[[str | None, str], tuple[bool, str]], name: str):
    def scorer(task: Task, prediction: str | None, judge: LLMJudge | None) -> Score:
        ok, why = match(prediction, task.answer)
        return Score(ok, name, why, {"reference": task.answer, "prediction": prediction})
    return scorer


def _hotpotqa(task: Task, prediction: str | None, judge: LLMJudge | None) -> Score:
    text = "" if prediction is None else str(prediction)
    em, f1 = hotpotqa.exact_match(text, task.answer), hotpotqa.f1(text, task.answer)
    why = (f"normalised answers {'match' if em else 'differ'}: {hotpotqa.normalize_answer(text)!r} vs "
           f"{hotpotqa.normalize_answer(task.answer)!r}; F1 {f1:.3f}")
    return Score(em, "hotpotqa_em", why, {"reference": task.answer, "prediction": prediction},
                  metrics={"em": float(em), "f1": f1})


def _gsm8k(primary: str):
    def scorer(task: Task, prediction: str | None, judge: LLMJudge | None) -> Score:
        text = "" if prediction is None else str(prediction)
        found = {"strict": gsm8k.strict_extract(text), "flexible": gsm8k.flexible_extract(text)}
        verdicts = {name: gsm8k.same_answer(value, task.answer) for name, value in found.items()}
        why = "; ".join(f"{name}: {'no number found' if found[name] is None else repr(found[name])} "
                        f"{'==' if verdicts[name] else '!='} {task.answer!r}" for name in found)
        return Score(verdicts[primary], f"gsm8k_{primary}", why,
                      {"reference": task.answer, "prediction": prediction, "extracted": found},
                      metrics={name: float(ok) for name, ok in verdicts.items()})
    return scorer


def _judged(protocol: judged.JudgeProtocol | None, name: str):
    def scorer(task: Task, prediction: str | None, judge: LLMJudge | None) -> Score:
        details = {"reference": task.answer, "prediction": prediction}
        if judged.is_blank(prediction):
            return Score(False, name if judge is not None else "exact_fallback",
                          "the answer is empty or only punctuation", details)
        if judge is None:
            ok, why = judged.exact_fallback(prediction, task.answer)
            return Score(ok, "exact_fallback", why + f" (no judge configured; {name} needs one)", details)
        verdict = judge.judge(task.question, task.answer, str(prediction), protocol=protocol)
        verdict.scorer = name
        return verdict
    return scorer


SCORERS: dict[str, Callable[[Task, str | None, LLMJudge | None], Score]] = {
    "gaia": _gaia(gaia.gaia_match, "gaia"),
    "gaia_lenient": _gaia(gaia.gaia_lenient_match, "gaia_lenient"),
    "hotpotqa_em": _hotpotqa,
    "gsm8k_flexible": _gsm8k("flexible"),
    "gsm8k_strict": _gsm8k("strict"),
    "frames_judge": _judged(judged.FRAMES, "frames_judge"),
    "xbench_judge": _judged(judged.XBENCH, "xbench_judge"),
    "judge": _judged(None, "llm_judge"),
    "paper": paper.paper_score,
}


def score_answer(task: Task, prediction: str | None, judge: LLMJudge | None = None) -> Score:
    """Score an answer with the scorer the task names (see the module docs)."""
    name = task.metadata.get("scorer") or "gaia"
    if task.answer is None:
        return Score(False, name, "the task has no reference answer")
    scorer = SCORERS.get(name)
    if scorer is None:
        raise ValueError(f"task {task.id}: unknown scorer {name!r} (known: {', '.join(SCORERS)})")
    return scorer(task, prediction, judge)
