"""Rebuild the shipped `embedded:cat` adapter: `make embedded-cat` (TOOLSELF_SUITE_KEY=public).

The ToolSelf arm of `toolself train study --preset demo`, seed 0, up to RFT: the expert
teacher's successes on 36 training tasks of research, data and code, then RFT with the demo
recipe. KTO is left out because on this recipe it changed no held-out outcome with any seed
(docs/results/cat-cpu.md). The zero-shot student and the adapter are then evaluated as the
study evaluates (greedy, the first 4 held-out tasks of every built-in suite), and the adapter
is copied into the package with provenance.json: the command, commit, seed, suite key,
training data, recipe and the held-out scores measured here.

    python scripts/build_embedded_cat.py [--out runs/embedded-cat]   # resumable: rerun to continue
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "toolself" / "data" / "adapters" / "embedded-cat"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
COMMAND = "TOOLSELF_SUITE_KEY=public make embedded-cat"
EVALUATED = ("student", "rft")


def settings():
    from toolself.train.study import demo_preset

    return replace(demo_preset().pipeline("toolself", 0), evaluate=EVALUATED)


def train(out: Path) -> dict:
    from toolself.train.pipeline import run_cat

    return run_cat(settings(), out, stop_after="rft", echo=lambda line: print(line, flush=True), isolate=True)


def evaluate_both(out: Path) -> dict[str, dict[str, float]]:
    """Each model on the held-out split in a process of its own, as the pipeline's evaluate step
    runs them (the runner resumes finished attempts)."""
    from toolself.train.pipeline import evaluate, isolated, student_spec

    cat = settings()
    models = {"student": student_spec(cat), "rft": f"local:{out / 'rft'}"}
    scores = {}
    for name in EVALUATED:
        print(f"[evaluate {name}] running", flush=True)
        summary = isolated(evaluate, cat, models[name], out / "eval" / name)
        scores[name] = summary.accuracy().get(cat.method, {})
        print(f"[evaluate {name}] {json.dumps(scores[name])}", flush=True)
    return scores


def per_task(out: Path, name: str) -> dict[str, bool]:
    from toolself.evals.records import read_records

    return {f"{r.dataset}/{r.task_id}": bool(r.success) for r in read_records(out / "eval" / name / "toolself")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    return head.stdout.strip()


def provenance(out: Path, steps: dict, scores: dict) -> dict:
    from toolself.evals.suites.common import KEY_VARIABLE

    cat = settings()
    config = json.loads((out / "rft" / "adapter_config.json").read_text(encoding="utf-8"))
    return {
        "name": "embedded:cat",
        "command": COMMAND,
        "commit": commit(),
        "seed": cat.seed,
        "suite_key": os.environ.get(KEY_VARIABLE, ""),
        "base_model": config["base_model_name_or_path"],
        "lora": {"r": config["r"], "lora_alpha": config["lora_alpha"],
                 "target_modules": sorted(config["target_modules"]),
                 "layers_to_transform": config.get("layers_to_transform")},
        "training_data": {"suites": cat.tasks, "split": "train", "tasks_per_suite": cat.limit,
                          "teacher": cat.teacher, "teacher_samples": cat.teacher_samples,
                          "collected": steps["collect_teacher"], "sft": steps["data_sft"]},
        "recipe": {"stages": "RFT only (the study's KTO changed no held-out outcome)", "rft": cat.rft,
                   "max_length": cat.max_length, "agent": cat.agent, "dtype": cat.dtype},
        "rft_result": {k: v for k, v in steps["rft"].items() if k not in ("log", "adapter", "output_dir")},
        "heldout": {"suites": cat.eval_tasks, "tasks_per_suite": cat.eval_limit, "seed": cat.eval_seed,
                    "decoding": "greedy", "timeout_s": cat.timeout, "concurrency": cat.concurrency,
                    "success_rate": {"zero-shot": scores["student"], "cat": scores["rft"]},
                    "tasks": {"zero-shot": per_task(out, "student"), "cat": per_task(out, "rft")}},
        "files": {name: sha256(out / "rft" / name) for name in ADAPTER_FILES},
    }


def ship(out: Path, record: dict) -> None:
    SHIPPED.mkdir(parents=True, exist_ok=True)
    for name in ADAPTER_FILES:
        shutil.copyfile(out / "rft" / name, SHIPPED / name)
    (SHIPPED / "provenance.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/embedded-cat"), help="Work folder (resumable).")
    parser.add_argument("--train-only", action="store_true", help="Stop after RFT.")
    args = parser.parse_args(argv)
    from toolself.evals.suites.common import KEY_VARIABLE

    if os.environ.get(KEY_VARIABLE) != "public":
        print(f"set {KEY_VARIABLE}=public: the shipped adapter is trained and scored on the published tasks",
              file=sys.stderr)
        return 2
    steps = train(args.out)
    if args.train_only:
        return 0
    scores = evaluate_both(args.out)
    ship(args.out, provenance(args.out, steps, scores))
    print(f"shipped {SHIPPED.relative_to(ROOT)}: zero-shot {scores['student']}, CAT {scores['rft']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
