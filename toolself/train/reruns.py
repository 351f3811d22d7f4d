"""What a rerun of a training command does with what an earlier run left in its folder.

A training run is defined by its base model, its data and its settings, recorded in
`OUT/train_settings.json` when it starts. How it computes (precision, recomputation, kernels,
the device) is recorded too but defines nothing: those follow the hardware by default, so a run
resumed on another machine (a GPU without bf16, a node without flash-attn or Liger, a CPU
without AVX512-BF16) goes on under the new machine's choices, which change roundings and speed
but not what is trained, and says what changed.

A rerun under the same definition resumes from the last complete checkpoint, or, when the run
had finished, returns its result without training again: an 8B model is hours of GPU. So does a
rerun in another number of processes (a preempted job rescheduled onto other GPUs), with the
accumulation steps that keep the run's effective batch, where its optimizer state is whole. A rerun
under another definition would resume from (or stand on) a model trained otherwise, so it is
refused with what differs, unless the caller starts afresh (`--no-resume`) or has settled the
change itself (the CAT pipeline, whose own state refuses changed settings unless forced). A
fresh start removes what the old run left: a stale `checkpoint-500` would outlive the new run's
`checkpoint-45` under the trainer's rotation, which keeps the highest step, and be resumed from
after a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolself.evals.records import atomic_write_text, changed_settings
from toolself.models.digests import base_identity, same_base
from toolself.train.checkpoints import LAUNCHES, last_complete_checkpoint, optimizer_layout, remove_checkpoints

logger = logging.getLogger(__name__)

SETTINGS_FILE = "train_settings.json"
RESULT_FILE = "train_result.json"

# Fields that say where a run writes, how it logs and saves and how it feeds its data loader:
# they may change between a run and its rerun without changing what is trained.
NOT_TRAINING_FIELDS = frozenset({
    "output_dir", "run_name", "report_to", "project", "disable_tqdm", "push_to_hub", "checkpoint_minutes",
    "resume_from_checkpoint", "local_rank", "ddp_timeout", "skip_memory_metrics", "do_train", "do_eval",
    "do_predict", "per_device_eval_batch_size", "prediction_loss_only", "batch_eval_metrics", "include_for_metrics",
    "include_num_input_tokens_seen", "restore_callback_states_from_checkpoint", "debug", "bf16_full_eval",
    "fp16_full_eval", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "auto_batch_size", "stop_grace_seconds",
})
NOT_TRAINING_PREFIXES = ("save_", "logging_", "log_", "eval_", "hub_", "trackio_")
# Fields that say how a run computes on its device; most are chosen from the hardware when left
# unset (`lora.accelerator_defaults`, `kernels.choose_kernels`).
COMPUTE_FIELDS = frozenset({
    "bf16", "fp16", "tf32", "use_cpu", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "activation_checkpointing", "activation_checkpointing_kwargs", "activation_offloading", "torch_compile",
    "torch_compile_backend", "torch_compile_mode", "use_liger_kernel", "liger_kernel_config", "attn_implementation",
    "padding_free", "compile_layers", "cache_frozen_layers", "torch_empty_cache_steps", "use_cache",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend",
})


# How a run orders its data (`order.py`), recorded with its settings: a checkpoint of a run that
# ordered it otherwise would resume into other data.
ORDER_SETTING, DATA_ORDER = "data_order", "by seed, micro-batch and epoch"


class TrainingMismatch(ValueError):
    """The output folder holds a run with another base model, other data or other settings."""


@dataclass
class StartPoint:
    """Where a run starts: the finished run's result (nothing to train), a checkpoint to resume
    from, or neither (from step 0); a resumed run's compute settings that differ from those it
    was checkpointed under (`bf16: was True, now False`)."""

    finished: dict[str, Any] | None = None
    checkpoint: Path | None = None
    compute_changes: list[str] = field(default_factory=list)
    moved: ProcessChange | None = None
    order_unrecorded: bool = False


@dataclass
class ProcessChange:
    """A run resumed in another number of processes than its checkpoint's: the effective batch
    counts every process, so each one accumulates over more (or fewer) micro-batches, and the
    run keeps the settings it started with (a later resume compares with those)."""

    was: int
    now: int
    accumulation: int
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, int]:
        return {"processes_was": self.was, "processes_now": self.now, "gradient_accumulation_steps": self.accumulation}


def run_definition(config: Any, base: str | Path, dataset: Any, columns: list[str]) -> dict[str, Any]:
    """The base model, a digest of the trained `columns` of `dataset`, every setting that
    changes what is trained, and apart from them how the run computes, as JSON values."""
    kept = {name: value for name, value in config.to_dict().items()
            if name not in NOT_TRAINING_FIELDS and not name.startswith(NOT_TRAINING_PREFIXES)}
    settings = {name: value for name, value in kept.items() if name not in COMPUTE_FIELDS}
    settings["world_size"] = config.world_size  # the effective batch counts every process
    settings[ORDER_SETTING] = DATA_ORDER
    definition = {"base": base_identity(Path(base)), "data": {"examples": len(dataset),
                                                             "digest": data_digest(dataset, columns)},
                  "settings": settings, "compute": {name: kept[name] for name in COMPUTE_FIELDS & set(kept)}}
    return json.loads(json.dumps(definition, sort_keys=True, default=str))


def same_run(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two definitions define one run: the same base (`same_base`), data and settings,
    however it computes. A run recorded before its data order was is compared without it
    (`StartPoint.order_unrecorded` says so, for the trainer that knows its order to decide)."""
    if ORDER_SETTING not in was.get("settings", {}):
        now = without_order(now)
    return same_base(was.get("base", {}), now.get("base", {})) and defining(was) == defining(now)


