"""Configuration of CAT stage I: rejection-sampling fine-tuning (TRL's `SFTConfig` + LoRA).

Every `TrainingArguments` / `SFTConfig` field is available; the defaults below and in
`stage_options.RFTOptions` (the ones the command line offers) are those that differ, each with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import SFTConfig

from toolself.train.kernels import KernelArguments
from toolself.train.lora import accelerator_defaults
from toolself.train.stage_options import RFTOptions


@dataclass
class RFTConfig(RFTOptions, SFTConfig, KernelArguments):
    max_length: int | None = field(
        default=16384,
        metadata={"help": "Longest training sequence in tokens. The data builder cuts a longer decision from the "
                          "left (its prompt's start) and counts it; 16384 covers the 16k visible-context budget "
                          "used with served models, and embedded-model trajectories are far shorter."},
    )
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(
        default=0.05, metadata={"help": "Linear warm-up, as a fraction of the steps when below 1."})
    logging_steps: float = field(
        default=1, metadata={"help": "Log every N optimizer steps (the training log and curves are per step)."})
    save_strategy: str = field(
        default="no",
        metadata={"help": "Intermediate checkpoints by `steps` or `epoch`; with `no`, checkpoint_minutes takes "
                          "them by the clock instead. The final model is always saved."},
    )
    report_to: Any = field(default="none", metadata={"help": "Experiment trackers (the JSONL log is always written)."})
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bfloat16 mixed precision. Default: on where the GPU (Ampere or later) or CPU (AVX512-BF16 "
                          "/ AMX) computes in it."},
    )
    dataset_kwargs: dict[str, Any] | str | None = field(
        default_factory=lambda: {"skip_prepare_dataset": True},
        metadata={"help": "The dataset is pre-tokenized with its labels (the data builder's), so TRL's own "
                          "preparation is skipped: no re-tokenization, no second truncation."},
    )
    seed: int = field(default=0, metadata={"help": "Random seed."})
    use_liger_kernel: bool | None = field(
        default=None,
        metadata={"help": "Liger's fused RMSNorm / RoPE / SwiGLU kernels (Triton). Default (None): on on a CUDA GPU "
                          "when liger-kernel is installed (pip install liger-kernel), off elsewhere."})
    padding_free: bool | None = field(
        default=None,
        metadata={"help": "Flatten each micro-batch into one row with position ids instead of padding it. Default "
                          "(None): on with flash attention, whose varlen kernel computes each sequence alone, and with "
                          "flex attention, which skips the blocks between sequences; off with SDPA, which would "
                          "attend over the whole row's block-diagonal mask."})
    length_grouped: bool | None = field(
        default=None,
        metadata={"help": "Put sequences of similar length into each micro-batch (as transformers groups them: "
                          "random groups of 50 micro-batches, sorted within; then the micro-batches shuffled, in a "
                          "new order each epoch), so that a padded batch pads little. "
                          "Default (None): on for padded micro-batches of more than one sequence, unless "
                          "train_sampling_strategy asks for another order."})

    def __post_init__(self) -> None:
        accelerator_defaults(self)
        super().__post_init__()
