"""How large a local model is, read from its config.json before any weight loads.

The engine and its default budgets were shaped around the 135M embedded model: a short context,
replies of a few hundred tokens, and free strings capped so that a model that never closes one
still stops. A model of a billion parameters or more (a Qwen3-8B student on a GPU) needs none of
that, and under those caps it could not write what it was trained on: a teacher's reply longer
than 384 tokens, a configuration longer than 600 characters, an answer with a quote in it (a
capped string admits no JSON escape). So a large local model gets a served model's budgets,
longer replies and an uncapped grammar; the size is estimated from the config alone, so that it
is known before loading, and is the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LARGE_PARAMETERS = 1_000_000_000


def estimated_parameters(config: dict[str, Any]) -> int | None:
    """The parameters of a decoder-only transformer with this config (embeddings, attention
    and MLP projections; experts counted in full), or None when the config lacks the sizes."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden, layers, vocab = (text.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size"))
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, vocab)):
        return None
    heads = text.get("num_attention_heads") or 1
    head_dim = text.get("head_dim") or hidden // heads
    kv_heads = text.get("num_key_value_heads") or heads
    experts = text.get("num_experts") or text.get("num_local_experts") or 0
    if experts:
        mlp = 3 * hidden * (text.get("moe_intermediate_size") or text.get("intermediate_size") or 4 * hidden) * experts
    else:
        mlp = 3 * hidden * (text.get("intermediate_size") or 4 * hidden)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)) else 2)
    return embeddings + layers * (attention + mlp)


def is_large(config: dict[str, Any] | None) -> bool:
    """Whether a model with this config has a billion parameters or more (unknown: no)."""
    parameters = estimated_parameters(config) if config else None
    return parameters is not None and parameters >= LARGE_PARAMETERS


@dataclass(frozen=True)
class ModelDefaults:
    """The agent budgets a model works under unless the user sets them. A small model (the 135M
    embedded one, a local model under a billion parameters) needs short contexts and bounded
    text; the bound on a configuration's free text (600 characters) stops a small model that
    never closes a string, yet leaves room for the strategies it is trained to write (the expert
    teacher's run to ~510 characters; at 300 a trained student was cut off mid-strategy). A
    served model, or a large local one (`is_large`), gets a large context and no caps."""

    context_budget: int
    config_max_text: int | None
    max_tokens_per_call: int | None

    def settings(self) -> dict[str, Any]:
        """As `AgentSettings` overrides."""
        return {"context_budget": self.context_budget, "config_max_text": self.config_max_text,
                "max_tokens_per_call": self.max_tokens_per_call}


SMALL_MODEL = ModelDefaults(context_budget=3000, config_max_text=600, max_tokens_per_call=384)
LARGE_MODEL = ModelDefaults(context_budget=16_000, config_max_text=None, max_tokens_per_call=None)
