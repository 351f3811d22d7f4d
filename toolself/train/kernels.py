"""What a training run computes with on its device: the attention kernel, padding-free batches,
Liger's fused layers and the micro-batch size, each chosen once, with the reason recorded.

Padded batches of trajectory sequences of very different lengths spend much of a step on padding; the
varlen flash-attention kernel computes each sequence of a flattened (padding-free) batch
alone, and PyTorch's flex attention skips the blocks of a flattened row's block-diagonal mask
that no sequence needs (it ships with torch, so it runs where flash-attn cannot be installed;
it compiles a kernel per shape, and has no backward pass on a CPU). SDPA would attend over the
whole row's mask (quadratic in the row's length, not in each sequence's), so padding-free is
off with it unless asked for.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any

from toolself.train.collective import least_over_processes, process_count
from toolself.train.lora import checkpointing_field

logger = logging.getLogger(__name__)

FLASH = "flash_attention_2"
FLEX = "flex_attention"
SDPA = "sdpa"


@dataclass
class KernelArguments:
    """Kernel knobs, mixed into the RFT and KTO configurations."""

    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Attention kernel: flash_attention_2, flex_attention (CUDA for training), sdpa or eager. "
                          "Default (None): flash_attention_2 on a CUDA GPU of the Ampere generation or later in "
                          "bf16/fp16 when flash-attn is installed, sdpa otherwise."},
    )
    auto_batch_size: bool = field(
        default=True,
        metadata={"help": "On a CUDA GPU, set the micro-batch from free memory (the longest sequence times the "
                          "micro-batch must fit) and gradient_accumulation_steps so that the effective batch stays "
                          "the same. Off, or on a CPU, the configured sizes are used as given."},
    )


@dataclass
class KernelChoice:
    """What was chosen and why, for the training result and the log."""

    attention: str
    padding_free: bool
    liger: bool
    batch_size: int
    accumulation: int
    length_grouped: bool
    why: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def flash_attention_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


FLASH_CAPABILITY = (8, 0)  # flash-attn 2 runs on Ampere and later; it fails at the first forward below


def choose_attention(requested: str | None, on_cuda: bool, half: bool, flash: bool,
                     capability: tuple[int, int] | None = None) -> tuple[str, str]:
    """The attention kernel and why: the requested one, else flash-attention where it runs
    (a CUDA GPU of `capability` Ampere or later, 16-bit activations, the package installed), else
    SDPA. A cluster's shared environment may hold flash-attn on nodes whose GPUs it cannot run
    on (V100, T4), where a run resumes as readily as on the node it started on."""
    if requested:
        return requested, "asked for"
    if not on_cuda:
        return SDPA, "auto: no CUDA GPU"
    if not flash:
        return SDPA, "auto: flash-attn not installed"
    if capability is not None and capability < FLASH_CAPABILITY:
        major, minor = capability
        return SDPA, f"auto: flash-attn needs an Ampere or later GPU (sm_80), this one is sm_{major}{minor}"
    if not half:
        return SDPA, "auto: 32-bit activations (flash-attn needs 16)"
    return FLASH, "auto: CUDA, 16-bit, flash-attn installed"


def choose_padding_free(requested: bool | None, attention: str) -> tuple[bool, str]:
    """Padding-free batches where the attention kernel computes each packed sequence alone."""
    if requested is not None:
        return requested, "asked for"
    if attention == FLASH:
        return True, "auto: flash attention runs each packed sequence alone"
    if attention == FLEX:
        return True, "auto: flex attention skips the blocks between packed sequences"
    return False, f"auto: off with {attention} (a flattened batch would attend over the whole row's mask)"


def choose_liger(requested: bool | None, on_cuda: bool, installed: bool) -> tuple[bool, str]:
    """Liger's fused RMSNorm / RoPE / SwiGLU kernels (Triton: CUDA only), when installed."""
    if requested is not None:
        if requested and not installed:
            raise RuntimeError("use_liger_kernel=True, but liger-kernel is not installed (pip install liger-kernel)")
        return requested, "asked for"
    if on_cuda and installed:
        return True, "auto: CUDA, liger-kernel installed"
    return False, "auto: no CUDA GPU" if not on_cuda else "auto: liger-kernel not installed"


