"""CAT's training and decoding on this machine's accelerator, on a random-initialised model of a
named shape: tokens per second, estimated MFU, peak memory, versions and the device.

    python benchmarks/train_gpu.py --shape qwen3-8b [--steps 20] [--tasks builtin:research,...]
    python benchmarks/train_gpu.py --shape tiny --steps 1          # on a CPU, in CI
    python benchmarks/train_gpu.py --save-trajectories KIT/t.jsonl # the teacher's attempts, to carry
    python benchmarks/train_gpu.py --trajectories KIT/t.jsonl ...  # elsewhere: no teacher, no weights

The trajectories are the expert teacher's scored attempts at built-in tasks (real agent loop,
real tools, real scorer; noise makes some fail), rendered with the default tokenizer. A GPU
machine without the sandbox's privileges or the default model's weights gets them as a file,
with the tool schemas and the tokenizer beside it (`--save-trajectories` writes all three;
benchmarks/gpu_session.py runs this script from such a kit). RFT and KTO run through
`train_rft` / `train_kto` with the recipe's settings (`--lora-layers`, the frozen-layer cache,
gradient checkpointing, kernels chosen for the device), as the pipeline calls them; decoding
runs the embedded engine with 1 and 8 concurrent requests. Prints one JSON object.

MFU = achieved FLOP/s / the device's peak, measured here as the rate of a large matrix product
in the training dtype (so a GPU's number is against what its tensor cores deliver, not the
datasheet). FLOPs per trained token, with N the parameters a token passes through (the
embedding table excluded, the output head included) and N_a those at and above the lowest
adapted layer: full fine-tuning 6N; LoRA 2N (forward) + 2 N_a (gradients of the activations:
LoRA has no weight gradients worth counting) + 2 N_a again when gradient checkpointing
recomputes the forward. KTO adds a forward of its reference (2N per token) and forwards of the
policy and the reference over its KL pairs (2 x 2N per KL token). Attention's own FLOPs are
left out (under 5% at these lengths), so the MFU is a slight underestimate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def device_info() -> dict[str, Any]:
    import torch

    from toolself.models.cores import cpu_name, usable_cores

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {"device": "cuda", "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "cuda": torch.version.cuda}
    return {"device": "cpu", "name": cpu_name(), "cores": usable_cores()}


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "peft", "flash-attn", "liger-kernel"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def measured_peak_flops(dtype) -> float:
    """FLOP/s of a large square matrix product in `dtype` on the device (the best of a few)."""
    import torch

    cuda = torch.cuda.is_available()
    n = 8192 if cuda else 1024
    device = "cuda" if cuda else "cpu"
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(4 if cuda else 1):
            a @ b
        if cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / (4 if cuda else 1))
    return 2 * n**3 / best


def best_peak(peak: float, dtype, report: dict[str, Any]) -> float:
    """The peak measured again after a stage, the best kept (and reported): on a shared machine
    busy during one measurement, the stage that ran after it would show more than 100% MFU."""
    peak = max(peak, measured_peak_flops(dtype))
    report["peak_tflops_measured"] = round(peak / 1e12, 2)
    return peak


def parameter_counts(model_dir: Path, lora_layers: int) -> tuple[int, int]:
    """(N, N_a): parameters a token passes through (embedding table excluded, head included),
    and those at and above the lowest adapted layer (all of them when every layer is adapted)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(model_dir))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    attention = c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    layer = attention + 3 * c.hidden_size * c.intermediate_size
    head = c.hidden_size * c.vocab_size
    adapted = lora_layers or c.num_hidden_layers
    return c.num_hidden_layers * layer + head, adapted * layer + head


def peak_memory_gib() -> float:
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # resident set, the process's


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


TOKENIZER = "tokenizer"


def teacher_attempts(tasks: list[str], limit: int) -> tuple[list[Any], dict[str, Any]]:
    """The expert teacher's scored attempts at the first `limit` tasks of each spec, twice (with
    and without noise), and the schemas of the tools they ran with."""
    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool
    from toolself.train.data import tool_schemas

    pool = default_pool()
    attempts = [t for spec in tasks for t in scored_attempts(spec, limit=limit, noises=(0.0, 1.0), pool=pool)]
    return attempts, tool_schemas(pool)


def save_trajectories(path: Path, tasks: list[str], limit: int) -> dict[str, Any]:
    """Write the teacher's attempts to `path`, the tool schemas beside it (`tools.json`) and the
    default tokenizer into `tokenizer/` beside it: everything the training part needs."""
    from transformers import AutoTokenizer

    from toolself.models.weights import default_model_dir
    from toolself.train.collect import TOOLS_FILE
    from toolself.trajectory import write_jsonl

    attempts, schemas = teacher_attempts(tasks, limit)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, attempts, append=False)
    (path.parent / TOOLS_FILE).write_text(json.dumps(schemas, indent=1) + "\n", encoding="utf-8")
    AutoTokenizer.from_pretrained(str(default_model_dir())).save_pretrained(str(path.parent / TOKENIZER))
    return {"trajectories": str(path), "attempts": len(attempts),
            "correct": sum(bool(t.metadata.get("correct")) for t in attempts), "bytes": path.stat().st_size}


