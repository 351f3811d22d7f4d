"""What RFT and KTO share: the LoRA arguments, device-dependent defaults, and model loading.

LoRA is the default because it is what the paper used (LoRA on Qwen3-8B / 14B), because the
adapter is a few MB that both the embedded backend and vLLM (`--enable-lora`) load on top of an
unchanged base, and because on a CPU it is the only way the 135M model trains in minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LoraArguments:
    """LoRA knobs, mixed into the RFT and KTO configurations."""

    full_finetune: bool = field(
        default=False,
        metadata={"help": "Train every weight instead of a LoRA adapter (then use a learning rate ~10x lower, "
                          "e.g. 1e-5 for RFT, and expect a full model directory as output)."},
    )
    lora_r: int = field(
        default=16,
        metadata={"help": "LoRA rank. 16 is enough capacity for a behaviour (how to act and reconfigure) rather "
                          "than new knowledge, and keeps the adapter small (~7 MB on the 135M model, ~170 MB on "
                          "Qwen3-8B with all linear layers)."},
    )
    lora_alpha: int = field(
        default=32,
        metadata={"help": "LoRA scaling numerator; alpha = 2r is the common choice that keeps the effective update "
                          "scale (alpha / r = 2) independent of the rank."},
    )
    lora_dropout: float = field(
        default=0.05,
        metadata={"help": "Dropout on the LoRA branch: light regularisation for the small RFT sets rejection "
                          "sampling produces."},
    )
    lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "Which modules get adapters: `all-linear` (every attention and MLP projection, not the "
                          "output head), as QLoRA found adapting all linear layers necessary to match full "
                          "fine-tuning; or a comma-separated list of module names."},
    )

    def peft_config(self):
        """The peft `LoraConfig`, or None for full fine-tuning."""
        if self.full_finetune:
            return None
        from peft import LoraConfig

        targets: Any = self.lora_target_modules
        if targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        return LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=targets, bias="none", task_type="CAUSAL_LM")


def accelerator_defaults(config: Any) -> None:
    """bf16 mixed precision where the GPU supports it, fp32 elsewhere (TRL would default to
    bf16 everywhere, which on a CPU buys nothing measurable for a 135M model). Gradient
    checkpointing stays on (TRL's default) on every device: on a CPU, attention over a padded
    batch takes the math path and keeps a (heads x length x length) matrix per layer, ~19 GB for
    two 2k-token sequences without checkpointing."""
    import torch

    if config.bf16 is None:
        config.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()) and not config.fp16


def load_base(path: str | Path):
    """(model, tokenizer) to train from a full transformers directory (an adapter is first
    merged with `merge.prepare_base`, so that the new adapter names the merged model as its base
    and the trainer's reference, the adapter-disabled model, is that merged model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).resolve()
    if (path / "adapter_config.json").is_file():
        raise ValueError(f"{path} is an adapter: merge it first (toolself.train.merge.prepare_base)")
    from toolself.train.merge import default_dtype

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=default_dtype())
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def resolve_model_path(spec: str) -> Path:
    """A student / policy given as `embedded`, `local:DIR` or a plain directory."""
    if spec in ("embedded", "default"):
        from toolself.models.local import default_model_dir

        return default_model_dir()
    if spec.startswith("local:"):
        spec = spec.split(":", 1)[1]
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{path} is neither a transformers model directory nor a LoRA adapter directory")
    return path.resolve()
