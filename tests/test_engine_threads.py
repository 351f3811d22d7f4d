"""A request alone in the embedded engine (one agent's run) computes on the idle engine
thread's cores as well; requests that share the engine keep one engine thread's share each.
Lending the cores must not change a greedy reply."""

from __future__ import annotations

import threading

import pytest
import torch

from toolself.models import local
from toolself.models.base import Message

PROMPT = [Message("system", "Answer briefly."), Message("user", "Name three colours of lamps.")]


def threads_seen(model: local.EmbeddedModel, prompts: int) -> list[tuple[int, int]]:
    """(rows, torch threads) of each forward pass of the engine, with `prompts` requests sent at once."""
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append((kwargs["input_ids"].shape[0], torch.get_num_threads())),
        with_kwargs=True)
    gate = threading.Barrier(prompts)

    def ask(i: int) -> None:
        gate.wait()
        model.complete([PROMPT[0], Message("user", f"{PROMPT[1].content} ({i})")], max_tokens=32)

    workers = [threading.Thread(target=ask, args=(i,)) for i in range(prompts)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        hook.remove()
    return seen


@pytest.fixture
def engine(tiny):
    model = local.EmbeddedModel.load(str(tiny), dtype="float32")
    model.engine.threads, model.engine.lone_threads = 1, 2  # as on a 2-core machine, on any machine
    yield model
    model.close()


def test_a_request_alone_in_the_engine_computes_on_both_engine_threads_cores(engine):
    assert {threads for _, threads in threads_seen(engine, 1)} == {2}


def test_requests_sharing_the_engine_keep_one_engine_threads_share(engine):
    shared = {threads for rows, threads in threads_seen(engine, 4) if rows > 1}
    assert shared == {1}  # every step over several rows; a prefill reads one request


def test_lent_cores_are_the_default_on_a_cpu_and_never_more_than_the_machine_has(tiny):
    model = local.EmbeddedModel.load(str(tiny), dtype="float32")
    try:
        assert model.engine.threads == local.default_threads()
        assert model.engine.lone_threads == local.lone_threads(local.default_threads())
    finally:
        model.close()
    assert local.lone_threads(1) == min(2, local.usable_cores())
    assert local.lone_threads(8) <= local.usable_cores()


def test_an_explicit_thread_count_is_kept_for_a_request_alone(tiny):
    model = local.EmbeddedModel.load(str(tiny), dtype="float32", threads=1)
    try:
        assert (model.engine.threads, model.engine.lone_threads) == (1, 0)
        assert {threads for _, threads in threads_seen(model, 1)} == {1}
    finally:
        model.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_embedded_models_greedy_reply_is_the_same_on_lent_cores():
    loaded = local.EmbeddedModel.load()  # the default dtype, as `toolself run` loads it
    try:
        replies = []
        for threads, lone in ((1, 0), (1, 2)):
            model = local.EmbeddedModel(loaded.model, loaded.tokenizer, cache_entries=0, max_tokens=48,
                                        cache_dtype=loaded.engine.kv_dtype)
            model.engine.threads, model.engine.lone_threads = threads, lone
            try:
                replies.append(model.complete(PROMPT, max_tokens=48).completion_token_ids)
            finally:
                model.close()
        assert replies[0] == replies[1] and len(replies[0]) > 8
    finally:
        loaded.close()
