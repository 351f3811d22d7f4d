"""Model backends behind one protocol, chosen by a spec (`toolself.models.spec` lists the forms:
embedded, embedded:cat, local:PATH, openai:NAME@URL[,URL...]).

Backends are imported only when chosen, so that the core imports fast and the heavy ones
(torch, transformers) stay optional.
"""

from __future__ import annotations

from typing import Any

from toolself.models.base import ChatModel, Completion, Message, ModelError, ToolCall, Usage
from toolself.models.spec import ModelSpec, runs_in_process, shipped_adapter

__all__ = ["ChatModel", "Completion", "Message", "ModelError", "ModelSpec", "ToolCall", "Usage", "load_model",
           "runs_in_process", "shipped_adapter"]


def load_model(spec: "str | ModelSpec", **options: Any) -> ChatModel:
    """Build a model from its spec; options go to the backend (temperature, seed, ...)."""
    return ModelSpec.parse(spec).load(**options)