def without_order(definition: dict[str, Any]) -> dict[str, Any]:
    return {**definition, "settings": {k: v for k, v in definition.get("settings", {}).items() if k != ORDER_SETTING}}


def defining(definition: dict[str, Any]) -> dict[str, Any]:
    """What of a recorded definition a rerun must match besides its base: its data and settings,
    not how it computes (which runs recorded before it was kept apart hold among their settings)."""
    settings = {k: v for k, v in definition.get("settings", {}).items() if k not in COMPUTE_FIELDS}
    return {**{k: v for k, v in definition.items() if k not in ("compute", "base")}, "settings": settings}


def compute_of(definition: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in definition.get("settings", {}).items() if k in COMPUTE_FIELDS},
            **definition.get("compute", {})}


def data_digest(dataset: Any, columns: list[str]) -> str:
    """SHA-256 of the columns' values in the dataset's order (each list column's lengths and
    values, 4096 rows at a time): the same whether the dataset was built in memory or read back
    from disk in other chunks."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    digest = hashlib.sha256()
    for batch in dataset.select_columns(columns).with_format("arrow").iter(batch_size=4096):
        for name in columns:
            column = batch.column(name).combine_chunks()
            if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
                digest.update(np.asarray(pc.list_value_length(column).fill_null(-1), dtype=np.int64).tobytes())
                digest.update(np.asarray(pc.list_flatten(column), dtype=np.int64).tobytes())
            else:
                digest.update(json.dumps(column.to_pylist()).encode())
    return digest.hexdigest()


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    lines = []
    if not same_base(old.get("base", {}), new.get("base", {})):
        was, now = old.get("base", {}), new.get("base", {})
        lines.append(f"base model: was {was.get('path')}, now {now.get('path')}" if was.get("path") != now.get("path")
                     else f"base model: the model in {now.get('path')} has changed")
    if old.get("data") != new.get("data"):
        was, now = old.get("data", {}), new.get("data", {})
        lines.append(f"data: was {was.get('examples')} examples, now {now.get('examples')}"
                     + ("" if was.get("examples") != now.get("examples") else ", with other contents"))
    return lines + changed_settings(defining(old)["settings"], defining(new)["settings"])


def start_point(out_dir: Path, checkpoints: str | Path, definition: dict[str, Any], resume: bool,
                replace_other: bool = False) -> StartPoint:
    """Decide where the run in `out_dir` starts, and on a fresh start clear what an earlier
    run left and record this one's definition. Every process decides from the same files
    before the main one changes them, so all decide alike (or all raise). A resumed run from
    before definitions were recorded adopts this one's."""
    from accelerate import PartialState

    state = PartialState()
    point = _decide(out_dir, Path(checkpoints), definition, resume, replace_other)
    state.wait_for_everyone()
    if point.compute_changes and state.is_main_process:
        logger.warning("resuming %s from %s under other compute settings (%s): the same run, rounded and timed "
                       "as this machine computes", out_dir, point.checkpoint, "; ".join(point.compute_changes))
    if point.finished is None and state.is_main_process:
        if point.checkpoint is None:
            remove_checkpoints(checkpoints)
            (out_dir / RESULT_FILE).unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        kept = definition if point.moved is None else {**definition, "settings": point.moved.settings}
        if point.order_unrecorded:  # still so when the trainer, which knows its order, refuses it
            kept = without_order(kept)
        atomic_write_text(out_dir / SETTINGS_FILE, json.dumps(kept, indent=2) + "\n")
    state.wait_for_everyone()
    return point


def _decide(out_dir: Path, checkpoints: Path, definition: dict[str, Any], resume: bool,
            replace_other: bool) -> StartPoint:
    if not resume:
        return StartPoint()
    recorded = read_json(out_dir / SETTINGS_FILE)
    finished = read_json(out_dir / RESULT_FILE)
    checkpoint = last_complete_checkpoint(checkpoints)
    unrecorded = checkpoint is not None and ORDER_SETTING not in (recorded or {}).get("settings", {})
    if recorded is not None and same_run(recorded, definition):
        if finished is not None:
            return StartPoint(finished=finished)
        changes = changed_settings(compute_of(recorded), compute_of(definition)) if checkpoint is not None else []
        return StartPoint(checkpoint=checkpoint, compute_changes=changes, order_unrecorded=unrecorded)
    if recorded is None:  # a run from before definitions were recorded: resume its checkpoint as before
        return StartPoint(checkpoint=checkpoint, order_unrecorded=unrecorded)
    hint = ""
    if only_processes_differ(recorded, definition):
        if finished is not None:
            return StartPoint(finished=finished)
        if checkpoint is not None:
            moved, hint = process_change(recorded, definition, checkpoint)
            if moved is not None:
                return StartPoint(checkpoint=checkpoint, moved=moved, order_unrecorded=unrecorded,
                                  compute_changes=changed_settings(compute_of(recorded), compute_of(definition)))
    if (finished is not None or checkpoint is not None) and not replace_other:
        what = "a model trained" if finished is not None else f"a checkpoint ({checkpoint.name}) of a run"
        raise TrainingMismatch(
            f"{out_dir} holds {what} with another base model, other data or other settings:\n"
            + "\n".join(f"  {line}" for line in differences(recorded, definition)) + hint
            + "\nUse another --out folder, or --no-resume to train from the start in this one (replacing it).")
    return StartPoint()


