"""GAIA's leaderboard scorer, rule for rule, and the lenient variant toolself used before.

`gaia_match` is the official `question_scorer` (gaia-benchmark/leaderboard, scorer.py): a
numeric reference is compared as a float after removing `$`, `%` and `,` from the answer (an
answer that still is not a float scores as infinity, so it never matches); a reference
containing `,` or `;` is a list compared item by item, numeric items as numbers and the rest
after removing whitespace and lower-casing; any other reference is compared after removing
whitespace and punctuation and lower-casing. Nothing else: a unit, a trailing period or a range
after a number fails, as it fails on the leaderboard.

`gaia_lenient_match` additionally reads a number that carries a unit (`17 km`) as its leading
number. Its accuracies are not comparable with published GAIA numbers, so it is never the
default: a task or a load spec has to name `gaia_lenient` to get it.
"""

from __future__ import annotations

import re
import string
from typing import Callable

_NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*[^\d\s].*$")


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def normalize_number(text: str) -> float:
    """The official reading of an answer as a number; infinity when it is not one."""
    for char in ("$", "%", ","):
        text = text.replace(char, "")
    try:
        return float(text)
    except ValueError:
        return float("inf")


def normalize_number_lenient(text: str) -> float:
    """As `normalize_number`, but `17 km` reads as 17."""
    value = normalize_number(text)
    if value != float("inf"):
        return value
    match = _NUMBER_WITH_UNIT.match(text.replace("$", "").replace("%", "").replace(",", ""))
    return float(match.group(1)) if match else float("inf")


def normalize_str(text: str, remove_punct: bool = True) -> str:
    no_spaces = re.sub(r"\s", "", text).lower()
    if remove_punct:
        return no_spaces.translate(str.maketrans("", "", string.punctuation))
    return no_spaces


def _split_list(text: str) -> list[str]:
    return re.split(r"[,;]", text)


def _match(prediction: str | None, reference: str, number: Callable[[str], float]) -> tuple[bool, str]:
    prediction = "None" if prediction is None else str(prediction)
    reference = str(reference)
    if _is_float(reference):
        value = number(prediction)
        ok = value == float(reference)
        if value == float("inf") and not ok:
            return False, f"reference is the number {reference}; answer {prediction!r} is not a number"
        return ok, f"numbers compared: {value:g} {'==' if ok else '!='} {float(reference):g}"
    if any(char in reference for char in ",;"):
        ref_items, pred_items = _split_list(reference), _split_list(prediction)
        if len(ref_items) != len(pred_items):
            return False, f"list lengths differ: reference has {len(ref_items)}, answer {len(pred_items)}"
        mismatches = []
        for index, (pred, ref) in enumerate(zip(pred_items, ref_items)):
            if _is_float(ref):
                same = number(pred) == float(ref)
            else:
                same = normalize_str(pred, remove_punct=False) == normalize_str(ref, remove_punct=False)
            if not same:
                mismatches.append(f"item {index + 1}: {pred.strip()!r} vs {ref.strip()!r}")
        if mismatches:
            return False, "list items differ: " + "; ".join(mismatches)
        return True, f"all {len(ref_items)} list items match"
    ok = normalize_str(prediction) == normalize_str(reference)
    return ok, "normalised strings " + (
        "match" if ok else f"differ: {normalize_str(prediction)!r} vs {normalize_str(reference)!r}")


def gaia_match(prediction: str | None, reference: str) -> tuple[bool, str]:
    """(match, why) under the GAIA leaderboard's rules."""
    return _match(prediction, reference, normalize_number)


def gaia_lenient_match(prediction: str | None, reference: str) -> tuple[bool, str]:
    """(match, why) under GAIA's rules plus units after numbers (opt-in, not comparable)."""
    return _match(prediction, reference, normalize_number_lenient)
