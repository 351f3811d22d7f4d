"""How long loading a model in the mixed dtype spends converting its linear layers
(`half_linear.use_half_linears`): in one thread against several; prints JSON.

    python benchmarks/mixed_conversion.py [--shape default|smollm2-135m|qwen3-0.6b|...] \
        [--workers 1,2] [--repeats 3]

`default` is the embedded model's own weights; a shape (`toolself.train.shapes`) is a random
float32 model of that size. The runs alternate (1, N, 1, N, ...) in one process, each on a
fresh float32 copy, so that a shared machine's noise falls on every setting alike.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch


def float32_model(shape: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from toolself.models.weights import default_model_dir
    from toolself.train.shapes import SHAPES, random_model

    if shape == "default":
        return AutoModelForCausalLM.from_pretrained(str(default_model_dir()), dtype=torch.float32).eval()
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; shapes: default, {', '.join(SHAPES)}")
    return random_model(shape, dtype=torch.float32, device="cpu")[0].eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="default")
    parser.add_argument("--workers", default="1,2", help="comma-separated thread counts to compare")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from toolself.models.cores import cpu_name, usable_cores
    from toolself.models.half_linear import has_bfloat16_kernels, use_half_linears
    from toolself.models.memory import release_freed_memory

    counts = [int(n) for n in args.workers.split(",")]
    template = float32_model(args.shape)
    weights = sum(m.weight.numel() for m in template.modules() if isinstance(m, torch.nn.Linear))
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(args.repeats):
        for n in counts:
            model = copy.deepcopy(template)
            start = time.perf_counter()
            use_half_linears(model, on_replaced=release_freed_memory, workers=n)
            seconds[n].append(round(time.perf_counter() - start, 3))
            del model
            release_freed_memory()
    medians = {n: statistics.median(s) for n, s in seconds.items()}
    print(json.dumps({
        "cpu": cpu_name(), "cores": usable_cores(),
        "torch": torch.__version__, "shape": args.shape, "linear_weights_millions": round(weights / 1e6, 1),
        "prefill_bf16_copies": has_bfloat16_kernels(),
        "workers": {str(n): {"seconds": seconds[n], "median_s": medians[n]} for n in counts},
        "speedup": {f"{n} vs {counts[0]}": round(medians[counts[0]] / medians[n], 2) for n in counts[1:]},
    }, indent=1))


if __name__ == "__main__":
    main()
