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
        default=0.0,
        metadata={"help": "Dropout on the LoRA branch. Off: on a CPU it cost ~15% of a training step, and the "
                          "small sets rejection sampling produces are regularised by few epochs instead."},
    )
    lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "Which modules get adapters: `all-linear` (every attention and MLP projection, not the "
                          "output head), as QLoRA found adapting all linear layers necessary to match full "
                          "fine-tuning; or a comma-separated list of module names."},
    )

    lora_layers: int = field(
        default=0,
        metadata={"help": "Adapt only the top N decoder layers (0: all). The layers below then need no backward "
                          "pass: with 12 of the 135M model's 30 layers a CPU training step took half the time."},
    )

    cache_frozen_layers: bool = field(
        default=True,
        metadata={"help": "With lora_layers, keep the output of the layers below the adapters per training sequence "
                          "and reuse it in later epochs (and for KTO's reference pass) instead of recomputing it: "
                          "the same numbers, less CPU; costs ~2.3 KB of memory per token (bounded at 4 GB)."},
    )

    compile_layers: bool | None = field(
        default=None,
        metadata={"help": "Compile each decoder layer with torch.compile (inductor), which fuses the element-wise "
                          "work between the matrix products; the first step pays for compiling "
                          "(docs/notes/2026-12-03-compiled-decoder-layers.md). Default (None): on when training on "
                          "a CPU with a C++ compiler, off on GPUs and without a compiler."},
    )

    def peft_config(self, model: Any = None):
        """The peft `LoraConfig`, or None for full fine-tuning. `model` is needed only to place
        `lora_layers`."""
        if self.full_finetune:
            return None
        from peft import LoraConfig

        targets: Any = self.lora_target_modules
        if targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        layers = None
        if self.lora_layers:
            if model is None:
                raise ValueError("lora_layers needs the model to find its layers")
            total = model.config.num_hidden_layers
            layers = list(range(max(0, total - self.lora_layers), total))
            if targets == "all-linear":  # peft places layers only for named modules
                targets = linear_module_names(model)
        return LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=targets, layers_to_transform=layers, bias="none", task_type="CAUSAL_LM")


def linear_module_names(model: Any) -> list[str]:
    """The names of the decoder's linear projections (what peft's `all-linear` means: every
    linear layer but the output head)."""
    import torch

    head = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and module is not head})


def refuse_fp16_without_gpu(fp16: bool | None) -> None:
    """fp16 asked for on a machine without a CUDA GPU raises ValueError: accelerate ignores it on
    a CPU, so the run would train in float32 while its settings recorded fp16."""
    import torch

    if fp16 and not torch.cuda.is_available():
        raise ValueError("fp16 mixed precision trains on a CUDA GPU only: on a CPU accelerate leaves it off and "
                         "trains in float32 whatever fp16 says (bf16, where the CPU has bf16 kernels, is what "
                         "runs there)")


def accelerator_defaults(config: Any) -> None:
    """bf16 mixed precision where the hardware computes in it: an Ampere or later GPU (an older
    one emulates it: `weights.native_bfloat16`; fp16 is the fast choice there, on request), or a
    CPU with AVX512-BF16 / AMX (2x the fp32 throughput of the 135M model's training there); fp32
    elsewhere. Without a GPU, training is on the CPU (`use_cpu`), and fp16 is refused. Gradient
    checkpointing stays on (TRL's default) except for single-sequence micro-batches on a CPU:
    there a padded batch's attention takes the math path and keeps a (heads x length x length)
    matrix per layer, while a lone unpadded sequence takes the memory-efficient path and
    recomputing the forward pass would cost a third of the step for nothing
    (docs/notes/2026-12-03-kto-without-recomputation.md)."""
    import torch

    from toolself.models.half_linear import has_bfloat16_kernels
    from toolself.models.weights import gpu_has_bfloat16

    gpu = torch.cuda.is_available()
    refuse_fp16_without_gpu(config.fp16)
    if config.bf16 is None:
        if gpu:
            config.bf16 = gpu_has_bfloat16() and not config.fp16
        else:
            config.bf16 = has_bfloat16_kernels() and not config.fp16
    if not gpu:
        # The Trainer's spelling of "train on the CPU": it allows bf16 autocast there, and it is
        # what sets up a process group (gloo) when several processes are launched; without it
        # each process of a `torchrun` on a machine without a GPU would train alone.
        config.use_cpu = True
    if config.ddp_find_unused_parameters is None:
        # Every trainable weight is used at every step. Left unset, transformers has DDP look for
        # unused ones whenever the model is a PEFT wrapper: a walk of the autograd graph after
        # each forward pass, and a warning in every process that it found none.
        config.ddp_find_unused_parameters = False
    if checkpointing_field(config) == "activation_checkpointing" and config.activation_checkpointing is None:
        # TRL's configs default the old name to True, so every run would warn of a name its user
        # never wrote; the value moves to the new name, which transformers then mirrors.
        config.activation_checkpointing, config.gradient_checkpointing = config.gradient_checkpointing, None
    if not gpu and config.per_device_train_batch_size == 1:
        setattr(config, checkpointing_field(config), False)


def checkpointing_field(config: Any) -> str:
    """What the installed transformers calls gradient checkpointing, on a training config or its
    class: transformers 5.24 renamed it `activation_checkpointing`, and the old name, which warns
    there, goes in version 6."""
    return "activation_checkpointing" if hasattr(config, "activation_checkpointing") else "gradient_checkpointing"


def load_base(path: str | Path):
    """(model, tokenizer) to train from a full transformers directory (an adapter is first
    merged with `merge.prepare_base`, so that the new adapter names the merged model as its base
    and the trainer's reference, the adapter-disabled model, is that merged model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).resolve()
    if (path / "adapter_config.json").is_file():
        raise ValueError(f"{path} is an adapter: merge it first (toolself.train.merge.prepare_base)")
    from toolself.models.weights import ignore_library_deprecations
    from toolself.train.merge import default_dtype

    ignore_library_deprecations()  # the trainers wrap the model with peft and toggle its checkpointing
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=default_dtype())
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
