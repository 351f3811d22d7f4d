"""The order a training run reads its examples in: a function of the run's seed, its micro-batch
and the epoch alone, so that a run resumed in its nth epoch, in any number of processes, reads
what the uninterrupted run read. (transformers' length-grouped sampler draws each epoch's order
from the process's random state, which a run resumed mid-epoch restores only after drawing it:
from the second epoch on, it would skip into another order.)
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from torch.utils.data import Sampler


def micro_batch_order(lengths: list[int], micro_batch: int, seed: int, grouped: bool) -> list[int]:
    """A seeded shuffle of the examples; `grouped`, grouped by length as transformers' own
    length grouping groups them (random groups of up to 50 micro-batches, sorted within), so that
    a padded micro-batch pads little, and then the micro-batches are shuffled, so that each
    optimizer step still mixes examples of every length. The micro-batch holding the longest
    example comes first (a batch too large for the device fails at once) and a partial one last
    (the others keep their boundaries)."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    generator = torch.Generator().manual_seed(seed)
    if not grouped:
        return torch.randperm(len(lengths), generator=generator).tolist()
    order = get_length_grouped_indices(lengths, micro_batch, generator=generator)
    return shuffled_micro_batches(order, micro_batch, generator, keep_first=True)  # transformers put the longest there


def shuffled_micro_batches(order: list[int], micro_batch: int, generator: Any, keep_first: bool = False) -> list[int]:
    """`order` cut into micro-batches, the whole ones shuffled with `generator` (but the first,
    with `keep_first`) and the partial one last, so that the others keep their boundaries."""
    import torch

    batches = [order[i:i + micro_batch] for i in range(0, len(order), micro_batch)]
    tail = batches.pop() if len(batches[-1]) < micro_batch else []
    head, rest = (batches[:1], batches[1:]) if keep_first else ([], batches)
    shuffled = [rest[b] for b in torch.randperm(len(rest), generator=generator).tolist()]
    return [i for batch in head + shuffled + [tail] for i in batch]


def order_seed(config: Any) -> int:
    return config.seed if config.data_seed is None else config.data_seed


def epoch_seed(seed: int, epoch: int) -> int:
    """A seed for each epoch of a run, unrelated to the next run's (seed + 1)."""
    return int.from_bytes(hashlib.sha256(f"epoch:{seed}:{epoch}".encode()).digest()[:7], "big")


def length_grouped_epoch(lengths: list[int], micro_batch: int, seed: int, epoch: int) -> list[int]:
    return micro_batch_order(lengths, micro_batch, epoch_seed(seed, epoch), grouped=True)


def whole_micro_batch_epoch(size: int, micro_batch: int, seed: int, epoch: int) -> list[int]:
    """The rows epoch `epoch` reads of a dataset already in order whose micro-batches must stay
    whole: the first epoch reads them as they are, a later one shuffles the micro-batches (the
    partial one last: the others keep their boundaries)."""
    import torch

    rows = list(range(size))
    if epoch == 0:
        return rows
    return shuffled_micro_batches(rows, micro_batch, torch.Generator().manual_seed(epoch_seed(seed, epoch)))


class EpochOrder(Sampler[int]):
    """A sampler whose order is `order(epoch)`: the trainer (through accelerate's data loader,
    sharded between processes or not) tells it the epoch before each pass, also when a resumed
    run skips into one."""

    def __init__(self, order: Callable[[int], list[int]], size: int):
        self.order, self.size, self.epoch = order, size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(self.order(self.epoch))

    def __len__(self) -> int:
        return self.size


def read_in(trainer: Any, order: EpochOrder) -> None:
    """Have `trainer` read its training data in `order`: the trainer asks `_get_train_sampler`
    for the sampler each time it builds its data loader."""
    trainer._get_train_sampler = lambda *args, **kwargs: order
