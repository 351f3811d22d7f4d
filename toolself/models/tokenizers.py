"""A served model's own tokenizer, when this machine already has it.

Context budgets count tokens; a server does not expose its tokenizer, so by default a served
model is counted at four characters a token. When the tokenizer of the served weights is on
this machine (a local directory, or the Hugging Face cache), it is used instead. Nothing is
downloaded: a run never reaches the network for it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=16)
def own_tokenizer(name: str) -> Callable[[str], Any] | None:
    """The `encode` of the tokenizer `name` names (a path or a hub name already cached), or
    None when it is not on this machine or transformers is not installed."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # not cached, not a directory, not a tokenizer: count by characters
        log.info("no local tokenizer for %s (%s); counting four characters a token", name, exc)
        return None
    return functools.partial(tokenizer.encode, add_special_tokens=False)