def sequence_share(lengths: list[int], order: list[int], micro_batch: int) -> float:
    """The share of a padded micro-batch's positions that hold sequence, over the whole
    micro-batches of examples of `lengths` taken in `order`: what length grouping raises."""
    real = slots = 0
    for start in range(0, len(order) - micro_batch + 1, micro_batch):
        chunk = [lengths[i] for i in order[start:start + micro_batch]]
        real += sum(chunk)
        slots += max(chunk) * micro_batch
    return real / slots


def choose_length_grouping(requested: bool | None, padding_free: bool, batch: int,
                           strategy: str = "random") -> tuple[bool, str]:
    """Micro-batches of similar lengths where a batch is padded: trajectory sequences differ
    widely in length, and a random batch of 8 of them is about a third padding."""
    if requested is not None:
        return requested, "asked for"
    if strategy != "random":
        return False, f"auto: train_sampling_strategy={strategy} asked for"
    if padding_free:
        return False, "auto: padding-free batches hold no padding"
    if batch < 2:
        return False, "auto: a micro-batch of one sequence holds no padding"
    return True, "auto: padded micro-batches of more than one sequence"


def activation_bytes_per_token(config: Any, checkpointing: bool, dtype_bytes: int = 2) -> int:
    """An upper estimate of the activation memory one trained token needs at the step's peak,
    in values of `dtype_bytes` (2 under bf16/fp16 autocast, 4 in fp32).

    With checkpointing, each layer keeps its input (h) and one layer at a time holds its whole
    activations during recomputation; without it every layer holds them. A layer's activations
    are ~(16 h + 6 i) values per token: the norms, q/k/v/o, the attention output and the MLP's
    gate, up and product. The head's logits are chunked by TRL's fused head and left out."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = 16 * h + 6 * i
    values = layers * h + per_layer if checkpointing else layers * per_layer
    return values * dtype_bytes


def choose_batch(batch: int, accumulation: int, longest: int, free_bytes: int | None, per_token: int,
                 headroom: float = 0.6, minimum: int = 1, gpus: int = 1) -> tuple[int, int, str]:
    """(micro-batch, accumulation steps, why): the largest divisor of the effective batch
    (batch x accumulation) whose longest sequences fit in `headroom` of the free memory, with
    the accumulation steps that keep the effective batch exactly; never below `minimum` (KTO's
    KL estimate pairs sequences within a micro-batch). No free-memory figure: as given. `gpus`:
    how many processes' GPUs `free_bytes` is the least of, for the reason given."""
    if free_bytes is None:
        return batch, accumulation, "as configured (no CUDA memory figure)"
    effective = batch * accumulation
    fits = int(free_bytes * headroom // max(1, longest * per_token))
    divisors = [d for d in range(minimum, effective + 1) if effective % d == 0 and d <= max(fits, minimum)]
    if not divisors:
        return batch, accumulation, f"as configured (no micro-batch of at least {minimum} divides {effective})"
    chosen = max(divisors)
    steps = effective // chosen
    where = f" on the fullest of {gpus} GPUs" if gpus > 1 else ""
    return chosen, steps, (f"from free memory: {free_bytes / 2**30:.1f} GiB free{where}, ~{per_token / 2**10:.0f} KiB "
                           f"per token, sequences up to {longest} tokens: {fits} fit; effective batch {effective} kept "
                           f"as {chosen} x {steps}")


def choose_kernels(args: Any, model_config: Any, longest: int, padding_free: bool | None,
                   min_batch: int = 1, why_padding_free: str | None = None, length_grouped: bool | None = None,
                   resumed_batch: int | None = None, orders_its_data: bool = False) -> KernelChoice:
    """Decide every choice for a run with training arguments `args` (an RFT or KTO config) on
    a model with `model_config`, whose longest sequence has `longest` tokens. resumed_batch: the
    micro-batch of the run being resumed, kept whatever memory is free now: the trainer skips the
    batches it trained by count, and a micro-batch of one turns length grouping (the order of
    the batches) off. orders_its_data: the run puts its examples in order itself and the
    trainer reads them so (KTO), so its sampling strategy decides nothing."""
    import torch

    on_cuda = torch.cuda.is_available() and not getattr(args, "use_cpu", False)
    half = bool(args.bf16 or args.fp16)
    capability = tuple(torch.cuda.get_device_capability(args.device)) if on_cuda else None
    attention, why_attention = choose_attention(getattr(args, "attn_implementation", None), on_cuda, half,
                                                flash_attention_installed(), capability)
    if attention == FLEX and not on_cuda:
        raise ValueError("attn_implementation=flex_attention trains on a CUDA GPU only: PyTorch's flex attention "
                         "has no backward pass on a CPU (use sdpa)")
    packed, why_packed = choose_padding_free(padding_free, attention)
    why_packed = why_padding_free or why_packed
    liger, why_liger = choose_liger(args.use_liger_kernel, on_cuda, liger_installed())
    free = None
    if on_cuda and getattr(args, "auto_batch_size", False):
        from toolself.models.memory import gpu_memory

        # Every process of a launched run must split the effective batch alike: their collectives
        # pair up by count, and two processes that split it 1 x 4 and 4 x 1 hung in their first step.
        free = least_over_processes(gpu_memory(args.device)[0], args.device)
    checkpointing = bool(getattr(args, checkpointing_field(args), False))
    effective = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if resumed_batch and effective % resumed_batch == 0:
        batch, steps = resumed_batch, effective // resumed_batch
        why_batch = f"as the run being resumed had it: {batch} x {steps}"
    else:
        per_token = activation_bytes_per_token(model_config, checkpointing, 2 if half else 4)
        batch, steps, why_batch = choose_batch(args.per_device_train_batch_size, args.gradient_accumulation_steps,
                                               longest, free, per_token, minimum=min_batch, gpus=process_count())
    strategy = "random" if orders_its_data else getattr(args, "train_sampling_strategy", "random")
    grouped, why_grouped = choose_length_grouping(length_grouped, packed, batch, strategy)
    return KernelChoice(attention, packed, liger, batch, steps, grouped,
                        {"attention": why_attention, "padding_free": why_packed, "liger": why_liger,
                         "batch_size": why_batch, "length_grouped": why_grouped})


def use_kernels(model: Any, args: Any, longest: int, padding_free: bool | None = None,
                min_batch: int = 1, why_padding_free: str | None = None, length_grouped: bool | None = None,
                resumed_batch: int | None = None, orders_its_data: bool = False) -> KernelChoice:
    """Choose, then set the choices on `model` and on `args` before the trainer is built, and log
    them. TRL's own padding-free flag is cleared: it refuses a custom collator, and ours (which
    counts tokens) flattens the batch itself when `choice.padding_free`; the run orders its data
    by length itself when `choice.length_grouped` (`order.py`)."""
    choice = choose_kernels(args, model.config, longest, padding_free, min_batch, why_padding_free,
                            length_grouped, resumed_batch, orders_its_data)
    if getattr(model.config, "_attn_implementation", None) != choice.attention:
        model.set_attn_implementation(choice.attention)
    args.per_device_train_batch_size = choice.batch_size
    args.gradient_accumulation_steps = choice.accumulation
    args.use_liger_kernel = choice.liger
    if hasattr(args, "padding_free"):
        args.padding_free = False
    for what, why in choice.why.items():
        logger.info("%s: %s", what.replace("_", " "), why)
    return choice
