"""CAT stage II: trajectory-level KTO on the RFT model's own attempts (TRL `KTOTrainer`, LoRA).

The RFT adapter is merged into its base first and a new adapter is trained on top, so the
policy starts as the RFT model and the reference (TRL's adapter-disabled forward pass) *is*
the RFT model, as CAT prescribes. The decisions come pre-tokenized from the data builder;
`PretokenizedKTOTrainer` only adds TRL's KL pairing to them instead of re-rendering and
re-tokenizing text, so the trained tokens are the ones the policy produced.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from torch.utils.data import Sampler
from trl import KTOTrainer

from toolself.train.data import kto_weights
from toolself.train.kto_config import CATKTOConfig
from toolself.train.rft import TrainResult, finished_result, run_trainer

logger = logging.getLogger(__name__)


class PretokenizedKTOTrainer(KTOTrainer):
    """A `KTOTrainer` that accepts datasets already holding `prompt_ids` / `completion_ids`, and
    reads its micro-batches in a new order each epoch."""

    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        return EpochShuffledMicroBatches(len(dataset), self.args.per_device_train_batch_size, order_seed(self.args))

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
    refuse_reordered_resume(start, f"its decisions are ordered in micro-batches of {resumed_batch}, which do not divide "
                                   f"each process's share of the batch now"
                            if resumed_batch is not None and kernels.batch_size != resumed_batch else None)
    dataset = dataset.select(decision_order(lengths, kernels.batch_size, order_seed(config), kernels.length_grouped))
    collator = DataCollatorForUnpairedPreference(pad_token_id=tokenizer.pad_token_id, max_length=config.max_length)
    counter = TokenCounter()
    log = JsonlLog(log_path, counter, stage="kto",
                   extra={"examples": len(dataset), "base": str(base), "weights": weights.to_dict(),
                          "kernels": kernels.to_dict()})
    trainer = PretokenizedKTOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                                     data_collator=collator, peft_config=config.peft_config(model), callbacks=[log])
    return run_trainer(trainer, counter, out_dir, log_path, len(dataset), start,
                       extra={"weights": weights.to_dict(), "base": str(base), "kernels": kernels.to_dict()})


def decision_lengths(dataset) -> list[int]:
    """Each decision's prompt and completion length: in tokens, or in characters for a dataset of
    text that TRL is still to tokenize."""
    tokenized = "prompt_ids" in (dataset.column_names or [])
    return [len(p) + len(c) for p, c in zip(dataset["prompt_ids" if tokenized else "prompt"],
                                            dataset["completion_ids" if tokenized else "completion"])]


def decision_order(lengths: list[int], micro_batch: int, seed: int, grouped: bool) -> list[int]:
    """The order KTO trains on its decisions in. TRL's KTO trainer reads them in the dataset's
    order (each one's KL completion is a neighbour's in its micro-batch), and the data builder
    keeps each attempt's decisions together, attempt after attempt: read so, a micro-batch would
    be one attempt's decisions under one label, its mismatched pairs from one episode, and an
    epoch would go through the tasks one by one. So the order is shuffled with `seed`; `grouped`,
    the shuffle is grouped by length as transformers' length-grouped sampler groups it (random
    groups of up to 50 micro-batches, sorted within), so that a padded micro-batch pads little,
    and then the micro-batches are shuffled, so that each optimizer step still mixes attempts of
    every length. The micro-batch holding the longest decision comes first (a batch too large
    for the device fails at once) and a partial one last (the others keep their boundaries)."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    generator = torch.Generator().manual_seed(seed)
    if not grouped:
        return torch.randperm(len(lengths), generator=generator).tolist()
    order = get_length_grouped_indices(lengths, micro_batch, generator=generator)
    batches = [order[i:i + micro_batch] for i in range(0, len(order), micro_batch)]
    tail = batches.pop() if len(batches[-1]) < micro_batch else []
    rest = batches[1:]  # transformers put the longest decision in the first
    shuffled = [rest[b] for b in torch.randperm(len(rest), generator=generator).tolist()]
    return [i for batch in batches[:1] + shuffled + [tail] for i in batch]


def order_seed(config) -> int:
    return config.seed if config.data_seed is None else config.data_seed


def epoch_order(size: int, micro_batch: int, seed: int, epoch: int) -> list[int]:
    """Which of the dataset's rows epoch `epoch` reads, in order. TRL's KTO trainer reads the rows
    sequentially, and each row's KL completion was taken from its micro-batch when the dataset
    was prepared, so a later epoch may only move whole micro-batches: it shuffles them, with
    the partial one last (the others keep their boundaries). The first epoch reads the rows as
    they are, in `decision_order`'s order."""
    import random

    rows = list(range(size))
    if epoch == 0:
        return rows
    batches = [rows[i:i + micro_batch] for i in range(0, size, micro_batch)]
    tail = batches.pop() if len(batches[-1]) < micro_batch else []
    random.Random(f"kto-epoch:{seed}:{epoch}").shuffle(batches)
    return [i for batch in batches + [tail] for i in batch]


class EpochShuffledMicroBatches(Sampler[int]):
    """The sampler for `epoch_order`: the trainer (through accelerate's data loader, sharded or
    not) tells it the epoch before each pass, also when a resumed run skips into one."""

    def __init__(self, size: int, micro_batch: int, seed: int):
        self.size, self.micro_batch, self.seed, self.epoch = size, micro_batch, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(epoch_order(self.size, self.micro_batch, self.seed, self.epoch))

    def __len__(self) -> int:
        return self.size
