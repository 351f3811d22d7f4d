"""HotpotQA's answer metrics, as its official evaluation script (hotpot_evaluate_v1.py) computes
them: both sides lower-cased, punctuation removed, the articles a/an/the removed and whitespace
collapsed; EM is equality of the results, F1 the token-overlap F1, except that `yes`, `no` and
`noanswer` score F1 0 against anything but themselves.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCTUATION = set(string.punctuation)
_CLOSED = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(reference)


def f1(prediction: str, reference: str) -> float:
    pred, gold = normalize_answer(prediction), normalize_answer(reference)
    if (pred in _CLOSED or gold in _CLOSED) and pred != gold:
        return 0.0
    common = Counter(pred.split()) & Counter(gold.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred.split())
    recall = same / len(gold.split())
    return 2 * precision * recall / (precision + recall)
