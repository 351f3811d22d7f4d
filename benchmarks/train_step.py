"""Where one RFT step of the CAT recipe goes, and what attention costs there: prints one JSON object.

The step is the recipe's (`toolself/train/study.py`): SmolLM2-135M-Instruct with LoRA r=16 on
the top 12 decoder layers, bf16 autocast where the CPU has it, the compact head, one sequence,
forward and backward, no frozen-layer cache (a first-epoch step). For each `--lengths` it times
the step and profiles it into attention forward / backward (torch's CPU flash kernel), matrix
products, the output head's work over the labelled tokens, and the rest (element-wise ops,
casts, copies). Sequences are real ones from `--data` (a CAT run's `data/sft`: the row closest
to each length) or else random token ids with the last 15% labelled, the share of an RFT
sequence the policy wrote.

The attention part times the flash kernel's forward and backward alone at the model's shape
(SmolLM2's 9 query heads of 64, causal) in bfloat16 and float32, against a query-blocked
attention built from matrix products (what a hand-written backward would have to beat), and
says whether FlexAttention can run a backward pass on this device.

With `--compiled` it then compiles every decoder layer's forward pass (torch.compile, dynamic
shapes) and times the same steps again, side by side with the eager ones.

Usage: python benchmarks/train_step.py [--lengths 1650,2900] [--data DIR] [--repeats 3] [--compiled]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

ATTENTION_FORWARD = "aten::_scaled_dot_product_flash_attention_for_cpu"
ATTENTION_BACKWARD = ATTENTION_FORWARD + "_backward"
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
ADAPTED_LAYERS = 12  # the recipe's lora_layers


def recipe_model():
    from peft import get_peft_model

    from toolself.models.half_linear import has_bfloat16_kernels
    from toolself.train.compact_head import use_compact_head
    from toolself.models.spec import ModelSpec
    from toolself.train.lora import LoraArguments, load_base

    model, _ = load_base(ModelSpec.parse("embedded").weights())
    model = get_peft_model(model, LoraArguments(lora_layers=ADAPTED_LAYERS).peft_config(model))
    use_compact_head(model)
    model.train()
    return model, torch.bfloat16 if has_bfloat16_kernels() else None


def sequence(length: int, rows, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row of `rows` (a saved SFT dataset) closest to `length`, or random ids without one."""
    if rows is not None:
        best = min(range(len(rows)), key=lambda i: abs(len(rows[i]["input_ids"]) - length))
        return torch.tensor([rows[best]["input_ids"]]), torch.tensor([rows[best]["labels"]])
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(length))
    labels = ids.clone()
    labels[0, : int(length * 0.85)] = -100
    return ids, labels


def train_step(model, dtype, ids, labels) -> None:
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(input_ids=ids, labels=labels, fused_lm_head=True).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def time_steps(model, dtype, ids, labels, repeats: int) -> tuple[float, float]:
    """(seconds of the first step, mean seconds of `repeats` steps after a second warm-up)."""
    started = time.perf_counter()
    train_step(model, dtype, ids, labels)
    first = time.perf_counter() - started
    train_step(model, dtype, ids, labels)
    started = time.perf_counter()
    for _ in range(repeats):
        train_step(model, dtype, ids, labels)
    return first, (time.perf_counter() - started) / repeats


def profile_step(model, dtype, ids, labels, repeats: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    _, seconds = time_steps(model, dtype, ids, labels, repeats)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        train_step(model, dtype, ids, labels)
    labelled = int((labels[:, 1:] != -100).sum())
    config = model.get_base_model().config
    head_shapes = [f"[{config.vocab_size}, {config.hidden_size}]"]  # the weight, in casts and products
    if labelled:
        head_shapes.append(f"[{labelled}, {config.vocab_size}]")  # the labelled tokens' logits
    parts = {"attention_forward": 0.0, "attention_backward": 0.0, "matmul": 0.0, "head": 0.0, "other": 0.0}
    for event in prof.key_averages(group_by_input_shape=True):
        ms = event.self_cpu_time_total / 1000
        shapes = str(event.input_shapes)
        if event.key == ATTENTION_BACKWARD:
            parts["attention_backward"] += ms
        elif event.key == ATTENTION_FORWARD:
            parts["attention_forward"] += ms
        elif any(shape in shapes for shape in head_shapes):
            parts["head"] += ms
        elif event.key in MATMULS:
            parts["matmul"] += ms
        else:
            parts["other"] += ms
    total = sum(parts.values())
    return {"tokens": ids.shape[1], "labelled_tokens": labelled, "step_seconds": round(seconds, 3),
            "tokens_per_second": round(ids.shape[1] / seconds, 1),
            "profile_share": {k: round(v / total, 3) for k, v in parts.items()},
            "attention_backward_ms_per_adapted_layer": round(parts["attention_backward"] / ADAPTED_LAYERS, 1)}


def blocked_attention(q, k, v, block: int = 256):
    """Causal attention by query blocks of matrix products, each block seeing only the keys up
    to its last row."""
    scale = q.shape[-1] ** -0.5
    length = q.shape[2]
    outputs = []
    for start in range(0, length, block):
        end = min(start + block, length)
        scores = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)).float() * scale
        allowed = torch.ones(end - start, end, dtype=torch.bool).tril(start)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).to(q.dtype)
        outputs.append(torch.matmul(weights, v[:, :, :end]))
    return torch.cat(outputs, 2)