def carried_attempts(path: Path) -> tuple[list[Any], dict[str, Any]]:
    from toolself.train.collect import load_any

    attempts, schemas = load_any(path)
    if schemas is None:
        raise SystemExit(f"{path.parent / 'tools.json'} is missing: the tool schemas the attempts ran with")
    return attempts, schemas


def datasets(model_dir: Path, attempts: list[Any], schemas: dict[str, Any], max_length: int, kto: bool = True):
    """(RFT dataset, KTO dataset or None when `kto` is false: rendering every decision takes
    seconds that a run without KTO need not spend)."""
    from transformers import AutoTokenizer

    from toolself.train import data as D

    renderer = D.Renderer(AutoTokenizer.from_pretrained(str(model_dir)), schemas)
    sft, _ = D.build_sft_dataset(attempts, renderer, max_length=max_length)
    return sft, D.build_kto_dataset(attempts, renderer, max_length=max_length)[0] if kto else None


def stage_report(result, flops_per_token: float, extra_flops: float, peak: float) -> dict[str, Any]:
    seconds = result.seconds or float("nan")
    flops = flops_per_token * result.tokens + extra_flops
    return {"tokens": result.tokens, "seconds": result.seconds, "tokens_per_second": result.tokens_per_second,
            "steps": result.steps, "loss": result.train_loss, "tflops_per_second": round(flops / seconds / 1e12, 3),
            "mfu": round(flops / seconds / peak, 4), "peak_memory_gib": peak_memory_gib(),
            "kernels": result.extra.get("kernels"), "frozen_layer_cache": result.extra.get("frozen_layer_cache"),
            "padding_efficiency": result.extra.get("padding_efficiency")}


