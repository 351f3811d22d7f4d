"""What the processes of a launched training run (torchrun, accelerate launch) must agree on.

Every function here is a collective: each process of the run calls it at the same point, or
the run waits forever. Alone (no process group, or a group of one) they cost nothing.
"""

from __future__ import annotations

from typing import Any


def process_count() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def same_on_every_process(flag: bool, device: Any) -> bool:
    """Process 0's `flag`, on every process. Saving is collective (ZeRO and FSDP gather their
    shards to save), so processes whose clocks disagreed would wait for each other forever."""
    if process_count() == 1:
        return flag
    import torch
    import torch.distributed as dist

    value = torch.tensor([int(flag)], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item())


def summed_over_processes(counts: list[int], device: Any) -> list[int]:
    """Each of `counts` summed over the processes: each process sees only its shard of every
    batch, and shards differ in length, so one process's count times their number is not the run's."""
    return _all_reduced(counts, "SUM", device)


def least_over_processes(value: int, device: Any) -> int:
    """The smallest of the processes' `value`s, on every process."""
    return _all_reduced([value], "MIN", device)[0]


def most_over_processes(value: int, device: Any) -> int:
    """The largest of the processes' `value`s, on every process."""
    return _all_reduced([value], "MAX", device)[0]


def _all_reduced(values: list[int], op: str, device: Any) -> list[int]:
    if process_count() == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    reduced = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(reduced, op=getattr(dist.ReduceOp, op))
    return [int(v) for v in reduced.tolist()]
