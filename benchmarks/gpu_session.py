"""Everything that needs a GPU, in one command that fits a short session on a GPU machine: the kernel
checks, then training and decoding on the named shapes, each run with a time limit taken from
one budget, most important first. Each run's JSON lands in OUT as it is measured; the log of
all of them in OUT/session.log; a table of the results against the bars is printed last.

    make gpu-kit                       # here: wheels the GPU image lacks + the teacher's attempts, in .gpu/
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-packages .gpu/wheels/*.whl \\
      && PYTHONPATH=/tmp/site-packages python3 benchmarks/gpu_session.py --kit .gpu --out results --budget 480
    python benchmarks/gpu_session.py --kit KIT --out DIR --miniature   # the same runs, tiny, on a CPU (CI)

The kit carries the expert teacher's attempts (so the GPU machine needs neither the sandbox nor
the default model's weights) and the tokenizer; see `make gpu-kit`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent

# The bars, on one H200 (docs/training.md).
BARS = {("qwen3-8b", "rft"): 6500, ("qwen3-8b", "kto"): 5000, ("smollm2-135m", "rft"): 100_000}
DECODE_SPEEDUP_BAR = 5.0


@dataclass
class Run:
    name: str
    script: str
    args: list[str]
    limit: float  # seconds, at most
    gpu_only: bool = False


# Most important first: the budget cuts the last. The 135M shape runs the study's recipe (top
# 12 layers, the frozen-layer cache under checkpointing: the first GPU run's crash).
RUNS = [
    Run("checks", "gpu_checks.py", [], 90),
    Run("smollm2-135m", "train_gpu.py", ["--shape", "smollm2-135m", "--steps", "40", "--liger", "off"], 100),
    Run("qwen3-8b", "train_gpu.py", ["--shape", "qwen3-8b", "--steps", "10", "--lora-layers", "0", "--liger", "off"],
        300),
    Run("qwen3-8b-flex", "train_gpu.py", ["--shape", "qwen3-8b", "--steps", "10", "--lora-layers", "0", "--liger",
                                          "off", "--attention", "flex_attention", "--parts", "rft"], 150,
        gpu_only=True),
    Run("qwen3-8b-liger", "train_gpu.py", ["--shape", "qwen3-8b", "--steps", "10", "--lora-layers", "0", "--liger",
                                           "on", "--parts", "rft"], 120, gpu_only=True),
]
MINIATURE = {"--shape": "tiny", "--steps": "1"}


def miniature_args(args: list[str]) -> list[str]:
    """The same options with a tiny shape, one short step, no compiling and short replies."""
    return ([MINIATURE.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
            + ["--decode-tokens", "8", "--max-length", "512", "--accumulation", "1", "--compile-layers", "off"])


def run_one(run: Run, kit: Path, out: Path, work: Path, limit: float, miniature: bool, log) -> dict[str, Any]:
    """Run one measurement in its own process group, killed whole at `limit` seconds; what it
    wrote to its JSON by then is kept."""
    result_path = out / f"{run.name}.json"
    args = miniature_args(run.args) if miniature and run.script == "train_gpu.py" else run.args
    command = [sys.executable, str(BENCHMARKS / run.script), "--trajectories", str(kit / "trajectories.jsonl"),
               "--json", str(result_path)] + args
    if run.script == "train_gpu.py":
        command += ["--out", str(work / run.name), "--models", str(work / "models")]
    log.write(f"\n=== {run.name}: {' '.join(command)} (limit {limit:.0f} s)\n")
    log.flush()
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = "timeout"
    seconds = round(time.perf_counter() - start, 1)
    log.write(f"=== {run.name}: exit {code} after {seconds} s\n")
    log.flush()
    report = json.loads(result_path.read_text()) if result_path.is_file() else {}
    return {"exit": code, "seconds": seconds, "report": report}


REQUIRED = ["torch", "transformers", "peft", "accelerate", "trl", "datasets", "pydantic", "xgrammar"]
OPTIONAL = ["liger_kernel", "flash_attn", "pyarrow", "typing_extensions"]


def preflight() -> tuple[dict[str, str], list[str]]:
    """The version of every package the runs import, and the required ones that do not import
    (so that a machine missing one says so in seconds, not after its budget)."""
    import importlib
    import importlib.metadata as md

    versions, broken = {}, []
    for name in REQUIRED + OPTIONAL:
        try:
            importlib.import_module(name)
            versions[name] = md.version(name.replace("_", "-"))
        except Exception as exc:  # an import that fails for any reason is what this reports
            versions[name] = f"not importable: {type(exc).__name__}: {exc}"[:200]
            if name in REQUIRED:
                broken.append(name)
    return versions, broken


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per run and stage, with the bar where the issue set one."""
    lines = [f"{'run':<16} {'part':<8} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9}  bar"]
    for name, result in results.items():
        if result["exit"] == "skipped":
            continue
        report = result.get("report", {})
        if name == "checks":
            verdicts = {k: ("ok" if v.get("ok") else v.get("error", "FAILED"))
                        for k, v in report.get("variants", {}).items()}
            lines.append(f"{name:<16} exit {result['exit']}: {verdicts or 'no report'}")
            loaded = report.get("adapter_load", {})
            if "error" in loaded:
                lines.append(f"{name:<16} local:ADAPTER {loaded['error']}")
            elif loaded:
                lines.append(f"{name:<16} local:ADAPTER on {loaded['device']} in {loaded['seconds']} s, host peak "
                             f"+{loaded['host_peak_growth_gib']} GiB for {loaded['weights_bytes_gib']} GiB of weights, "
                             f"{loaded['weights_differing_from_float32_merge']} weights off the float32 merge")
            continue
        shape = report.get("shape", name)
        for part in ("rft", "kto"):
            stage = report.get(part)
            if not stage:
                continue
            bar = BARS.get((shape, part))
            met = "" if bar is None else f"{'met' if stage['tokens_per_second'] >= bar else 'MISSED'} (>= {bar:,})"
            padded = stage.get("padding_efficiency")
            share = f", {padded:.0%} of the batches sequence" if padded else ""
            lines.append(f"{name:<16} {part:<8} {stage['tokens_per_second']:>10,.0f} {stage['mfu']:>6.1%} "
                         f"{stage['peak_memory_gib']:>9}  {met}{share}")
        decoding = report.get("decoding")
        if decoding:
            speedup = decoding.get("speedup_8_over_1") or 0
            met = "met" if speedup >= DECODE_SPEEDUP_BAR else "MISSED"
            bar = f"{met} (>= {DECODE_SPEEDUP_BAR}x on a GPU)" if report["device"]["device"] == "cuda" else ""
            same = "same reply batched" if decoding.get("batched_reply_matches_alone") else "reply differs batched"
            sampled = decoding.get("concurrent_8_sampled", {}).get("tokens_per_second", 0)
            lines.append(f"{name:<16} {'decode':<8} {decoding['concurrent_1']['tokens_per_second']:>10,.0f} "
                         f"x{speedup} at 8 ({sampled:,.0f} sampled), {same}, store "
                         f"{decoding.get('prefix_store_gib')} GiB, {decoding.get('engine_rows')} rows  {bar}")
        if result["exit"] != 0:
            lines.append(f"{name:<16} exit {result['exit']} after {result['seconds']} s (see session.log)")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, required=True, help="the folder `make gpu-kit` filled")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON files and session.log go")
    parser.add_argument("--budget", type=float, default=480, help="seconds for all runs together")
    parser.add_argument("--work", type=Path, default=Path("/tmp/toolself-gpu-session"),
                        help="models and checkpoints (an 8B shape takes ~32 GB of disk)")
    parser.add_argument("--only", default=None, help="comma-separated run names (default: all)")
    parser.add_argument("--miniature", action="store_true", help="tiny shapes and one step: the script's own test")
    args = parser.parse_args(argv)

    import torch

    if not (args.kit / "trajectories.jsonl").is_file():
        parser.error(f"{args.kit} holds no trajectories.jsonl: run `make gpu-kit` first")
    cuda = torch.cuda.is_available()
    args.out.mkdir(parents=True, exist_ok=True)
    versions, broken = preflight()
    print(json.dumps(versions, indent=1), flush=True)
    if broken:
        (args.out / "summary.json").write_text(json.dumps({"versions": versions, "broken": broken}, indent=2) + "\n")
        raise SystemExit(f"cannot import {', '.join(broken)}: install the kit's wheels (see this script's help)")
    wanted = set(args.only.split(",")) if args.only else None
    deadline = time.monotonic() + args.budget
    results: dict[str, dict[str, Any]] = {}
    with open(args.out / "session.log", "a", encoding="utf-8") as log:
        for run in RUNS:
            if wanted is not None and run.name not in wanted:
                continue
            left = deadline - time.monotonic()
            if run.gpu_only and not cuda:
                results[run.name] = {"exit": "skipped", "seconds": 0, "reason": "needs a CUDA GPU"}
            elif left < 20:
                results[run.name] = {"exit": "skipped", "seconds": 0, "reason": "out of budget"}
            else:
                results[run.name] = run_one(run, args.kit, args.out, args.work, min(run.limit, left), args.miniature,
                                            log)
    summary = {"gpu": torch.cuda.get_device_name(0) if cuda else None, "versions": versions,
               "budget": args.budget, "runs": {k: {"exit": v["exit"], "seconds": v["seconds"],
                                                                 **({"reason": v["reason"]} if "reason" in v else {})}
                                                             for k, v in results.items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print("\n".join(table(results)))
    for name, result in results.items():
        if "reason" in result:
            print(f"{name}: skipped ({result['reason']})")
    return results


if __name__ == "__main__":
    main()
