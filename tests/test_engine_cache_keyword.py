"""The engine hands its KV cache to the model under the name the installed transformers takes:
`cache` from 5.2x, `past_key_values` before (the GPU image's 5.17, and the range pyproject
allows). A keyword the model does not know is swallowed by its `**kwargs`, and the model builds
a cache of its own that the engine never sees."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from toolself.models.base import Message  # noqa: E402
from toolself.models.engine import cache_keyword  # noqa: E402
from toolself.models.local import EmbeddedModel  # noqa: E402


@pytest.fixture(scope="module")
def engine(tiny):
    return EmbeddedModel.load(str(tiny), dtype="float32")


def with_old_signature(model):
    """The model as transformers before 5.2x calls it: the cache arrives as `past_key_values`."""
    forward, name = model.forward, cache_keyword(model)

    def old_forward(input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                    logits_to_keep=0, **kwargs):
        assert "cache" not in kwargs, "an unknown keyword: this transformers would drop the engine's cache"
        return forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=use_cache, logits_to_keep=logits_to_keep, **{name: past_key_values}, **kwargs)

    model.forward = old_forward
    return forward


def greedy(loaded: EmbeddedModel, messages: list[list[Message]]) -> list[list[int]]:
    from concurrent.futures import ThreadPoolExecutor

    engine = EmbeddedModel(loaded.model, loaded.tokenizer, cache_entries=0, threads=0, max_tokens=12)
    try:
        with ThreadPoolExecutor(len(messages)) as pool:
            replies = list(pool.map(lambda m: engine.complete(m, session=None), messages))
    finally:
        engine.close()
    return [r.completion_token_ids for r in replies]


def test_the_cache_keyword_is_the_one_the_forward_takes(engine):
    takes = inspect.signature(engine.model.forward).parameters
    assert cache_keyword(engine.model) == ("cache" if "cache" in takes else "past_key_values")

    def old(input_ids=None, past_key_values=None, **kwargs):
        return None

    assert cache_keyword(type("Old", (), {"forward": staticmethod(old)})()) == "past_key_values"


def test_a_model_that_takes_past_key_values_decodes_what_the_current_signature_decodes(engine):
    messages = [[Message(role="user", content=f"Question {i}: what happened in {1900 + i}?")] for i in range(3)]
    current = greedy(engine, messages)
    original = with_old_signature(engine.model)
    try:
        old = greedy(engine, messages)
    finally:
        engine.model.forward = original
    assert old == current and all(len(ids) == 12 for ids in current)
