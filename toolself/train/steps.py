"""The steps of CAT, written once: collect attempts, render them into a dataset, train on it
and draw the curves. `train rft`, `train kto`, `train cat` (the pipeline) and `train study`
(pipelines side by side) are these steps in different orders, with different bookkeeping
around them; the steps know nothing of folders' state files or of the command line.

Heavy imports (transformers, trl, torch) stay inside the functions that need them: importing
this module must not slow down the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from toolself.models.protocol import DEFAULT, TextProtocol, text_protocol_named
from toolself.models.spec import ModelSpec
from toolself.train import data as D
from toolself.train.collect import CollectResult, collect, load_any
from toolself.train.merge import adapter_base
from toolself.train.settings import AgentOverrides
from toolself.variants import RunPreset, load_run_preset


@dataclass(frozen=True)
class Collection:
    """How attempts are collected for training (the teacher's for RFT, the policy's for KTO)."""

    tasks: Sequence[str]
    samples: int
    method: str = "toolself"
    limit: int | None = None
    temperature: float = 0.7
    seed: int = 0
    concurrency: int = 4
    timeout: float | None = 600.0
    dtype: str = "auto"
    agent: AgentOverrides = AgentOverrides()  # the student's budgets, the preset's settings, the user's
    preset: str | None = None  # a run preset's name: its load options for the collecting model


def run_preset(name: str | None) -> RunPreset | None:
    return load_run_preset(name) if name else None


def agent_budgets(student: ModelSpec, overrides: AgentOverrides | dict[str, Any] | None = None,
                  preset: RunPreset | None = None) -> AgentOverrides:
    """Agent settings for every collection and evaluation of a training run: the student's
    budgets (a teacher's trajectories are shaped by the same context budget the student will
    work under), then the preset's settings, then the user's."""
    defaults = student.defaults
    layered = AgentOverrides.from_dict(defaults.settings() if defaults else {})
    return layered.merged(preset.settings() if preset else None).merged(overrides)


def preset_options(preset: RunPreset | None, model: ModelSpec) -> dict[str, Any]:
    """The preset's load options for `model` (sampling, text protocol, a served model's own
    tokenizer); none for the expert, which samples nothing."""
    return preset.model_options(model.text) if preset is not None and model.kind != "expert" else {}


def rendering(preset: RunPreset | None) -> TextProtocol:
    """The text protocol training data is rendered in: the one the preset's policy is prompted
    with (`preset_options`), toolself's without a preset."""
    return text_protocol_named(preset.protocol.text_protocol) if preset is not None else DEFAULT


def served_student_request(preset: RunPreset | None) -> dict[str, Any]:
    """The fields every request to a student that vLLM serves carries, so that it decodes as
    its training data renders a reply: without reasoning (Qwen3's `enable_thinking: false`, as
    toolself's engine decodes), unless the preset's protocol keeps `<think>` and so trains the
    teacher's reasoning too. A chat template without the switch ignores it."""
    return {} if rendering(preset).keep_think else {"chat_template_kwargs": {"enable_thinking": False}}


@dataclass
class AttemptTools:
    """What a training run's attempts work and are scored with: the pool and judge of its tool
    options (the defaults when it has none), reshaped by its preset (the preset's tool
    behaviour, its judge's temperature, its scorer for every task scored by its answer)."""

    pool: Any = None  # None: the runner's default pool
    judge: Any = None
    loader: Callable[..., list[Any]] | None = None  # None: the runner's own

    @classmethod
    def of(cls, tools: Any, preset: RunPreset | None) -> "AttemptTools":
        """tools: the run's `ToolOptions`, or None for the defaults."""
        if preset is None:
            return cls(tools.pool(), tools.judge) if tools is not None else cls()
        from toolself.evals.loaders import load_tasks
        from toolself.tools.options import ToolOptions

        tools = tools if tools is not None else ToolOptions.parse()
        pool = tools.pool(preset)
        try:
            return cls(pool, preset.judge(tools.judge), preset.retarget(load_tasks))
        except BaseException:
            pool.close()
            raise

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def collect_attempts(model: ModelSpec, out: Path, collection: Collection, *, backend: Any = "local",
                     tools: Any = None, request: dict[str, Any] | None = None) -> CollectResult:
    """`collection.samples` scored attempts per task by `model` into the runner folder `out`
    (resumable); `tools`: the run's `ToolOptions` (pool and judge), None for the defaults;
    `request`: fields every request to a served model carries (`served_student_request`)."""
    preset = run_preset(collection.preset)
    attempt = AttemptTools.of(tools, preset)
    try:
        return collect(list(collection.tasks), model, out, collection.samples, method=collection.method,
                       split="train", limit=collection.limit, temperature=collection.temperature,
                       seed=collection.seed, concurrency=collection.concurrency, timeout=collection.timeout,
                       settings=collection.agent.to_dict(), backend=backend, dtype=collection.dtype,
                       pool=attempt.pool, judge=attempt.judge, loader=attempt.loader,
                       model_options=model.with_request_fields(preset_options(preset, model), request))
    finally:
        attempt.close()


