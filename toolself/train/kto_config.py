"""Configuration of CAT stage II: trajectory-level KTO (TRL's `KTOConfig` + LoRA).

Every `TrainingArguments` / `KTOConfig` field is available; the defaults below are the ones
that differ, each with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import KTOConfig as _TRLKTOConfig

from toolself.train.kernels import KernelArguments
from toolself.train.lora import LoraArguments, accelerator_defaults


@dataclass
class CATKTOConfig(_TRLKTOConfig, LoraArguments, KernelArguments):
    learning_rate: float = field(
        default=5e-5,
        metadata={"help": "AdamW learning rate. TRL's 1e-6 default is for full fine-tuning; a fresh LoRA adapter "
                          "needs a larger rate to move at all, and 5e-5 keeps KTO's KL term small. Use ~5e-7 to "
                          "5e-6 with --full-finetune."},
    )
    beta: float = field(
        default=0.1,
        metadata={"help": "KTO's beta: how far the policy may move from the reference (the RFT model). 0.1 is the "
                          "KTO paper's default."},
    )
    balance_weights: bool = field(
        default=True,
        metadata={"help": "Set desirable_weight / undesirable_weight from the label counts so that "
                          "desirable_weight * n_desirable / (undesirable_weight * n_undesirable) lies in [1, 4/3] "
                          "(KTO paper, Eq. 8): successes are usually the minority."},
    )
    per_device_train_batch_size: int = field(
        default=4,
        metadata={"help": "Decisions per device and micro-step. At least 2: KTO estimates its KL reference point "
                          "from mismatched pairs within a micro-batch."},
    )
    gradient_accumulation_steps: int = field(
        default=2, metadata={"help": "Micro-steps per optimizer step: an effective batch of 8 decisions per device."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the decisions."})
    max_length: int | None = field(
        default=16384,
        metadata={"help": "Longest prompt + completion in tokens (TRL's 1024 is far too short for trajectories). "
                          "The data builder keeps the end of a longer prompt and counts the cuts."},
    )
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(
        default=0.1, metadata={"help": "Linear warm-up, as a fraction of the steps when below 1."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps."})
    save_strategy: str = field(default="no", metadata={"help": "Intermediate checkpoints; the final adapter is "
                                                               "always saved."})
    report_to: Any = field(default="none", metadata={"help": "Experiment trackers (the JSONL log is always written)."})
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bfloat16 mixed precision. Default: on where the GPU or CPU computes in it (AVX512-BF16 / "
                          "AMX)."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    use_liger_kernel: bool | None = field(
        default=None,
        metadata={"help": "Liger's fused RMSNorm / RoPE / SwiGLU kernels (Triton). Default (None): on on a CUDA GPU "
                          "when liger-kernel is installed (pip install liger-kernel), off elsewhere."})
    compile_layers: bool | None = field(
        default=False,
        metadata={"help": "Compile each decoder layer with torch.compile. Off for KTO: its reference pass (no "
                          "gradients, adapter off) compiles to other kernels than the policy's pass, whose bf16 "
                          "roundings then differ, so a fresh adapter starts with a log-ratio that is not zero; and "
                          "a KTO run of a few minutes spends what compiling saves on compiling its variants."})

    def __post_init__(self) -> None:
        if self.loss_type != "apo_zero_unpaired" and self.per_device_train_batch_size < 2:
            raise ValueError("KTO needs per_device_train_batch_size >= 2 for its KL estimate")
        accelerator_defaults(self)
        super().__post_init__()
