"""GSM8K's two customary answer extractions, as lm-evaluation-harness defines them.

strict: the number after `####` (the dataset's own format, the `gsm8k` task's strict-match),
after `The answer is` (the chain-of-thought task's strict-match) or after `FINAL ANSWER:` (the
answer template agents are prompted with); an answer that is nothing but a number counts too,
because an agent's final answer is that format already.
flexible: the last number anywhere in the reply (the `flexible-extract` filter).
Either extraction is then compared with the reference as the harness's exact_match does: `,`,
`$` and a final `.` removed, case ignored, the strings compared (so `18.00` is not `18`).
"""

from __future__ import annotations

import re

_STRICT = (re.compile(r"#### (\-?[0-9\.\,]+)"), re.compile(r"The answer is (\-?[0-9\.\,]+)"),
           re.compile(r"FINAL ANSWER: *\$?(\-?[0-9\.\,]+)"))
_BARE = re.compile(r"^\s*\$?\s*(\-?[0-9\.\,]+)\s*$")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def _clean(text: str) -> str:
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.strip().lower()


def strict_extract(reply: str) -> str | None:
    for pattern in _STRICT:
        found = pattern.findall(reply)
        if found:
            return found[0].strip()
    bare = _BARE.match(reply)
    return bare.group(1) if bare else None


def flexible_extract(reply: str) -> str | None:
    found = _FLEXIBLE.findall(reply)
    if not found:
        return None
    return next(group for group in found[-1] if group).strip()


def same_answer(extracted: str | None, reference: str) -> bool:
    return extracted is not None and _clean(extracted) == _clean(reference)