def time_attention(kernel, length: int, dtype, repeats: int, heads: int, head_dim: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, generator=generator, dtype=dtype).requires_grad_()
               for _ in range(3))
    grad = torch.randn(1, heads, length, head_dim, generator=generator, dtype=dtype)
    for _ in range(2):
        kernel(q, k, v).backward(grad)
    forward = backward = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        out = kernel(q, k, v)
        middle = time.perf_counter()
        out.backward(grad)
        forward += middle - started
        backward += time.perf_counter() - middle
    return {"forward_ms": round(forward / repeats * 1000, 1), "backward_ms": round(backward / repeats * 1000, 1)}


def flex_backward_on_cpu() -> str:
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as exc:
        return f"unavailable: {exc}"
    q = torch.randn(1, 1, 128, 64, requires_grad=True)
    try:
        flex_attention(q, q, q).sum().backward()
    except Exception as exc:  # torch says why in its own words
        return f"no: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return "yes"


def compiled_steps(model, dtype, sequences, eager: list[dict], repeats: int) -> list[dict]:
    """The same steps with every decoder layer's forward compiled by torch.compile (inductor,
    dynamic shapes, so one compilation serves every length): the element-wise ops between the
    products, a third of an eager step, become fused kernels."""
    from toolself.train.compiled_layers import compile_decoder_layers

    compile_decoder_layers(model)  # the trainers' own compilation
    rows = []
    for (ids, labels), before in zip(sequences, eager):
        first, seconds = time_steps(model, dtype, ids, labels, repeats)
        rows.append({"tokens": ids.shape[1], "first_step_seconds": round(first, 1), "step_seconds": round(seconds, 3),
                     "speedup_over_eager": round(before["step_seconds"] / seconds, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1650,2900", help="sequence lengths, comma-separated")
    parser.add_argument("--data", help="a saved SFT dataset (a CAT run's data/sft) to take real sequences from")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compiled", action="store_true",
                        help="then time the steps again with the decoder layers compiled (needs a C++ compiler)")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    model, dtype = recipe_model()
    config = model.get_base_model().config
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    rows = None
    if args.data:
        from datasets import load_from_disk

        rows = load_from_disk(args.data)
    sequences = [sequence(n, rows, config.vocab_size) for n in lengths]
    flash = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    report = {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version(), "torch": torch.__version__},
        "settings": {"model": f"SmolLM2-135M-Instruct, LoRA r=16 on the top {ADAPTED_LAYERS} of "
                              f"{config.num_hidden_layers} layers, compact head",
                     "autocast": str(dtype) if dtype else "none (float32)",
                     "sequences": args.data or "random token ids, last 15% labelled", "repeats": args.repeats},
        "steps": [profile_step(model, dtype, *pair, args.repeats) for pair in sequences],
        "attention": {
            str(n): {f"{kind}_{name}": time_attention(kernel, n, torch_dtype, args.repeats, heads, head_dim)
                     for name, torch_dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32))
                     for kind, kernel in (("flash", flash), ("blocked_matmul", blocked_attention))}
            for n in lengths},
        "flex_attention_backward_on_cpu": flex_backward_on_cpu(),
    }
    if args.compiled:
        report["compiled_layers"] = compiled_steps(model, dtype, sequences, report["steps"], args.repeats)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
