"""CAT stage II: trajectory-level KTO on the RFT model's own attempts (TRL `KTOTrainer`, LoRA).

The RFT adapter is merged into its base first and a new adapter is trained on top, so the
policy starts as the RFT model and the reference (TRL's adapter-disabled forward pass) *is*
the RFT model, as CAT prescribes. The decisions come pre-tokenized from the data builder;
`PretokenizedKTOTrainer` only adds TRL's KL pairing to them instead of re-rendering and
re-tokenizing text, so the trained tokens are the ones the policy produced.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Callable

from trl import KTOTrainer

from toolself.train.data import kto_weights
from toolself.train.kto_config import CATKTOConfig
from toolself.train.order import EpochOrder, micro_batch_order, order_seed, read_in, whole_micro_batch_epoch
from toolself.train.rft import TrainResult, finished_result, run_trainer

logger = logging.getLogger(__name__)


class PretokenizedKTOTrainer(KTOTrainer):
    """A `KTOTrainer` that accepts datasets already holding `prompt_ids` / `completion_ids`."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if "prompt_ids" not in (dataset.column_names or []):
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        dataset = dataset.select_columns(["prompt_ids", "completion_ids", "label"])
        if self.calculate_KL:
            # TRL's pairing: completions rotated by one within each micro-batch (mismatched pairs).
            def add_kl(batch):
                batch["KL_completion_ids"] = [batch["completion_ids"][-1]] + batch["completion_ids"][:-1]
                return batch

            dataset = dataset.map(add_kl, batched=True, batch_size=args.per_device_train_batch_size)
        return dataset


def train_kto(dataset, policy_path: str | Path, out_dir: str | Path, config: CATKTOConfig | None = None,
              log_path: str | Path | None = None, resume: bool = False,
              replace_other: bool = False, before_training: Callable[[], None] | None = None) -> TrainResult:
    """Train a KTO adapter on top of `policy_path` (the RFT adapter or a full model) with
    `dataset` (prompt_ids / completion_ids / label), saved in `out_dir` with the merged
    starting model in `out_dir/base` when the policy was an adapter. resume, replace_other,
    before_training: as `train_rft`'s."""
    from toolself.train.checkpoints import resumed_micro_batch
    from toolself.train.kernels import use_kernels
    from toolself.train.lora import load_base
    from toolself.train.merge import prepare_base
    from toolself.train.reruns import adopt_process_change, refuse_reordered_resume, run_definition, start_point
    from toolself.train.trainlog import JsonlLog, TokenCounter
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    if len(dataset) < 2:
        raise ValueError("the KTO dataset needs at least two decisions")
    out_dir = Path(out_dir)
    config = config or CATKTOConfig(output_dir=str(out_dir / "checkpoints"))
    if config.output_dir is None:
        config.output_dir = str(out_dir / "checkpoints")
    desirable = sum(bool(x) for x in dataset["label"])
    weights = kto_weights(desirable, len(dataset) - desirable)
    if config.balance_weights:
        config.desirable_weight, config.undesirable_weight = weights.desirable_weight, weights.undesirable_weight
    weights.desirable_weight, weights.undesirable_weight = config.desirable_weight, config.undesirable_weight
    if weights.single_class:
        logger.warning("every decision has the same label (%d desirable of %d): KTO has one class to learn from",
                       desirable, len(dataset))
    log_path = Path(log_path) if log_path else out_dir / "train_log.jsonl"
    trained = [c for c in ("prompt_ids", "completion_ids", "prompt", "completion", "label")
               if c in (dataset.column_names or [])]
    start = start_point(out_dir, config.output_dir, run_definition(config, policy_path, dataset, trained), resume,
                        replace_other)
    if before_training is not None:
        before_training()
    if start.finished is not None:
        return finished_result(start.finished)
    from accelerate import PartialState

    with PartialState().main_process_first():  # one process merges; the others then find it
        base = prepare_base(policy_path, out_dir)
    model, tokenizer = load_base(base)
    tokenized = "prompt_ids" in (dataset.column_names or [])
    lengths = decision_lengths(dataset)
    adopt_process_change(start, config)
    resumed_batch = resumed_micro_batch(start.checkpoint)
    kernels = use_kernels(model, config, max(lengths) if tokenized else config.max_length, padding_free=False,
                          min_batch=1 if config.loss_type == "apo_zero_unpaired" else 2,
                          why_padding_free="off: TRL's KTO collator pads (it has no padding-free form)",
                          length_grouped=config.length_grouped, resumed_batch=resumed_batch, orders_its_data=True)
    refuse_reordered_resume(start, resumed_batch, kernels.batch_size)
    # The data builder keeps each attempt's decisions together, attempt after attempt, and TRL's
    # KTO trainer reads them in the dataset's order: read so, a micro-batch would be one attempt's
    # decisions under one label, with its mismatched KL pairs from one episode.
    dataset = dataset.select(micro_batch_order(lengths, kernels.batch_size, order_seed(config), kernels.length_grouped))
    collator = DataCollatorForUnpairedPreference(pad_token_id=tokenizer.pad_token_id, max_length=config.max_length)
    counter = TokenCounter()
    log = JsonlLog(log_path, counter, stage="kto",
                   extra={"examples": len(dataset), "base": str(base), "weights": weights.to_dict(),
                          "kernels": kernels.to_dict()})
    trainer = PretokenizedKTOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                                     data_collator=collator, peft_config=config.peft_config(model), callbacks=[log])
    # Each decision's KL completion was taken from its micro-batch as TRL prepared the dataset, so a
    # later epoch may only move whole micro-batches.
    size = len(trainer.train_dataset)
    read_in(trainer, EpochOrder(partial(whole_micro_batch_epoch, size, kernels.batch_size, order_seed(config)), size))
    return run_trainer(trainer, counter, out_dir, log_path, len(dataset), start,
                       extra={"weights": weights.to_dict(), "base": str(base), "kernels": kernels.to_dict()})


def decision_lengths(dataset) -> list[int]:
    """Each decision's prompt and completion length: in tokens, or in characters for a dataset of
    text that TRL is still to tokenize."""
    tokenized = "prompt_ids" in (dataset.column_names or [])
    return [len(p) + len(c) for p, c in zip(dataset["prompt_ids" if tokenized else "prompt"],
                                            dataset["completion_ids" if tokenized else "completion"])]
