"""How much of a padded RFT batch is sequence rather than padding, for random micro-batches and
for length-grouped ones (`order.micro_batch_order`, which RFT uses by default for padded batches
of more than one sequence), on the expert teacher's trajectories; and the same for KTO's
decisions in the orders KTO can read them in (the same function), with how many micro-batches
hold a single attempt's decisions or a single label. Prints JSON.

    python benchmarks/padding.py [--trajectories .gpu/trajectories.jsonl] [--batches 2,4,8] [--seeds 5]

A padded batch costs its longest sequence times its size in every matrix product, so on a
device where the step's time follows the padded tokens, tokens/s moves with this fraction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=Path, default=None,
                        help="a kit's trajectories (benchmarks/gpu_kit.py); default: run the teacher here")
    parser.add_argument("--tasks", default="builtin:research,builtin:data,builtin:code")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--batches", default="2,4,8", help="micro-batch sizes")
    parser.add_argument("--seeds", type=int, default=5, help="orders drawn per sampler")
    args = parser.parse_args(argv)

    from toolself.models.weights import default_model_dir
    from toolself.train.kernels import sequence_share
    from toolself.train.order import micro_batch_order
    from train_gpu import TOKENIZER, carried_attempts, datasets, teacher_attempts

    if args.trajectories:
        attempts, schemas = carried_attempts(args.trajectories)
        tokenizer = args.trajectories.parent / TOKENIZER
    else:
        attempts, schemas = teacher_attempts([s for s in args.tasks.split(",") if s], args.limit)
        tokenizer = default_model_dir()
    sft, kto = datasets(tokenizer, attempts, schemas, args.max_length, kto=True)
    lengths = [len(ids) for ids in sft["input_ids"]]
    report: dict[str, Any] = {"sequences": len(lengths), "mean_length": round(statistics.mean(lengths), 1),
                              "max_length": max(lengths), "batches": {}}
    for batch in (int(b) for b in args.batches.split(",")):
        random, grouped = [], []
        for seed in range(args.seeds):
            random.append(sequence_share(lengths, micro_batch_order(lengths, batch, seed, grouped=False), batch))
            grouped.append(sequence_share(lengths, micro_batch_order(lengths, batch, seed, grouped=True), batch))
        report["batches"][batch] = {"random": round(statistics.mean(random), 3),
                                    "length_grouped": round(statistics.mean(grouped), 3)}
    report["kto"] = kto_orders(kto, [int(b) for b in args.batches.split(",")], args.seeds)
    print(json.dumps(report, indent=2))
    return report


def kto_orders(kto: Any, batches: list[int], seeds: int) -> dict[str, Any]:
    """KTO's decisions cut into micro-batches in the builder's order (each attempt's decisions
    together), shuffled, and shuffled in length groups: the share of sequence, and the share of
    micro-batches whose decisions all come from one attempt or all carry one label."""
    from toolself.train.kernels import sequence_share
    from toolself.train.kto import decision_lengths
    from toolself.train.order import micro_batch_order

    lengths = decision_lengths(kto)
    attempts, labels = kto["trajectory_id"], kto["label"]

    def measure(order: list[int], batch: int) -> dict[str, float]:
        chunks = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
        return {"sequence": sequence_share(lengths, order, batch),
                "one_attempt": sum(len({attempts[i] for i in c}) == 1 for c in chunks) / len(chunks),
                "one_label": sum(len({labels[i] for i in c}) == 1 for c in chunks) / len(chunks)}

    report: dict[str, Any] = {"decisions": len(lengths), "attempts": len(set(attempts)),
                              "desirable": sum(map(bool, labels)), "mean_length": round(statistics.mean(lengths), 1),
                              "batches": {}}
    for batch in batches:
        runs: dict[str, list[dict[str, float]]] = {"as_built": [measure(list(range(len(lengths))), batch)]}
        for seed in range(seeds):
            runs.setdefault("shuffled", []).append(measure(micro_batch_order(lengths, batch, seed, False), batch))
            runs.setdefault("length_grouped", []).append(measure(micro_batch_order(lengths, batch, seed, True), batch))
        report["batches"][batch] = {order: {k: round(statistics.mean(m[k] for m in ms), 3) for k in ms[0]}
                                    for order, ms in runs.items()}
    return report


if __name__ == "__main__":
    main()