def decoding(model_dir: Path, max_tokens: int) -> dict[str, Any]:
    """Generated tokens per second of the embedded engine, one request alone and eight at once
    (after a warm-up request, so that the first kernel launches count in neither), greedy and
    then sampled, and whether the first request's greedy reply is the same in the batch as
    alone."""
    from concurrent.futures import ThreadPoolExecutor

    from toolself.models.base import Message
    from toolself.models.local import EmbeddedModel, Sampling

    model = EmbeddedModel.load(str(model_dir), dtype="float32" if not _cuda() else "auto",
                               max_tokens=max_tokens, max_batch=8)
    out: dict[str, Any] = {}
    ids = {}
    store_gib, rows = round(model.engine.store.max_bytes / 2**30, 2), model.engine.max_batch
    try:
        model.complete([Message(role="user", content="Warm-up.")], session=None)
        for name, concurrent, sampled in (("concurrent_1", 1, False), ("concurrent_8", 8, False),
                                          ("concurrent_8_sampled", 8, True)):  # sampled as CAT's collections
            messages = [[Message(role="user", content=f"Question {i}: what happened in {1900 + i}?")]
                        for i in range(concurrent)]
            sampling = [Sampling(0.7, 1.0, seed=i) if sampled else None for i in range(concurrent)]
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrent) as pool:
                replies = list(pool.map(lambda i: model.submit(messages[i], sampling=sampling[i]).result(),
                                        range(concurrent)))
            seconds = time.perf_counter() - start
            generated = sum(len(r.completion_ids) for r in replies)
            ids[name] = replies[0].completion_ids
            out[name] = {"generated_tokens": generated, "seconds": round(seconds, 3),
                         "tokens_per_second": round(generated / seconds, 1)}
    finally:
        model.close()
    one, eight = out["concurrent_1"]["tokens_per_second"], out["concurrent_8"]["tokens_per_second"]
    out["speedup_8_over_1"] = round(eight / one, 2) if one else None
    out["batched_reply_matches_alone"] = ids["concurrent_1"] == ids["concurrent_8"]
    out["prefix_store_gib"] = store_gib  # what the engine keeps between turns on this device
    out["engine_rows"] = rows  # episodes it decodes together here (`memory.engine_plan`)
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from toolself.train.shapes import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per stage")
    parser.add_argument("--tasks", default="builtin:research?hops=2", help="comma-separated built-in task specs")
    parser.add_argument("--limit", type=int, default=4, help="tasks per spec (each attempted twice, with noise)")
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--lora-layers", type=int, default=12, help="adapt the top N layers (0: all), as the recipe")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--no-checkpointing", action="store_true", help="turn gradient checkpointing off")
    parser.add_argument("--compile-layers", choices=["auto", "on", "off"], default="auto",
                        help="torch.compile the decoder layers (auto: the trainers' default, on for CPUs)")
    parser.add_argument("--attention", choices=["auto", "sdpa", "flex_attention", "flash_attention_2", "eager"],
                        default="auto", help="the attention kernel (auto: the trainers' choice for the device)")
    parser.add_argument("--padding-free", choices=["auto", "on", "off"], default="auto",
                        help="RFT's flattened batches (auto: on with flash or flex attention)")
    parser.add_argument("--length-grouped", choices=["auto", "on", "off"], default="auto",
                        help="micro-batches of similar lengths (RFT's sampler, KTO's decision order)")
    parser.add_argument("--liger", choices=["auto", "on", "off"], default="auto",
                        help="Liger's fused kernels (auto: on a CUDA GPU when liger-kernel is installed)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens per decoding request (0: skip)")
    parser.add_argument("--parts", default="rft,kto,decode", help="comma-separated: rft, kto (needs rft), decode")
    parser.add_argument("--trajectories", type=Path, default=None,
                        help="train on these saved attempts (tools.json and tokenizer/ beside them) instead of "
                             "running the teacher")
    parser.add_argument("--save-trajectories", type=Path, default=None,
                        help="run the teacher, save its attempts here (with tools.json and tokenizer/), and stop")
    parser.add_argument("--json", type=Path, default=None, help="also write the report to this file")
    parser.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--models", type=Path, default=None,
                        help="where the random models are written and reused (default: the working folder)")
    args = parser.parse_args(argv)
    tasks = [s for s in args.tasks.split(",") if s]
    if args.save_trajectories:
        report = save_trajectories(args.save_trajectories, tasks, args.limit)
        print(json.dumps(report, indent=2))
        return report
    parts = {p for p in args.parts.split(",") if p}
    if parts - {"rft", "kto", "decode"} or ("kto" in parts and "rft" not in parts):
        parser.error(f"--parts {args.parts!r}: choose from rft, kto, decode; kto trains on rft's adapter")

    import torch

    from toolself.train.kto import train_kto
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig
    from toolself.train.settings import installed_spelling
    from toolself.train.shapes import random_model_dir

    switch = {"auto": None, "on": True, "off": False}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        if args.trajectories:
            attempts, schemas = carried_attempts(args.trajectories)
            tokenizer = args.trajectories.parent / TOKENIZER
        else:
            attempts, schemas = teacher_attempts(tasks, args.limit)
            tokenizer = None
        model_dir = random_model_dir(args.shape, (args.models or work) / f"model-{args.shape}",
                                     tokenizer=tokenizer if tokenizer and tokenizer.is_dir() else None)
        lora_layers = min(args.lora_layers, SHAPES[args.shape][1]["num_hidden_layers"] - 1)
        sft, kto = datasets(model_dir, attempts, schemas, args.max_length, kto="kto" in parts)
        common = dict(max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                      gradient_accumulation_steps=args.accumulation, lora_layers=lora_layers,
                      gradient_checkpointing=not args.no_checkpointing, max_length=args.max_length,
                      disable_tqdm=True, warmup_steps=0, num_train_epochs=1000,  # steps, not epochs, end a run
                      attn_implementation=None if args.attention == "auto" else args.attention,
                      use_liger_kernel=switch[args.liger], length_grouped=switch[args.length_grouped])
        common = installed_spelling(common, {f.name for f in dataclasses.fields(RFTConfig)})  # as the commands do
        rft_config = RFTConfig(output_dir=str(work / "rft" / "checkpoints"), compile_layers=switch[args.compile_layers],
                               padding_free=switch[args.padding_free], **common)
        kto_config = CATKTOConfig(output_dir=str(work / "kto" / "checkpoints"), **common)
        training_dtype = torch.bfloat16 if rft_config.bf16 else torch.float32
        peak = measured_peak_flops(training_dtype)
        n, n_adapted = parameter_counts(model_dir, lora_layers)
        recompute = 0 if args.no_checkpointing else 2
        per_token = 2 * n + (2 + recompute) * n_adapted

        report = {"shape": args.shape, "parameters": n, "adapted_parameters": n_adapted, "lora_layers": lora_layers,
                  "gradient_checkpointing": not args.no_checkpointing, "flops_per_trained_token": per_token,
                  "peak_tflops_measured": round(peak / 1e12, 2), "dtype": str(training_dtype).split(".")[-1],
                  "sequences": {"rft": len(sft), "kto": len(kto) if kto is not None else None}, "versions": versions(), "device": device_info()}
        if "rft" in parts:
            reset_peak()
            rft = train_rft(sft, model_dir, work / "rft", rft_config)
            peak = best_peak(peak, training_dtype, report)
            report["rft"] = stage_report(rft, per_token, 0.0, peak)
            write_report(report, args.json)
        if "kto" in parts:
            reset_peak()
            result = train_kto(kto, work / "rft", work / "kto", kto_config)
            kl_tokens = result.extra.get("kl_tokens", 0)
            peak = best_peak(peak, training_dtype, report)
            report["kto"] = stage_report(result, per_token + 2 * n, 4 * n * kl_tokens, peak)
            report["kto"]["kl_tokens"] = kl_tokens
            write_report(report, args.json)
        if "decode" in parts and args.decode_tokens:
            report["decoding"] = decoding(model_dir, args.decode_tokens)
    write_report(report, args.json)
    print(json.dumps(report, indent=2))
    return report


def write_report(report: dict[str, Any], path: Path | None) -> None:
    """After each part, so that a run stopped at its time limit still leaves what it measured."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
