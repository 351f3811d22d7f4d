"""Training throughput of CAT's two stages on the embedded model, on this machine.

    python benchmarks/train.py [--steps 3] [--max-length 512] [--batch-size 2]
    python benchmarks/train.py --compare [--steps 4] [--max-length 2048] [--setups before,default,...]

Each stage runs in its own process (so each peak memory is its own): RFT (SFTTrainer + LoRA)
and KTO (KTOTrainer + LoRA, reference = the adapter-disabled model) on examples built from the
expert teacher's trajectories on built-in research tasks, cut to `--max-length` tokens. Prints
one JSON object: tokens per second (real, unpadded tokens of the trained sequences; KTO's extra
KL sequences are reported apart), seconds, and peak resident memory (ru_maxrss) per stage.

`--compare` runs the set-ups side by side on the same sequences: for RFT, `before` (fp32,
gradient checkpointing, TRL's tiled head over every position, 2 sequences per step), `default`
(this machine's defaults: bf16 where the CPU has it, the compact head, 1 sequence per step
without recomputation) and `default` with adapters on the top 12, 6 or 4 layers only; then two
epochs over half the sequences with and without the frozen-layer cache; for KTO, adapters on the
top 12 layers with and without recomputing the forward pass (`--batch-size` decisions per step).
`recipe+eager` and `recipe+compiled` are the CAT recipe's RFT (adapters on the top 12 layers,
two epochs) without and with its decoder layers compiled; compiling happens in the first step,
so each set-up also reports the throughput of the steps after it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def trajectories():
    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool

    pool = default_pool()
    return scored_attempts("builtin:research?hops=2", limit=6, noises=(0.0, 1.0), pool=pool), pool


SETUPS = {
    "before": {"bf16": False, "gradient_checkpointing": True, "per_device_train_batch_size": 2, "tiled_head": True,
               "compile_layers": False},
    "default": {"per_device_train_batch_size": 1},
    "default+lora_layers=12": {"per_device_train_batch_size": 1, "lora_layers": 12},
    "default+lora_layers=6": {"per_device_train_batch_size": 1, "lora_layers": 6},
    "default+lora_layers=4": {"per_device_train_batch_size": 1, "lora_layers": 4},
    # two passes over half as many sequences: the second pass is where the frozen-layer cache pays
    "default+lora_layers=12+2_epochs+no_cache": {"per_device_train_batch_size": 1, "lora_layers": 12, "epochs": 2,
                                                 "cache_frozen_layers": False},
    "default+lora_layers=12+2_epochs": {"per_device_train_batch_size": 1, "lora_layers": 12, "epochs": 2},
    # the CAT recipe's RFT without and with its decoder layers compiled (compiling is in the first step)
    "recipe+eager": {"per_device_train_batch_size": 1, "lora_layers": 12, "epochs": 2, "compile_layers": False},
    "recipe+compiled": {"per_device_train_batch_size": 1, "lora_layers": 12, "epochs": 2, "compile_layers": True},
    "default+lora_layers=4+2_epochs+no_cache": {"per_device_train_batch_size": 1, "lora_layers": 4, "epochs": 2,
                                                "cache_frozen_layers": False},
    "default+lora_layers=4+2_epochs": {"per_device_train_batch_size": 1, "lora_layers": 4, "epochs": 2},
    # KTO: micro-batches of two decisions (its KL estimate needs pairs), with and without recomputation
    "kto+lora_layers=12+checkpointing": {"lora_layers": 12, "activation_checkpointing": True},
    "kto+lora_layers=12": {"lora_layers": 12, "activation_checkpointing": False},
}


def stage_of(setup: str) -> str:
    """Which trainer a set-up runs: its name says so."""
    return "kto" if setup.startswith("kto") else "rft"


def phase(name: str, steps: int, max_length: int, batch_size: int, setup: str | None = None) -> dict:
    from transformers import AutoTokenizer

    from toolself.models.weights import default_model_dir
    from toolself.train import data as D

    student = default_model_dir()
    found, pool = trajectories()
    renderer = D.Renderer(AutoTokenizer.from_pretrained(str(student)), D.tool_schemas(pool))
    common = dict(max_steps=steps, per_device_train_batch_size=batch_size, gradient_accumulation_steps=1,
                  warmup_steps=0, disable_tqdm=True)
    epochs = 1
    if setup is not None:
        options = dict(SETUPS[setup])
        if options.pop("tiled_head", False):
            import toolself.train.compact_head as compact

            compact.use_compact_head = lambda model: False  # read by the trainer at call time
        epochs = options.pop("epochs", 1)
        common.update(options)
        common["max_steps"] = max(1, steps // common["per_device_train_batch_size"])
        batch_size = common["per_device_train_batch_size"]
    with tempfile.TemporaryDirectory() as tmp:
        if name == "rft":
            from toolself.train.rft import train_rft
            from toolself.train.rft_config import RFTConfig

            dataset, _ = D.build_sft_dataset(found, renderer, max_length=max_length)
            dataset = dataset.select(range(min(len(dataset), max(1, common["max_steps"] * batch_size // epochs))))
            result = train_rft(dataset, student, Path(tmp) / "out", RFTConfig(output_dir=tmp + "/ck", **common))
        else:
            from toolself.train.kto import train_kto
            from toolself.train.kto_config import CATKTOConfig

            dataset, _, _ = D.build_kto_dataset(found, renderer, max_length=max_length)
            dataset = dataset.select(range(min(len(dataset), steps * batch_size)))
            result = train_kto(dataset, student, Path(tmp) / "out",
                               CATKTOConfig(output_dir=tmp + "/ck", max_length=max_length, **common))
        steps_logged = [r for r in map(json.loads, open(result.log)) if r.get("event") == "log" and "tokens" in r]
    lengths = [len(x) for x in dataset["input_ids"]] if name == "rft" else \
        [len(p) + len(c) for p, c in zip(dataset["prompt_ids"], dataset["completion_ids"])]
    return {"steps": result.steps, "examples": len(dataset), "mean_sequence_tokens": round(sum(lengths) / len(lengths), 1),
            "tokens": result.tokens, "kl_tokens": result.extra.get("kl_tokens"), "train_seconds": result.seconds,
            "tokens_per_second": result.tokens_per_second, "final_loss": result.train_loss,
            "frozen_layer_cache": result.extra.get("frozen_layer_cache"),
            "compiled_layers": result.extra.get("compiled_layers"), **after_first_step(steps_logged),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def after_first_step(logged: list[dict]) -> dict:
    """The first step's seconds (where compiling happens) and the throughput of the steps after it."""
    if len(logged) < 2:
        return {}
    first, last = logged[0], logged[-1]
    return {"first_step_seconds": first["elapsed"],
            "later_steps_tokens_per_second": round((last["tokens"] - first["tokens"])
                                                   / (last["elapsed"] - first["elapsed"]), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="RFT in several set-ups side by side")
    parser.add_argument("--setups", default=",".join(SETUPS), help="which set-ups --compare runs, comma-separated")
    parser.add_argument("--phase", choices=["rft", "kto"], help=argparse.SUPPRESS)
    parser.add_argument("--setup", choices=list(SETUPS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.steps, args.max_length, args.batch_size, args.setup)))
        return
    import torch

    report = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                          "python": platform.python_version(), "torch": torch.__version__,
                          "device": "cuda" if torch.cuda.is_available() else "cpu"},
              "settings": {"steps": args.steps, "max_length": args.max_length, "batch_size": args.batch_size,
                           "lora": "r=16, alpha=32, all linear layers", "model": "SmolLM2-135M-Instruct (fp32)"}}
    setups = [s for s in args.setups.split(",") if s]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        parser.error(f"unknown set-up(s) {', '.join(unknown)}; choose from {', '.join(SETUPS)}")
    runs = [(s, stage_of(s), ["--setup", s]) for s in setups] if args.compare else [(n, n, []) for n in ("rft", "kto")]
    for key, name, extra in runs:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--phase", name, "--steps", str(args.steps),
                               "--max-length", str(args.max_length), "--batch-size", str(args.batch_size), *extra],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            report[key] = {"error": done.stderr[-2000:]}
            continue
        report[key] = json.loads(done.stdout.strip().splitlines()[-1])
        report[key]["wall_seconds"] = round(time.perf_counter() - started, 1)
    for stage in ("rft", "kto") if args.compare else ():
        group = [s for s in setups if stage_of(s) == stage and "tokens_per_second" in report[s]]
        if group:
            base = report[group[0]]["tokens_per_second"]
            report[f"speedup_over_{group[0]}"] = {s: round(report[s]["tokens_per_second"] / base, 2) for s in group}
            later = report[group[0]].get("later_steps_tokens_per_second")
            if later:
                report[f"speedup_after_the_first_step_over_{group[0]}"] = {
                    s: round(report[s]["later_steps_tokens_per_second"] / later, 2) for s in group}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
