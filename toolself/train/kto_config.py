"""Configuration of CAT stage II: trajectory-level KTO (TRL's `KTOConfig` + LoRA).

Every `TrainingArguments` / `KTOConfig` field is available; the defaults below and in
`stage_options.KTOOptions` (the ones the command line offers) are those that differ, each with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import KTOConfig as _TRLKTOConfig

from toolself.train.kernels import KernelArguments
from toolself.train.lora import accelerator_defaults
from toolself.train.stage_options import KTOOptions


@dataclass
class CATKTOConfig(KTOOptions, _TRLKTOConfig, KernelArguments):
    balance_weights: bool = field(
        default=True,
        metadata={"help": "Set desirable_weight / undesirable_weight from the label counts so that "
                          "desirable_weight * n_desirable / (undesirable_weight * n_undesirable) lies in [1, 4/3] "
                          "(KTO paper, Eq. 8): successes are usually the minority."},
    )
    max_length: int | None = field(
        default=16384,
        metadata={"help": "Longest prompt + completion in tokens (TRL's 1024 is far too short for trajectories). "
                          "The data builder keeps the end of a longer prompt and counts the cuts."},
    )
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(
        default=0.1, metadata={"help": "Linear warm-up, as a fraction of the steps when below 1."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps."})
    save_strategy: str = field(default="no", metadata={"help": "Intermediate checkpoints by `steps` or `epoch`; "
                                                               "with `no`, checkpoint_minutes takes them by the "
                                                               "clock instead. The final model is always saved."})
    report_to: Any = field(default="none", metadata={"help": "Experiment trackers (the JSONL log is always written)."})
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bfloat16 mixed precision. Default: on where the GPU (Ampere or later) or CPU (AVX512-BF16 "
                          "/ AMX) computes in it."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    use_liger_kernel: bool | None = field(
        default=None,
        metadata={"help": "Liger's fused RMSNorm / RoPE / SwiGLU kernels (Triton). Default (None): on on a CUDA GPU "
                          "when liger-kernel is installed (pip install liger-kernel), off elsewhere."})

    length_grouped: bool | None = field(
        default=None,
        metadata={"help": "Put decisions of similar length into each micro-batch (random groups of up to 50 "
                          "micro-batches, sorted within, then the micro-batches shuffled), so that a padded batch "
                          "pads little; off, the decisions are only shuffled. Default (None): on for micro-batches "
                          "of more than one decision."})

    def __post_init__(self) -> None:
        if self.loss_type != "apo_zero_unpaired" and self.per_device_train_batch_size < 2:
            raise ValueError("KTO needs per_device_train_batch_size >= 2 for its KL estimate")
        accelerator_defaults(self)
        super().__post_init__()