def load_sources(sources: Sequence[str | Path], method: str = "toolself") -> tuple[list[Any], dict[str, Any] | None]:
    """The labelled trajectories of runner folders and JSONL files, with the first tool schemas
    saved beside them (a trajectory records tool names only)."""
    found: list[Any] = []
    schemas = None
    for source in sources:
        trajectories, saved = load_any(source, method)
        found.extend(trajectories)
        schemas = schemas or saved
    return found, schemas


def tokenizer(weights: Path) -> Any:
    """The tokenizer whose chat template renders the data: the model's, or for an adapter saved
    without one, its base model's."""
    from transformers import AutoTokenizer

    if (weights / "adapter_config.json").is_file() and not (weights / "tokenizer_config.json").is_file():
        weights = adapter_base(weights)
    return AutoTokenizer.from_pretrained(str(weights))


@dataclass
class Built:
    """A dataset rendered from trajectories, with what building it counted."""

    dataset: Any
    build: Any  # data.BuildStats
    info: dict[str, Any]  # data.sft_stats / data.kto_stats
    weights: Any = None  # data.KTOWeights, for KTO data


def sft_data(trajectories: list[Any], schemas: dict[str, Any] | None, weights: Path, max_length: int,
             protocol: TextProtocol = DEFAULT) -> Built:
    """RFT's examples: the successful trajectories, rendered with the student's template in
    `protocol` (see `rendering`)."""
    dataset, build = D.build_sft_dataset(trajectories, D.Renderer(tokenizer(weights), schemas, protocol), max_length)
    return Built(dataset, build, D.sft_stats(dataset, build))


def kto_data(trajectories: list[Any], schemas: dict[str, Any] | None, weights: Path, max_length: int,
             protocol: TextProtocol = DEFAULT) -> Built:
    """KTO's examples: every decision of a scored attempt, labelled by the attempt's outcome."""
    dataset, build, kto_weights = D.build_kto_dataset(trajectories, D.Renderer(tokenizer(weights), schemas, protocol),
                                                      max_length)
    return Built(dataset, build, D.kto_stats(dataset, build, kto_weights), kto_weights)


def train_rft_step(dataset: Any, base: Path, out: Path, config: Any, resume: bool = True,
                   replace_other: bool = False, before_training: Callable[[], None] | None = None
                   ) -> tuple[Any, Path | None]:
    """Fine-tune `base` on RFT data into `out`; returns the result and the curves' PNG."""
    from toolself.train.plots import plot_log
    from toolself.train.rft import train_rft

    result = train_rft(dataset, base, out, config, resume=resume, replace_other=replace_other,
                       before_training=before_training)
    return result, plot_log(result.log, out / "curves.png", "RFT")


def train_kto_step(dataset: Any, policy: Path, out: Path, config: Any, resume: bool = True,
                   replace_other: bool = False, before_training: Callable[[], None] | None = None
                   ) -> tuple[Any, Path | None]:
    """KTO on top of `policy` into `out`; returns the result and the curves' PNG."""
    from toolself.train.kto import train_kto
    from toolself.train.plots import plot_log

    result = train_kto(dataset, policy, out, config, resume=resume, replace_other=replace_other,
                       before_training=before_training)
    return result, plot_log(result.log, out / "curves.png", "KTO")