def only_processes_differ(recorded: dict[str, Any], definition: dict[str, Any]) -> bool:
    processes = recorded.get("settings", {}).get("world_size")
    now = definition.get("settings", {})
    return processes not in (None, now.get("world_size")) and \
        same_run(recorded, {**definition, "settings": {**now, "world_size": processes}})


def process_change(recorded: dict[str, Any], definition: dict[str, Any],
                   checkpoint: Path) -> tuple[ProcessChange | None, str]:
    """How a checkpoint of a run in another number of processes goes on here, or why it cannot
    (the hint a refusal ends with). Each optimizer step reads the next effective batch of the
    run's one seeded order, dealt out micro-batch by micro-batch to the processes, so the same
    effective batch in another number of processes reads the same data at every step. A
    DeepSpeed or FSDP run's optimizer state is saved split between its processes (DeepSpeed's
    universal-checkpoint conversion would be needed) or gathered in a file of FSDP's own, and is
    resumed only in as many processes: neither launch runs on a CPU, where this could be tested."""
    was_settings = recorded["settings"]
    was, now = was_settings["world_size"], definition["settings"]["world_size"]
    steps = was_settings.get("gradient_accumulation_steps", 1)
    shared = was * steps  # micro-batches per optimizer step, all processes together
    again = (f"launch it so again to go on from it (torchrun --nproc_per_node {was}, or accelerate launch "
             f"--num_processes {was})" if was > 1 else "run it without a launcher to go on from it")
    layout = optimizer_layout(checkpoint)
    if layout != "whole":
        saved = f"was saved by {LAUNCHES[layout].name}, which" if layout else "was not saved (save_only_model), and"
        return None, (f"\nIt ran in {processes(was)}, and {checkpoint.name}'s optimizer state {saved} this version "
                      f"resumes only in as many processes: {again}.")
    if shared % now:
        others = [n for n in range(1, shared + 1) if shared % n == 0 and n != was]
        evenly = f", or resume it in {' or '.join(map(processes, others))}, which share its effective batch evenly"
        return None, (f"\nIt ran in {processes(was)} of {steps} accumulation step{'s' if steps > 1 else ''} each: "
                      f"{again}{evenly if others else ''}.")
    return ProcessChange(was, now, shared // now, was_settings), ""


def processes(count: int) -> str:
    return "one process" if count == 1 else f"{count} processes"


def adopt_process_change(start: StartPoint, config: Any) -> None:
    """Set the accumulation steps that keep a resumed run's effective batch in this number of
    processes, before the kernels split it into micro-batches."""
    if start.moved is None:
        return
    from accelerate import PartialState

    if PartialState().is_main_process:
        logger.warning("resuming a run of %d processes in %d: %d accumulation steps (not %d) keep its effective batch",
                       start.moved.was, start.moved.now, start.moved.accumulation, config.gradient_accumulation_steps)
    config.gradient_accumulation_steps = start.moved.accumulation


def refuse_reordered_resume(start: StartPoint, was_batch: int | None, batch: int) -> None:
    """A run whose order is cut in micro-batches (`order.micro_batch_order`), resumed in another
    number of processes, keeps its checkpoint's micro-batch (`was_batch`) or is refused: with
    another, the data its checkpoint stopped at would not be where it is now."""
    if start.moved is not None and was_batch is not None and batch != was_batch:
        raise TrainingMismatch(
            f"a run of {processes(start.moved.was)} does not resume in {processes(start.moved.now)}: its data is "
            f"ordered in micro-batches of {was_batch}, which do not divide each process's share of the batch now. "
            f"Launch it in {processes(start.moved.was)} again, or use --no-resume to train from the start.")


def refuse_unrecorded_order(start: StartPoint, grouped: bool) -> None:
    """A checkpoint of a run that grouped its batches by length before the order was a function
    of its seed and epoch (it came from the process's random state) would resume into other
    batches, so it is refused."""
    if start.order_unrecorded and grouped:
        raise TrainingMismatch(
            f"{start.checkpoint} is of a run that grouped its batches by length in an order drawn from its random "
            "state, which this version does not draw again (it orders them by its seed and epoch): resume it with "
            "the toolself version that started it, or use --no-resume to train from the start.")


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing, torn or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
