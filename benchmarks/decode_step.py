"""Where one decode step of the embedded model goes: prints one JSON object.

For each dtype (float32, bfloat16 and mixed: see `toolself/models/half_linear.py`):
- prefill: tokens per second for a whole ~1.5k-token prompt, and a new observation of 360
  tokens read on top of the cached rest, with the share of its time spent in attention;
- the next-token logits after that prompt, against float32's;
- a decode step at that context through the engine's own cache layer and attention (the cache
  in the dtype the engine picks for that model on this CPU, `local.kv_dtype`), for 1 and 8
  rows, timed, then profiled into matrix products, attention and the rest; `matmul_gb_per_s`
  is the weight bytes the products stream per step over their time, which on a CPU decoding
  one row is the number that bounds the step;
- `span_steps_ms`: a step that feeds each of R rows S tokens (key "RxS"), as the engine's
  jump-forward does for a sequence decoding alone.
Then the output head's product in each form torch offers on a CPU (float32, bfloat16, fbgemm's
float16, and the int4 kernel, the natural home of the shipped 4-bit weights), and torch's
attention kernel in the engine's shapes, with the keys and values repeated per query head and
on the key/value heads. Everything runs on one torch thread, as the engine's decode thread does.

Usage: python benchmarks/decode_step.py [--context N] [--steps N] [--dtypes float32,bfloat16,mixed]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

MATMUL_OPS = ("aten::mm", "aten::addmm", "quantized::linear_dynamic_fp16")
SPANS = (1, 2, 4, 8)  # tokens a row in one decode step: one, or a token and the text forced after it


def _cache(prefill_cache, rows: int, context: int, spare: int):
    from transformers.cache_utils import Cache

    from toolself.models.engine import _RowLayer

    layers = []
    for layer in prefill_cache.layers:
        k, v = layer.keys[0], layer.values[0]
        kbuf = torch.zeros(rows, k.shape[0], context + spare, k.shape[2], dtype=k.dtype)
        vbuf = torch.zeros(rows, v.shape[0], context + spare, v.shape[2], dtype=v.dtype)
        kbuf[:, :, :context] = k
        vbuf[:, :, :context] = v
        row_layer = _RowLayer(kbuf, vbuf)
        row_layer.bind(rows, context)
        layers.append(row_layer)
    return Cache(layers=layers)


def _decode_steps(model, prefilled, rows: int, context: int, span: int, steps: int):
    """A function that runs one decode step feeding each of `rows` rows `span` tokens on top of
    the prefilled context; room for 2 x `steps` calls (timed, then profiled)."""
    spare = 2 * span * steps + 8
    cache = _cache(prefilled, rows, context, spare=spare)
    mask = torch.ones(rows, context + spare, dtype=torch.long)
    position = [context]

    def step() -> None:
        p = position[0]
        model(input_ids=torch.full((rows, span), 5), attention_mask=mask[:, : p + span],
              position_ids=torch.arange(p, p + span).repeat(rows, 1), cache=cache, use_cache=True,
              logits_to_keep=1)
        position[0] += span

    return step


def _mean_ms(step, steps: int) -> float:
    """Milliseconds per call over `steps - 1` calls, after one that warms up."""
    step()
    start = time.perf_counter()
    for _ in range(steps - 1):
        step()
    return (time.perf_counter() - start) / (steps - 1) * 1e3


def bench_dtype(dtype: str, rows_list: list[int], context: int, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from transformers import AttentionInterface

    from toolself.models import local, weights
    from toolself.models.engine import ATTENTION, _attention, new_cache, use_engine_attention
    from toolself.models.half_linear import HalfLinear

    model, _, _ = weights.load_weights(dtype=dtype)
    use_engine_attention(model)

    def timed_attention(*args, **kwargs):
        with torch.profiler.record_function("attention"):
            return _attention(*args, **kwargs)

    AttentionInterface.register(ATTENTION, timed_attention)
    layers = len(model.model.layers)
    kv_dtype = local.kv_dtype(model)  # the engine's cache dtype for this model on this CPU
    # The bytes a decode step's products stream: float16 for the mixed dtype's layers.
    linear_bytes = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                       if isinstance(m, torch.nn.Linear))
    linear_bytes += sum(m.in_features * m.out_features * 2 for m in model.modules() if isinstance(m, HalfLinear))
    ids = torch.randint(100, 40000, (1, context), generator=torch.Generator().manual_seed(0))
    results = {}
    with torch.inference_mode():
        start = time.perf_counter()
        out = model(input_ids=ids, position_ids=torch.arange(context)[None], cache=new_cache(layers, dtype=kv_dtype),
                    use_cache=True, logits_to_keep=1)
        prefill_s = time.perf_counter() - start
        prefilled, last_logits = out.past_key_values, out.logits[0, -1].float()
        # A new observation read on top of a cached episode, as the engine's prefill does.
        chunk = min(360, context // 4)
        cached = [(l.keys[:, :, : context - chunk], l.values[:, :, : context - chunk]) for l in prefilled.layers]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            model(input_ids=ids[:, context - chunk :], position_ids=torch.arange(context - chunk, context)[None],
                  cache=new_cache(layers, cached, kv_dtype), use_cache=True, logits_to_keep=1)
            chunk_s = time.perf_counter() - start
        averages = prof.key_averages()
        prefill = {"tokens_per_s": round(context / prefill_s, 1),
                   "chunk_tokens": chunk, "chunk_s": round(chunk_s, 3),
                   "chunk_attention_share": round(next(e.cpu_time_total for e in averages if e.key == "attention")
                                                  / sum(e.self_cpu_time_total for e in averages), 3)}
        for rows in rows_list:
            step = _decode_steps(model, prefilled, rows, context, span=1, steps=steps)
            step_ms = _mean_ms(step, steps)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    step()
            averages = prof.key_averages()
            by_op = {e.key: e.self_cpu_time_total for e in averages}
            total = sum(by_op.values())
            matmul = sum(v for k, v in by_op.items() if k in MATMUL_OPS)
            attention = next(e.cpu_time_total for e in averages if e.key == "attention")
            matmul_ms = matmul / steps / 1e3
            results[str(rows)] = {
                "step_ms": round(step_ms, 2),
                "ms_per_row": round(step_ms / rows, 2),
                "matmul_share": round(matmul / total, 3),
                "attention_share": round(attention / total, 3),
                "matmul_ms": round(matmul_ms, 2),
                "matmul_gb_per_s": round(linear_bytes / 1e9 / (matmul_ms / 1e3), 2),
            }
        span_steps = {}
        for rows in rows_list:
            for span in SPANS:
                step = _decode_steps(model, prefilled, rows, context, span=span, steps=steps)
                span_steps[f"{rows}x{span}"] = round(_mean_ms(step, steps), 2)
    return {"kv_dtype": str(kv_dtype).removeprefix("torch."), "linear_weight_mb": round(linear_bytes / 1e6, 1),
            "prefill": prefill, "rows": results, "span_steps_ms": span_steps,
            "_last_logits": last_logits}


def bench_head_products(rows_list: list[int], n: int = 49152, k: int = 576, group: int = 32,
                        repeats: int = 10) -> dict:
    """The output head's product in each form torch offers on a CPU: float32, bfloat16, fbgemm's
    float16 (the mixed dtype's decoding path) and the int4 kernel (asymmetric groups of 32,
    like GGUF Q4_1), on weights that are exactly 4-bit so that every form holds the same
    numbers."""
    weight = torch.randn(n, k)
    grouped = weight.view(n, k // group, group)
    low, high = grouped.amin(-1), grouped.amax(-1)
    scale = (high - low) / 15
    q = ((grouped - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).view(n, k)
    dequantized = (q.view(n, k // group, group).float() * scale[..., None] + low[..., None]).view(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous()
    as_bf16 = dequantized.bfloat16()
    as_fp16 = torch.ops.quantized.linear_prepack_fp16(dequantized, None)

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats * 1e3

    out = {"shape": [n, k], "group": group}
    for rows in rows_list:
        x = torch.randn(rows, k)
        forms = {
            "float32": lambda: x @ dequantized.t(),
            "bfloat16": lambda: (x.bfloat16() @ as_bf16.t()).float(),
            "float16_fbgemm": lambda: torch.ops.quantized.linear_dynamic_fp16(x, as_fp16),
            "int4": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros),
        }
        exact = forms["float32"]()
        out[str(rows)] = {name: {"ms": round(timed(fn), 3),
                                 "relative_error": float((fn() - exact).norm() / exact.norm())}
                          for name, fn in forms.items()}
    return out


def bench_attention_kernels(layers: int = 30, kv_heads: int = 3, groups: int = 3, dim: int = 64,
                            context: int = 1500, chunk: int = 360, repeats: int = 10) -> dict:
    """Torch's CPU attention kernel in the engine's shapes (SmolLM2-135M: 9 query heads on 3
    key/value heads): a decode step (one query per row, left-padding mask; each layer over a
    cache of its own, so that the reads come from memory rather than the CPU's caches) and a
    prefill chunk on top of a cached prefix (causal mask; compute-bound, so one cache serves
    every layer), in float32 and bfloat16, with the keys and values repeated per query head
    (transformers' "sdpa" whenever a mask is given; for one query it folds the heads into
    rows instead) and on the key/value heads (`enable_gqa`, the engine's `_attention`).
    Milliseconds per layer."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    heads = kv_heads * groups
    generator = torch.Generator().manual_seed(0)

    def per_layer(fn, n=repeats) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return round((time.perf_counter() - start) / n / layers * 1e3, 3)

    out: dict = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        for rows in (1, 8):
            keys = [torch.randn(rows, kv_heads, context, dim, generator=generator).to(dtype) for _ in range(layers)]
            values = [torch.randn(rows, kv_heads, context, dim, generator=generator).to(dtype) for _ in range(layers)]
            query = torch.randn(rows, heads, 1, dim, generator=generator).to(dtype)
            mask = torch.ones(rows, 1, 1, context, dtype=torch.bool)
            folded = query.reshape(rows, kv_heads, groups, dim)
            out[f"decode_{rows}_rows_{name}"] = {
                "heads_folded_into_rows": per_layer(lambda: [sdpa(folded, k, v, attn_mask=mask)
                                                             for k, v in zip(keys, values)]),
                "key_value_heads": per_layer(lambda: [sdpa(query, k, v, attn_mask=mask, enable_gqa=True)
                                                      for k, v in zip(keys, values)]),
            }
        total = context + chunk
        query = torch.randn(1, heads, chunk, dim, generator=generator).to(dtype)
        keys = torch.randn(1, kv_heads, total, dim, generator=generator).to(dtype)
        values = torch.randn(1, kv_heads, total, dim, generator=generator).to(dtype)
        mask = torch.ones(chunk, total, dtype=torch.bool).tril(context)[None, None]

        def repeated(t):
            return t[:, :, None].expand(1, kv_heads, groups, total, dim).reshape(1, heads, total, dim)

        out[f"prefill_{chunk}_on_{context}_{name}"] = {
            "repeated_per_query_head": per_layer(lambda: [sdpa(query, repeated(keys), repeated(values), attn_mask=mask)
                                                          for _ in range(layers)], 3),
            "key_value_heads": per_layer(lambda: [sdpa(query, keys, values, attn_mask=mask, enable_gqa=True)
                                                  for _ in range(layers)], 3),
        }
    return out


def shipped_tensor_types() -> dict[str, int]:
    from collections import Counter

    from gguf import GGUFReader

    from toolself.models import weights

    reader = GGUFReader(str(weights.default_gguf_path()))
    return dict(Counter(t.tensor_type.name for t in reader.tensors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtypes", default="float32,bfloat16,mixed", help="comma-separated; float32 always runs "
                        "(the others' logits are compared with its)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out: dict = {"torch_threads": 1, "cpus": len(os.sched_getaffinity(0)), "context": args.context,
                 "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                 "shipped_tensor_types": shipped_tensor_types()}
    dtypes = ["float32"] + [d for d in args.dtypes.split(",") if d in ("bfloat16", "mixed")]
    for dtype in dtypes:
        out[dtype] = bench_dtype(dtype, [1, 8], args.context, args.steps)
    exact = out["float32"].pop("_last_logits")
    for dtype in dtypes[1:]:
        logits = out[dtype].pop("_last_logits")
        out[dtype]["next_token_logits_vs_float32"] = {"max_abs_difference": round(float((logits - exact).abs().max()), 4),
                                                      "same_argmax": int(logits.argmax()) == int(exact.argmax())}
    out["head_products"] = bench_head_products([1, 8])
    out["attention_kernels_ms_per_layer"] = bench_attention_kernels()
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
