"""The training options of each CAT stage, as trl-free dataclasses.

`RFTConfig` and `CATKTOConfig` inherit these first, so one field is at once the configuration's
default, its help and (where its metadata names an `option`) the command line's option:
`stage_options` builds `train rft` / `train kto` options from them. They live apart from the
configs because importing TRL takes seconds, and the command line must start fast.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import typer

from toolself.train.lora import LoraArguments


def _option(default: Any, option: str, help: str, minimum: float | None = None) -> Any:
    return field(default=default, metadata={"help": help, "option": option, "min": minimum})


def _max_steps() -> Any:
    return _option(-1, "--max-steps", "Stop after this many optimizer steps (-1: the epochs decide).", 1)


def _lora_r() -> Any:
    rank = _LORA["lora_r"].metadata["help"].removeprefix("LoRA rank. ")
    return _option(16, "--lora-r", "LoRA rank; alpha follows as 2r. " + rank, 1)


def _full_finetune() -> Any:
    return _option(False, "--full-finetune", _LORA["full_finetune"].metadata["help"])


def _checkpoint_minutes() -> Any:
    return _option(30.0, "--checkpoint-minutes", "Save a resumable checkpoint every N minutes of training (the "
                   "latest only, removed once the model is saved) unless save_strategy asks for steps or epochs; "
                   "rerunning the command resumes from it, so a crash costs at most N minutes. 0: none.", 0)


def _stop_grace() -> Any:
    return _option(None, "--stop-grace", "Seconds the scheduler waits between the SIGTERM that stops this job and "
                   "killing it. A run whose step and checkpoint take longer warns once: it would be killed before "
                   "its checkpoint. Default: 30 under Slurm, Kubernetes or torchrun (their defaults: KillWait, the "
                   "pod's grace period, TORCH_ELASTIC_SHUTDOWN_TIMEOUT), no warning elsewhere. 0: no warning.", 0)


_LORA = LoraArguments.__dataclass_fields__


@dataclass
class RFTOptions(LoraArguments):
    """Stage I: rejection-sampling fine-tuning on a teacher's successful trajectories."""

    num_train_epochs: float = _option(
        2.0, "--epochs", "Passes over the successful trajectories. Rejection sampling yields few of them; two "
        "passes fit them without memorising single tasks.", 0)
    learning_rate: float = _option(
        2e-4, "--lr", "AdamW learning rate. 2e-4 is the usual LoRA SFT rate (LoRA updates start at zero and need "
        "a rate ~10x a full fine-tune's); use ~1e-5 with --full-finetune.", 0)
    per_device_train_batch_size: int = _option(
        2, "--batch-size", "Sequences per device and micro-step (trajectory sequences are long).", 1)
    gradient_accumulation_steps: int = _option(
        4, "--grad-accum", "Micro-steps per optimizer step: an effective batch of 8 sequences per device.", 1)
    max_steps: int = _max_steps()
    lora_r: int = _lora_r()
    full_finetune: bool = _full_finetune()
    compile_layers: bool | None = _option(None, "--compile-layers/--eager-layers",
                                          _LORA["compile_layers"].metadata["help"])
    checkpoint_minutes: float = _checkpoint_minutes()
    stop_grace_seconds: float | None = _stop_grace()


@dataclass
class KTOOptions(LoraArguments):
    """Stage II: trajectory-level KTO on the RFT policy's own scored attempts."""

    beta: float = _option(0.1, "--beta", "KTO's beta: how far the policy may move from the reference (the RFT "
                          "model). 0.1 is the KTO paper's default.", 0)
    num_train_epochs: float = _option(1.0, "--epochs", "Passes over the decisions.", 0)
    learning_rate: float = _option(
        5e-5, "--lr", "AdamW learning rate. TRL's 1e-6 default is for full fine-tuning; a fresh LoRA adapter needs "
        "a larger rate to move at all, and 5e-5 keeps KTO's KL term small. Use ~5e-7 to 5e-6 with --full-finetune.",
        0)
    per_device_train_batch_size: int = _option(
        4, "--batch-size", "Decisions per device and micro-step. At least 2: KTO estimates its KL reference point "
        "from mismatched pairs within a micro-batch.", 2)
    gradient_accumulation_steps: int = _option(
        2, "--grad-accum", "Micro-steps per optimizer step: an effective batch of 8 decisions per device.", 1)
    max_steps: int = _max_steps()
    lora_r: int = _lora_r()
    full_finetune: bool = _full_finetune()
    compile_layers: bool | None = field(
        default=False,
        metadata={"help": "Compile each decoder layer with torch.compile. Off for KTO: its reference pass (no "
                          "gradients, adapter off) compiles to other kernels than the policy's pass, whose bf16 "
                          "roundings then differ, so a fresh adapter starts with a log-ratio that is not zero; and "
                          "a KTO run of a few minutes spends what compiling saves on compiling its variants."})
    checkpoint_minutes: float = _checkpoint_minutes()
    stop_grace_seconds: float | None = _stop_grace()


def stage_options(options: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the fields of `options` that name an `option` to a command, which receives them as
    `training`, an `options` instance. An option left out takes the field's default; `--lora-r`
    sets alpha to 2r with it."""
    offered = [f for f in dataclasses.fields(options) if f.metadata.get("option")]

    def parameter(f: dataclasses.Field) -> inspect.Parameter:
        kind = _TYPES[str(f.type)]
        flag = kind is bool and f.default is False
        help_text = f.metadata["help"] + ("" if flag or f.default is None else f" (default: {f.default:g})")
        info = typer.Option(f.default if flag else None, *f.metadata["option"].split(" "), help=help_text,
                            min=f.metadata.get("min"))
        return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                 annotation=bool if flag else Optional[kind])

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        kept = [p for name, p in signature.parameters.items() if name != "training"]

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {f.name: kwargs.pop(f.name, None) for f in offered}
            given = {k: v for k, v in given.items() if v is not None and not isinstance(v, typer.models.OptionInfo)}
            if "lora_r" in given:
                given["lora_alpha"] = 2 * given["lora_r"]
            return command(*args, training=options(**given), **kwargs)

        parameters = kept + [parameter(f) for f in offered]
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return wrapper

    return decorate


_TYPES: dict[str, type] = {"float": float, "float | None": float, "int": int, "bool": bool, "bool | None": bool}
