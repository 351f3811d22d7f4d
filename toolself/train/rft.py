"""CAT stage I: fine-tune a student on the successful trajectories (TRL `SFTTrainer`, LoRA).

The dataset is the data builder's: pre-tokenized sequences with their labels (-100 on every
token the policy did not write), trained as is with TRL's collator (padded, or flattened into
one row where the attention kernel runs packed sequences alone: see `kernels.py`), so the loss
falls exactly on the tokens the teacher produced.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable

from toolself.train.reruns import StartPoint, TrainingMismatch
from toolself.train.rft_config import RFTConfig

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """Where the trained model went and what training measured."""

    output_dir: str
    adapter: bool
    steps: int
    train_loss: float | None
    tokens: int
    seconds: float
    tokens_per_second: float
    examples: int
    log: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def train_rft(dataset, model_path: str | Path, out_dir: str | Path, config: RFTConfig | None = None,
              log_path: str | Path | None = None, resume: bool = False,
              replace_other: bool = False, before_training: Callable[[], None] | None = None) -> TrainResult:
    """Fine-tune `model_path` (a model directory; an adapter is merged first) on `dataset`
    (input_ids / labels) and save the adapter (or the full model) with its tokenizer in
    `out_dir`, which then loads with `--model local:OUT_DIR`. resume: go on from where a run of
    the same definition in `out_dir` stopped, or return its result if it finished (see
    `reruns`); a run of another definition there is refused unless `replace_other`.
    before_training: called once the run is known not to be refused (also when it had finished)."""
    from trl import SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from toolself.models.digests import relocate_base
    from toolself.train.checkpoints import resumed_micro_batch
    from toolself.train.kernels import use_kernels
    from toolself.train.lora import load_base
    from toolself.train.merge import prepare_base
    from toolself.train.order import EpochOrder, length_grouped_epoch, order_seed, read_in
    from toolself.train.reruns import (adopt_process_change, refuse_reordered_resume, refuse_unrecorded_order,
                                       run_definition, start_point)
    from toolself.train.trainlog import JsonlLog, TokenCounter

    if len(dataset) == 0:
        raise ValueError("the RFT dataset is empty: no successful trajectory to learn from")
    out_dir = Path(out_dir)
    config = config or RFTConfig(output_dir=str(out_dir / "checkpoints"))
    if config.output_dir is None:
        config.output_dir = str(out_dir / "checkpoints")
    log_path = Path(log_path) if log_path else out_dir / "train_log.jsonl"
    dataset = dataset.select_columns(["input_ids", "labels"])
    start = start_point(out_dir, config.output_dir, run_definition(config, model_path, dataset, dataset.column_names),
                        resume, replace_other)
    if before_training is not None:
        before_training()
    if start.finished is not None:
        relocate_base(out_dir, Path(model_path))  # the same base (its digest), maybe mounted elsewhere now
        return finished_result(start.finished)
    from accelerate import PartialState

    with PartialState().main_process_first():  # one process merges; the others then find it
        base = prepare_base(model_path, out_dir)
    model, tokenizer = load_base(base)
    adopt_process_change(start, config)
    resumed_batch = resumed_micro_batch(start.checkpoint)
    kernels = use_kernels(model, config, max(map(len, dataset["input_ids"])), config.padding_free,
                          length_grouped=config.length_grouped, resumed_batch=resumed_batch)
    refuse_unrecorded_order(start, kernels.length_grouped)
    refuse_reordered_resume(start, resumed_batch if kernels.length_grouped else None, kernels.batch_size)
    collator = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=kernels.padding_free)
    counter = TokenCounter()
    log = JsonlLog(log_path, counter, stage="rft",
                   extra={"examples": len(dataset), "base": str(base), "kernels": kernels.to_dict()})
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         data_collator=collator, peft_config=config.peft_config(model), callbacks=[log])
    if kernels.length_grouped:
        lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
        read_in(trainer, EpochOrder(partial(length_grouped_epoch, lengths, kernels.batch_size, order_seed(config)),
                                    len(lengths)))
    return run_trainer(trainer, counter, out_dir, log_path, len(dataset), start, extra={"kernels": kernels.to_dict()})


def finished_result(saved: dict[str, Any]) -> TrainResult:
    """The result a finished run recorded, marked as such for whoever reports it."""
    known = {f.name for f in fields(TrainResult)}
    result = TrainResult(**{k: v for k, v in saved.items() if k in known})
    result.extra["finished_earlier"] = True
    return result


def run_trainer(trainer, counter, out_dir: Path, log_path: Path, examples: int, start: StartPoint,
                extra: dict[str, Any] | None = None) -> TrainResult:
    """Train (from `start`'s checkpoint, when resuming), save the model and its tokenizer, and
    write `train_result.json` with the tokens `counter` counted: the part RFT and KTO share."""
    from accelerate import PartialState

    from toolself.interrupts import StoppedEarly
    from toolself.train.checkpoints import (CheckpointWhenAskedToStop, TimedCheckpoints, asked_to_stop, launch_layout,
                                            remove_checkpoints, resumed_step, signals_the_launcher_drops, stop_grace,
                                            trim_log, unreadable_optimizer_state, unrestorable_resume)
    from toolself.train.compact_head import use_compact_head
    from toolself.train.compiled_layers import compile_decoder_layers, should_compile
    from toolself.train.frozen_layers import cache_frozen_layers

    args, checkpoint = trainer.args, start.checkpoint
    if checkpoint is not None:
        import transformers

        refusal = unrestorable_resume(args.world_size, args.device.type, transformers.__version__)
        if refusal:
            raise RuntimeError(refusal)
        unreadable = unreadable_optimizer_state(checkpoint, launch_layout(trainer))
        if unreadable:
            raise TrainingMismatch(unreadable)
    use_compact_head(trainer.model)
    compiled, why = should_compile(getattr(args, "compile_layers", False), on_gpu=args.device.type != "cpu")
    if compiled:
        compile_decoder_layers(trainer.model)  # first: the frozen-layer cache wraps the compiled layers
    frozen = cache_frozen_layers(trainer.model) if getattr(args, "cache_frozen_layers", False) else None
    counter.watch(trainer)
    timed = bool(getattr(args, "checkpoint_minutes", 0)) and args.save_strategy == "no"
    if timed:
        trainer.add_callback(TimedCheckpoints(args.checkpoint_minutes))
        args.save_total_limit = args.save_total_limit or 1
    start_step = resumed_step(checkpoint) if checkpoint is not None else 0
    if PartialState().is_main_process:
        if checkpoint is None:  # a fresh run: a fresh log
            log_path.unlink(missing_ok=True)
        else:
            trim_log(log_path, start_step)
            logger.info("resuming from %s", checkpoint)
    dropped = signals_the_launcher_drops(os.environ)
    if dropped and PartialState().is_main_process:
        logger.warning(dropped)
    started = time.perf_counter()
    with asked_to_stop() as stop:
        grace = stop_grace(getattr(args, "stop_grace_seconds", None), os.environ)
        trainer.add_callback(CheckpointWhenAskedToStop(stop, grace, args.checkpoint_minutes if timed else 0))
        output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.perf_counter() - started
    if stop.step is not None:
        raise StoppedEarly(f"training stopped by {stop.signal or 'a stop signal'} at step {stop.step}, saved as a "
                           f"checkpoint in {args.output_dir}: the same command resumes from it")
    trainer.save_model(str(out_dir))
    main = trainer.is_world_process_zero()
    counted = counter.summed(args.device)
    frozen_stats = frozen.stats(args.device) if frozen is not None else None
    result = TrainResult(output_dir=str(out_dir), adapter=not args.full_finetune, steps=output.global_step,
                         train_loss=output.training_loss, tokens=counted.tokens, seconds=round(seconds, 3),
                         tokens_per_second=round(counted.tokens / seconds, 2) if seconds and main else 0.0,
                         examples=examples, log=str(log_path), extra=dict(extra or {}) if main else {})
    if main:
        result.extra["compiled_layers"] = why
        if start_step:  # tokens and seconds count from there
            result.extra["resumed_from_step"] = start_step
        if start.compute_changes:
            result.extra["resumed_with_other_compute"] = start.compute_changes
        if start.moved is not None:
            result.extra["resumed_in_other_processes"] = start.moved.to_dict()
        if counted.kl_tokens:  # counted during training: KTO's mismatched pairs
            result.extra["kl_tokens"] = counted.kl_tokens
        elif counted.slots:  # RFT: how much of its batches was sequence, not padding
            result.extra["padding_efficiency"] = round(counted.tokens / counted.slots, 4)
        if frozen_stats is not None:
            result.extra["frozen_layer_cache"] = frozen_stats
            logger.info("frozen-layer cache: %s", frozen_stats)
        trainer.processing_class.save_pretrained(str(out_dir))
        (out_dir / "train_result.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
        if timed:  # the run is saved whole; they were its insurance
            remove_checkpoints(args.output_dir)
    return result
