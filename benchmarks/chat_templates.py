"""What a student's chat template costs RFT: the expert teacher's successful trajectories on the
built-in suites rendered for the default model's template and for Qwen3's (the copy TRL ships),
on the default tokenizer (both are ChatML). Prints JSON: sequences, the tokens training reads,
the loss tokens, and the decisions that could not continue the sequence before them.

    python benchmarks/chat_templates.py [--tasks builtin:research,builtin:data,builtin:code] [--limit 24]

Qwen3's template drops an empty `<think>` block from every reply but the last, so a reply
renders differently once a turn follows it and no decision extends the one before: each is
trained on a copy of its whole context. A step's time follows the tokens it reads, so the
ratio of sequence tokens is the ratio of RFT's time per epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="builtin:research,builtin:data,builtin:code")
    parser.add_argument("--limit", type=int, default=24, help="tasks per suite")
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--tokenizer", type=Path, help="also a student's own tokenizer and template (a model folder, "
                        "e.g. Qwen3-8B's): whether its special tokens change the count")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from toolself.models.weights import default_model_dir
    from toolself.train import data as D
    from train_gpu import teacher_attempts

    attempts, schemas = teacher_attempts([s for s in args.tasks.split(",") if s], args.limit)
    report: dict[str, Any] = {"tasks": args.tasks, "limit": args.limit, "templates": {}}
    qwen3 = (files("trl") / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")
    rows = [("default (SmolLM2)", default_model_dir(), None), ("qwen3", default_model_dir(), qwen3)]
    if args.tokenizer:
        rows.append((f"{args.tokenizer.name} (its own tokenizer)", args.tokenizer, None))
    for name, folder, template in rows:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if template is not None:
            tokenizer.chat_template = template
        dataset, stats = D.build_sft_dataset(attempts, D.Renderer(tokenizer, schemas), args.max_length)
        report["templates"][name] = {
            "trajectories": stats.trajectories, "decisions": stats.decisions, "sequences": len(dataset),
            "sequence_tokens": sum(len(ids) for ids in dataset["input_ids"]),
            "loss_tokens": sum(sum(label != D.IGNORE for label in labels) for labels in dataset["labels"]),
            "unpacked": stats.unpacked, "reread_tokens": stats.reread_tokens}
    default, qwen3 = list(report["templates"].values())[:2]
    report["qwen3_over_default_sequence_tokens"] = round(qwen3["sequence_tokens"] / default["sequence_tokens"], 2)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
