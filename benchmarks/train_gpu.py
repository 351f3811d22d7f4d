"""CAT's training and decoding on this machine's accelerator, on a random-initialised model of a
named shape: tokens per second, estimated MFU, peak memory, versions and the device.

    python benchmarks/train_gpu.py --shape qwen3-8b [--steps 20] [--tasks builtin:research,...]
    python benchmarks/train_gpu.py --shape tiny --steps 1          # on a CPU, in CI

The trajectories are the expert teacher's scored attempts at built-in tasks (real agent loop,
real tools, real scorer; noise makes some fail), rendered with the default tokenizer; RFT and
KTO run through `train_rft` / `train_kto` with the recipe's settings (`--lora-layers`, the
frozen-layer cache, gradient checkpointing, kernels chosen for the device), as the pipeline
calls them; decoding runs the embedded engine with 1 and 8 concurrent requests. Prints one
JSON object.

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

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {"device": "cuda", "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "cuda": torch.version.cuda}
    return {"device": "cpu", "name": platform.processor() or platform.machine(), "cores": _cores()}


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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


def datasets(model_dir: Path, tasks: list[str], limit: int, max_length: int):
    from transformers import AutoTokenizer

    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool
    from toolself.train import data as D

    pool = default_pool()
    attempts = [t for spec in tasks for t in scored_attempts(spec, limit=limit, noises=(0.0, 1.0), pool=pool)]
    renderer = D.Renderer(AutoTokenizer.from_pretrained(str(model_dir)), D.tool_schemas(pool))
    sft, _ = D.build_sft_dataset(attempts, renderer, max_length=max_length)
    kto, _, _ = D.build_kto_dataset(attempts, renderer, max_length=max_length)
    return sft, kto


def stage_report(result, flops_per_token: float, extra_flops: float, peak: float) -> dict[str, Any]:
    seconds = result.seconds or float("nan")
    flops = flops_per_token * result.tokens + extra_flops
    return {"tokens": result.tokens, "seconds": result.seconds, "tokens_per_second": result.tokens_per_second,
            "steps": result.steps, "loss": result.train_loss, "tflops_per_second": round(flops / seconds / 1e12, 3),
            "mfu": round(flops / seconds / peak, 4), "peak_memory_gib": peak_memory_gib(),
            "kernels": result.extra.get("kernels"), "frozen_layer_cache": result.extra.get("frozen_layer_cache")}


def decoding(model_dir: Path, max_tokens: int) -> dict[str, Any]:
    """Generated tokens per second of the embedded engine, one request alone and eight at once."""
    from concurrent.futures import ThreadPoolExecutor

    from toolself.models.base import Message
    from toolself.models.local import EmbeddedModel

    model = EmbeddedModel.load(str(model_dir), dtype="float32" if not _cuda() else "bfloat16",
                               max_tokens=max_tokens, max_batch=8)
    out = {}
    try:
        for concurrent in (1, 8):
            messages = [[Message(role="user", content=f"Question {i}: what happened in {1900 + i}?")]
                        for i in range(concurrent)]
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrent) as pool:
                replies = list(pool.map(lambda m: model.complete(m, session=None), messages))
            seconds = time.perf_counter() - start
            generated = sum(r.usage.completion_tokens for r in replies)
            out[f"concurrent_{concurrent}"] = {"generated_tokens": generated, "seconds": round(seconds, 3),
                                               "tokens_per_second": round(generated / seconds, 1)}
    finally:
        model.close()
    one, eight = out["concurrent_1"]["tokens_per_second"], out["concurrent_8"]["tokens_per_second"]
    out["speedup_8_over_1"] = round(eight / one, 2) if one else None
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
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens per decoding request (0: skip)")
    parser.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args(argv)

    import torch

    from toolself.train.kto import train_kto
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig
    from toolself.train.shapes import random_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        model_dir = random_model_dir(args.shape, work / f"model-{args.shape}")
        lora_layers = min(args.lora_layers, SHAPES[args.shape][1]["num_hidden_layers"] - 1)
        sft, kto = datasets(model_dir, [s for s in args.tasks.split(",") if s], args.limit, args.max_length)
        common = dict(max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                      gradient_accumulation_steps=args.accumulation, lora_layers=lora_layers,
                      gradient_checkpointing=not args.no_checkpointing, max_length=args.max_length,
                      disable_tqdm=True, warmup_steps=0, num_train_epochs=1000)  # steps, not epochs, end a run
        compile_layers = {"auto": None, "on": True, "off": False}[args.compile_layers]
        rft_config = RFTConfig(output_dir=str(work / "rft" / "checkpoints"), compile_layers=compile_layers, **common)
        kto_config = CATKTOConfig(output_dir=str(work / "kto" / "checkpoints"), **common)
        training_dtype = torch.bfloat16 if rft_config.bf16 else torch.float32
        peak = measured_peak_flops(training_dtype)
        n, n_adapted = parameter_counts(model_dir, lora_layers)
        recompute = 0 if args.no_checkpointing else 2
        per_token = 2 * n + (2 + recompute) * n_adapted

        reset_peak()
        rft = train_rft(sft, model_dir, work / "rft", rft_config)
        report = {"shape": args.shape, "parameters": n, "adapted_parameters": n_adapted, "lora_layers": lora_layers,
                  "gradient_checkpointing": not args.no_checkpointing, "flops_per_trained_token": per_token,
                  "peak_tflops_measured": round(peak / 1e12, 2), "dtype": str(training_dtype).split(".")[-1],
                  "sequences": {"rft": len(sft), "kto": len(kto)}}
        report["rft"] = stage_report(rft, per_token, 0.0, peak)
        reset_peak()
        result = train_kto(kto, work / "rft", work / "kto", kto_config)
        kl_tokens = result.extra.get("kl_tokens", 0)
        report["kto"] = stage_report(result, per_token + 2 * n, 4 * n * kl_tokens, peak)
        report["kto"]["kl_tokens"] = kl_tokens
        if args.decode_tokens:
            report["decoding"] = decoding(model_dir, args.decode_tokens)
        report["versions"] = versions()
        report["device"] = device_info()
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
