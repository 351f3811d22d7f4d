"""A CAT pipeline's model on its held-out tasks, with engine options side by side: prints JSON.

    python benchmarks/heldout_eval.py --model runs/cat-study/toolself/seed-2/rft \
        [--runs alone-on,alone-off,batched-on,batched-off] [--out runs/heldout-eval]

Each run evaluates the model as the CAT pipeline does (the demo recipe's budgets, dtype and
held-out tasks) with jump-forward on or off:

- `alone`: the `data` suite's held-out tasks one attempt at a time, so that every decode step
  has one row (an agent run by `toolself run`);
- `batched`: every suite's held-out tasks 8 at a time (the pipeline's own evaluation).

The runs go one after the other in this process, so compare them within one invocation. For
each: wall seconds, success per suite, the engine's counters (decode steps, rows, forced
tokens, prefill and decode seconds), and per attempt the completion tokens and the answer, so
that runs whose greedy replies came out the same can be told from runs that did different work.
Needs the model folder of a finished CAT run (`make cat-demo` writes one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

RUNS = ("alone-on", "alone-off", "batched-on", "batched-off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a CAT run's model folder (an RFT or KTO adapter)")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {', '.join(RUNS)}")
    parser.add_argument("--out", default="runs/heldout-eval", help="runner folders, replaced on every invocation")
    args = parser.parse_args()
    runs = args.runs.split(",")
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; choose from {list(RUNS)}")
    if not Path(args.model).is_dir():
        parser.error(f"{args.model} is not a folder; give the model folder of a finished CAT run")

    from toolself.evals.records import read_records
    from toolself.evals.runner import run_eval
    from toolself.models import local
    from toolself.train.pipeline import agent_overrides
    from toolself.train.study import demo_preset

    cat = demo_preset().pipeline("toolself", 0)
    out: dict = {"model": args.model, "cpus": len(os.sched_getaffinity(0)),
                 "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "runs": {}}
    for run in runs:
        kind, mode = run.split("-")
        folder = Path(args.out) / run
        shutil.rmtree(folder, ignore_errors=True)
        model = local.EmbeddedModel.load(args.model, dtype=cat.dtype, jump_forward=mode == "on")
        tasks, concurrency = (["builtin:data"], 1) if kind == "alone" else (cat.eval_tasks, cat.concurrency)
        try:
            start = time.perf_counter()
            summary = run_eval(tasks, ["toolself"], model, folder, split="heldout", limit=cat.eval_limit,
                               seed=cat.eval_seed, concurrency=concurrency, timeout=cat.timeout,
                               settings=agent_overrides(cat))
            wall = time.perf_counter() - start
            stats = dict(model.engine.stats)
        finally:
            model.close()
        records = sorted(read_records(folder / "toolself"), key=lambda r: r.task_id)
        out["runs"][run] = {
            "wall_s": round(wall, 1),
            "success": {k: v["accuracy"] for k, v in summary.accuracy()["toolself"].items()},
            "engine": {k: round(v, 2) if isinstance(v, float) else v for k, v in stats.items()},
            "attempts": [{"task": r.task_id, "completion_tokens": r.completion_tokens, "answer": r.answer,
                          "correct": r.correct} for r in records],
        }
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
