"""Correctness of the training path's kernels on this machine's accelerator: the loss and the LoRA
gradients of a few trajectory sequences under each kernel choice, against a float32 padded
SDPA reference, in the training dtype. Prints one JSON object.

    python benchmarks/gpu_checks.py --trajectories KIT/trajectories.jsonl [--shape qwen3-0.6b]

A bfloat16 run differs from the float32 reference by its own rounding: the padded SDPA batch in
bfloat16 is that noise floor, and a variant passes when its error is within twice the floor
(or 2%, whichever is larger). Variants: padding-free rows under SDPA (its block-diagonal mask)
and under flex attention (which skips the masked blocks: CUDA only, it has no backward pass on
a CPU), and Liger's fused layers where liger-kernel is installed (CUDA only), each with the
setting the trainers give them.

Then `local:ADAPTER` as the pipeline's evaluations load a student: a random adapter on the same
model, read onto this machine's device and merged there; its seconds, how much the host's
resident memory grew at the peak, and whether the weights are the float32 merge's, rounded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def sequences(model_dir: Path, trajectories: Path, count: int, max_length: int) -> list[dict[str, list[int]]]:
    """`count` SFT sequences of at most `max_length` tokens, of spread-out lengths (so that
    padding matters)."""
    from train_gpu import carried_attempts, datasets

    attempts, schemas = carried_attempts(trajectories)
    sft, _ = datasets(model_dir, attempts, schemas, 1 << 20, kto=False)
    order = sorted((i for i in range(len(sft)) if len(sft[i]["input_ids"]) <= max_length),
                   key=lambda i: len(sft[i]["input_ids"]))
    if len(order) < count:
        raise SystemExit(f"fewer than {count} sequences of at most {max_length} tokens in {trajectories}")
    picks = [order[round(k * (len(order) - 1) / max(1, count - 1))] for k in range(count)]
    return [{"input_ids": sft[i]["input_ids"], "labels": sft[i]["labels"]} for i in picks]


def loss_and_gradients(model_dir: Path, examples: list[dict[str, list[int]]], dtype: Any, attention: str,
                       padding_free: bool, liger: bool, device: str) -> tuple[float, Any]:
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from toolself.train.lora import LoraArguments

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation=attention).to(device)
    if liger:
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(base, {"fused_linear_cross_entropy": False})  # as TRL's SFTTrainer sets it
    model = get_peft_model(base, LoraArguments().peft_config(base))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter's B is zero, which would hide the A gradients
            torch.nn.init.normal_(p, std=0.02)
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    grads = torch.cat([p.grad.float().flatten().cpu() for _, p in sorted(model.named_parameters())
                       if p.requires_grad])
    value = loss.item()
    del model, base
    if device == "cuda":
        torch.cuda.empty_cache()
    return value, grads


def adapter_load(model_dir: Path, folder: Path) -> dict[str, Any]:
    """`load_weights` of a random adapter on `model_dir` in bfloat16, against the merge in float32
    on the CPU rounded to bfloat16 (equal: the base is stored in bfloat16)."""
    import time

    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from embedded import status_mb
    from toolself.models.weights import load_weights

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(str(folder))
    del base

    before = status_mb()["rss_mb"]
    Path("/proc/self/clear_refs").write_text("5")  # the peak counts from here
    start = time.perf_counter()
    model, _, _ = load_weights(folder, "bfloat16")
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = status_mb()["peak_rss_mb"]
    loaded = {n: p.detach().cpu() for n, p in model.named_parameters()}
    device, dtype = str(model.device), model.dtype
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    reference = PeftModel.from_pretrained(reference, str(folder)).merge_and_unload().to(torch.bfloat16)
    differing = sum(int((loaded[n] != p).sum()) for n, p in reference.named_parameters())
    return {"device": device, "dtype": str(dtype).split(".")[-1], "seconds": round(seconds, 2),
            "host_peak_growth_gib": round((peak - before) / 1024, 2),
            "weights_bytes_gib": round(sum(p.numel() * p.element_size() for p in loaded.values()) / 2**30, 2),
            "weights_differing_from_float32_merge": differing}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=Path, required=True, help="a kit's trajectories (train_gpu.py)")
    parser.add_argument("--shape", default=None, help="model shape (default: qwen3-0.6b on a GPU, tiny elsewhere)")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None, help="also write the report to this file")
    args = parser.parse_args(argv)

    import torch

    from toolself.train.kernels import FLEX, SDPA, liger_installed
    from toolself.train.merge import default_dtype
    from toolself.train.shapes import random_model_dir

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    shape = args.shape or ("qwen3-0.6b" if cuda else "tiny")
    dtype = default_dtype()
    variants = [("padded", SDPA, False, False), ("padding_free_sdpa", SDPA, True, False)]
    skipped = {}
    if cuda:
        variants.append(("padding_free_flex", FLEX, True, False))
    else:
        skipped["padding_free_flex"] = "no CUDA GPU: flex attention has no backward pass on a CPU"
    if cuda and liger_installed():
        variants.append(("liger", SDPA, False, True))
    else:
        skipped["liger"] = "no CUDA GPU" if not cuda else "liger-kernel not installed"

    report: dict[str, Any] = {"shape": shape, "device": device, "dtype": str(dtype).split(".")[-1], "variants": {},
                              "skipped": skipped, "adapter_load": {}, "ok": False}

    def save() -> None:
        """The verdicts so far, written after each measurement: killed at the session's limit,
        this run keeps what it measured."""
        results, loaded = report["variants"], report["adapter_load"]
        bound = max(2 * results.get("padded", {}).get("gradient_error", 0.0), 0.02)
        for r in results.values():
            if "error" not in r:
                r["ok"] = (r["gradient_error"] <= bound
                           and r["loss_error"] <= max(2 * results["padded"]["loss_error"], 0.01))
        report.update(bound=bound, ok=bool(results) and all(r.get("ok", False) for r in results.values())
                      and loaded.get("weights_differing_from_float32_merge") == 0)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = args.trajectories.parent / "tokenizer"
        # Stored in bfloat16, as Qwen3's checkpoints are: the adapter's merge is then exact.
        model_dir = random_model_dir(shape, Path(tmp) / shape, dtype=torch.bfloat16,
                                     tokenizer=tokenizer if tokenizer.is_dir() else None)
        examples = sequences(model_dir, args.trajectories, args.sequences, args.max_length)
        ref_loss, ref_grads = loss_and_gradients(model_dir, examples, torch.float32, SDPA, False, False, device)
        report.update(lengths=[len(e["input_ids"]) for e in examples], reference_loss=round(ref_loss, 5))
        for name, attention, padding_free, liger in variants:
            try:
                loss, grads = loss_and_gradients(model_dir, examples, dtype, attention, padding_free, liger, device)
                report["variants"][name] = {"loss": round(loss, 5), "loss_error": abs(loss - ref_loss) / abs(ref_loss),
                                            "gradient_error": float((grads - ref_grads).norm() / ref_grads.norm())}
            except Exception as exc:  # a kernel that fails here is what this script is for
                report["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            save()
        try:
            report["adapter_load"] = adapter_load(model_dir, Path(tmp) / "adapter")
        except Exception as exc:  # a load that fails here is what this script is for
            report["adapter_load"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        save()
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
