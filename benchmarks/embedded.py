"""Performance of the embedded default model: prints one JSON object.

- load: seconds to load the converted model (and, with --fresh-cache, to convert the GGUF
  file into a new cache folder first);
- kv_reuse: per-step latency along one agent episode whose context grows by a tool
  observation each step to ~2.4k tokens, with the KV cache kept between steps against
  recomputing the whole prompt every step (same messages, greedy, outputs compared); the
  summary averages the steps at 1.5k tokens and more, whole step and prefill alone;
- throughput: generated tokens per second for 1 and for 8 concurrent episodes (threads
  calling `complete`, as the eval runner does), each step a tool-call turn followed by an
  observation;
- lone: one episode, the engine's only request, with the idle engine thread's cores lent to
  it (the default, `local.lone_threads`) against one engine thread's share, alternated three
  times; tokens/s, the ratio, and whether the replies were the same;
- memory: peak resident memory (VmHWM) of a fresh process that loads the model as `toolself
  run` does and runs one episode, and of one that runs 4 concurrent episodes (an eval at
  concurrency 4), each episode's context growing to --memory-context tokens (the agent's
  default budget for embedded models). Resident memory counts what torch and every library
  hold, which tracemalloc cannot see;
- run (only when asked for: minutes): peak resident memory of `toolself run` on the demo's
  question and documents with the settings the issue measured (4 stages of 6 steps, 60k
  tokens), and a digest of its replies' tokens, to compare two versions' replies.

Usage: python benchmarks/embedded.py [--fresh-cache] [--threads N] [--steps N] [--dtype D] [--cache-dtype D]
                                    [--no-jump-forward] [--parts reuse,throughput,lone,memory,run]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

THREADS: int | None = None  # torch threads of each engine thread, set from --threads

TOOLS = [
    {"type": "function", "function": {
        "name": "search", "description": "Search the document collection; returns ranked results.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "What to look for."}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "visit", "description": "Read one page of a document.",
        "parameters": {"type": "object", "properties": {
            "locator": {"type": "string", "description": "The document's locator."},
            "page": {"type": "integer", "description": "Page number."}}, "required": ["locator"]}}},
    {"type": "function", "function": {
        "name": "terminate", "description": "Finish the task with the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]

TASKS = [
    "Find out which standard library module parses command-line options and name its main class.",
    "Which Python module serialises objects to JSON text, and what is the function that writes to a file?",
    "What does the collections module offer for counting hashable objects?",
    "Which module provides regular expression matching operations similar to Perl's?",
    "How do you spawn new processes and connect to their pipes from Python?",
    "Which module implements a thread-safe FIFO queue for producers and consumers?",
    "Which module supports the manipulation of dates and times, and which class combines both?",
    "Which module gives a way to create temporary files and directories?",
]


def _observations() -> list[str]:
    """Real English text of about 150-250 tokens each: docstrings of standard modules."""
    import argparse as a, collections, datetime, json as j, queue, re, subprocess, tempfile as t, threading as th
    texts = []
    for module in (a, collections, datetime, j, queue, re, subprocess, t, th, inspect, statistics, os):
        doc = " ".join((inspect.getdoc(module) or "").split())
        for i in range(0, len(doc), 800):
            chunk = doc[i : i + 800]
            if len(chunk) > 400:
                texts.append(chunk)
    return texts


def _episode_messages(task: str):
    from toolself.models.base import Message

    return [Message("system", "You are a research assistant. Use the tools to find the answer, then call terminate."),
            Message("user", task)]


def _observe(messages, completion, text: str, step: int):
    from toolself.models.base import Message

    calls = completion.message.tool_calls
    call_id = calls[0].id if calls else f"call_{step}"
    messages.append(completion.message)
    messages.append(Message("tool", f"Result {step}: {text}", tool_call_id=call_id))


def bench_kv_reuse(model_cls, weights, observations, target_tokens: int, max_tokens: int) -> dict:
    """Grow one episode to ~target_tokens, timing each step with and without the cache."""
    model, tokenizer = weights
    reuse = model_cls(model, tokenizer, max_batch=1, threads=THREADS)
    fresh = model_cls(model, tokenizer, max_batch=1, cache_entries=0, threads=THREADS)
    messages = _episode_messages(TASKS[0])
    rows = []
    step = 0
    try:
        while True:
            prompt_len = len(reuse.prompt_ids(messages, TOOLS))
            if prompt_len > target_tokens * 1.2:
                break
            before = reuse.engine.stats["prefill_seconds"]
            a = reuse.complete(list(messages), tools=TOOLS, session="bench", max_tokens=max_tokens)
            reuse_prefill = reuse.engine.stats["prefill_seconds"] - before
            before = fresh.engine.stats["prefill_seconds"]
            b = fresh.complete(list(messages), tools=TOOLS, max_tokens=max_tokens)
            fresh_prefill = fresh.engine.stats["prefill_seconds"] - before
            rows.append({"prompt_tokens": prompt_len, "reuse_s": a.latency, "recompute_s": b.latency,
                         "reuse_prefill_s": reuse_prefill, "recompute_prefill_s": fresh_prefill,
                         "cached_tokens": a.usage.cached_tokens, "completion_tokens": a.usage.completion_tokens,
                         "same_output": a.completion_token_ids == b.completion_token_ids})
            _observe(messages, a, observations[step % len(observations)], step)
            step += 1
    finally:
        reuse.close()
        fresh.close()
    long_rows = [r for r in rows if r["prompt_tokens"] >= target_tokens * 0.75] or rows[-3:]
    reuse_s = statistics.mean(r["reuse_s"] for r in long_rows)
    recompute_s = statistics.mean(r["recompute_s"] for r in long_rows)
    reuse_prefill = statistics.mean(r["reuse_prefill_s"] for r in long_rows)
    recompute_prefill = statistics.mean(r["recompute_prefill_s"] for r in long_rows)
    return {
        "steps": len(rows),
        "final_prompt_tokens": rows[-1]["prompt_tokens"],
        "long_context_steps": len(long_rows),
        "long_context_mean_prompt_tokens": round(statistics.mean(r["prompt_tokens"] for r in long_rows)),
        "reuse_step_s": round(reuse_s, 3),
        "recompute_step_s": round(recompute_s, 3),
        "speedup": round(recompute_s / reuse_s, 2),
        "reuse_prefill_s": round(reuse_prefill, 3),
        "recompute_prefill_s": round(recompute_prefill, 3),
        "prefill_speedup": round(recompute_prefill / reuse_prefill, 2),
        "identical_outputs": all(r["same_output"] for r in rows),
        "per_step": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
    }


def _concurrently(run, episodes: int) -> float:
    """Run `run(i)` for each episode in its own thread, as the eval runner's attempts call the
    model; the wall seconds until all are done."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(episodes)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def bench_throughput(model_cls, weights, observations, episodes: int, steps: int, max_tokens: int,
                     threads: int | None = None) -> dict:
    """`episodes` threads each run `steps` tool-call turns; tokens generated per wall second.
    `threads`: the engine's (None: --threads, or the embedded model's own choice)."""
    model, tokenizer = weights
    engine_model = model_cls(model, tokenizer, max_batch=max(episodes, 1), threads=threads or THREADS)
    # Warm the grammar cache and the kernels so that both runs measure decoding only.
    engine_model.complete(_episode_messages(TASKS[0]), tools=TOOLS, max_tokens=4)
    engine_model.engine.stats = {k: 0 if isinstance(v, int) else 0.0 for k, v in engine_model.engine.stats.items()}
    generated = [0] * episodes
    prompt_tokens = [0] * episodes
    replies: list[list] = [[] for _ in range(episodes)]

    def run(i: int) -> None:
        messages = _episode_messages(TASKS[i % len(TASKS)])
        for step in range(steps):
            c = engine_model.complete(list(messages), tools=TOOLS, session=f"episode-{i}", max_tokens=max_tokens)
            generated[i] += c.usage.completion_tokens
            replies[i].append(c.completion_token_ids)
            prompt_tokens[i] = c.usage.prompt_tokens
            _observe(messages, c, observations[(i * 7 + step) % len(observations)], step)
        engine_model.end_session(f"episode-{i}")

    wall = _concurrently(run, episodes)
    stats = dict(engine_model.engine.stats)
    engine_model.close()
    return {
        "episodes": episodes,
        "steps_per_episode": steps,
        "replies_sha256": hashlib.sha256(json.dumps(replies).encode()).hexdigest()[:16],
        "generated_tokens": sum(generated),
        "final_prompt_tokens_mean": round(statistics.mean(prompt_tokens)),
        "wall_s": round(wall, 2),
        "generated_tokens_per_s": round(sum(generated) / wall, 2),
        # Replies per second: unlike tokens per second, blind to how many of a reply's tokens
        # the grammar forced (jump-forward writes those without a decode step each).
        "turns_per_s": round(episodes * steps / wall, 3),
        "decode_steps": stats["steps"],
        "forced_tokens": stats["forced_tokens"],
        "decode_step_tokens": stats["step_tokens"],
        "mean_rows_per_step": round(stats["step_rows"] / max(1, stats["steps"]), 2),
        "decode_s": round(stats["step_seconds"], 2),
        "prefill_s": round(stats["prefill_seconds"], 2),
        "prefill_tokens": stats["prefill_tokens"],
        # CPU seconds of the engine threads: robust to other processes sharing the machine.
        "decode_cpu_s": round(stats["step_cpu_seconds"], 2),
        "prefill_cpu_s": round(stats["prefill_cpu_seconds"], 2),
        "generated_tokens_per_decode_cpu_s": round(sum(generated) / max(stats["step_cpu_seconds"], 1e-9), 2),
        # Cores the engine kept busy on average: 2 is every core of this machine all the time.
        "engine_cores_busy": round((stats["step_cpu_seconds"] + stats["prefill_cpu_seconds"]) / wall, 2),
    }


def status_mb() -> dict[str, int]:
    """This process's resident memory now and at its peak, in MB (Linux)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) // 1024
    return {"rss_mb": fields["VmRSS"], "peak_rss_mb": fields["VmHWM"]}


def memory_child(episodes: int, dtype: str, context: int, max_tokens: int) -> dict:
    """In this (fresh) process: load the model as `toolself run` does, then run `episodes`
    concurrent episodes until each prompt reaches `context` tokens."""
    from toolself.models import local, weights

    model = local.EmbeddedModel.load(dtype=dtype)
    loaded = status_mb()
    observations = _observations()

    def run(i: int) -> None:
        messages = _episode_messages(TASKS[i % len(TASKS)])
        step = 0
        while len(model.prompt_ids(messages, TOOLS)) < context:
            c = model.complete(list(messages), tools=TOOLS, session=f"episode-{i}", max_tokens=max_tokens)
            _observe(messages, c, observations[(i * 7 + step) % len(observations)], step)
            step += 1
        model.end_session(f"episode-{i}")

    wall = _concurrently(run, episodes)
    stats = dict(model.engine.stats)
    model.close()
    end = status_mb()
    return {"episodes": episodes, "dtype": weights.resolve_dtype(dtype), "context_tokens": context,
            "wall_s": round(wall, 1),
            "prefill_tokens": stats["prefill_tokens"], "decode_steps": stats["steps"],
            "peak_rss_mb": end["peak_rss_mb"], "rss_after_load_mb": loaded["rss_mb"], "peak_rss_during_load_mb": loaded["peak_rss_mb"],
            "rss_at_end_mb": end["rss_mb"]}


def bench_memory(episodes: int, args) -> dict:
    """`memory_child` in a fresh interpreter, so that its peak is its own."""
    command = [sys.executable, __file__, "--memory-child", str(episodes), "--dtype", args.memory_dtype,
               "--memory-context", str(args.memory_context), "--max-tokens", str(args.max_tokens)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def bench_lone(model_cls, weights, observations, steps: int, max_tokens: int, rounds: int = 3) -> dict:
    """One episode (the engine's only request) decoding with the idle engine thread's cores as
    well (`local.lone_threads`, the default) against one engine thread's share; the two runs
    alternate, `rounds` times each, so that a change of load on a shared machine hits both."""
    from toolself.models import local

    runs: dict[str, list[dict]] = {"lone": [], "shared": []}
    for _ in range(rounds):
        runs["lone"].append(bench_throughput(model_cls, weights, observations, 1, steps, max_tokens, threads=None))
        runs["shared"].append(bench_throughput(model_cls, weights, observations, 1, steps, max_tokens,
                                               threads=local.default_threads()))
    rate = {k: statistics.median(r["generated_tokens_per_s"] for r in v) for k, v in runs.items()}
    return {"threads": {"lone": local.lone_threads(local.default_threads()), "shared": local.default_threads()},
            "generated_tokens_per_s": rate, "speedup": round(rate["lone"] / rate["shared"], 2),
            "decode_s": {k: [r["decode_s"] for r in v] for k, v in runs.items()},
            "prefill_s": {k: [r["prefill_s"] for r in v] for k, v in runs.items()},
            "same_replies": len({r["replies_sha256"] for v in runs.values() for r in v}) == 1}


def bench_run() -> dict:
    """The demo's `toolself run` in a child process: its peak resident memory (the kernel's
    count for that child, as `/usr/bin/time -v` reports it), and its replies' token ids."""
    from toolself.cli import DEMO_QUESTION, demo_docs
    from toolself.trajectory import read_jsonl

    with tempfile.TemporaryDirectory(prefix="toolself-bench-run-") as tmp:
        out = os.path.join(tmp, "t.jsonl")
        command = [sys.executable, "-m", "toolself", "run", DEMO_QUESTION, "--docs", str(demo_docs()),
                   "--tools", "search,visit", "--max-stages", "4", "--max-steps", "6", "--max-tokens", "60000",
                   "--out", out]
        start = time.perf_counter()
        with open(os.path.join(tmp, "output.txt"), "w") as output:
            child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not every child's
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if child.returncode != 0:
            raise RuntimeError(f"toolself run failed ({child.returncode}): {open(output.name).read()[-2000:]}")
        replies = [call.completion_token_ids for t in read_jsonl(out) for stage in t.stages
                   for conversation in (stage.config_conversation, stage.conversation) if conversation
                   for call in conversation.calls]
    digest = hashlib.sha256(json.dumps(replies).encode()).hexdigest()[:16]
    return {"peak_rss_mb": usage.ru_maxrss // 1024, "wall_s": round(wall, 1), "replies": len(replies),
            "reply_tokens": sum(len(r or []) for r in replies), "replies_sha256": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-cache", action="store_true", help="time the GGUF conversion into a new cache folder")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the embedded model's)")
    parser.add_argument("--steps", type=int, default=4, help="tool-call turns per episode in the throughput runs")
    parser.add_argument("--context", type=int, default=2000, help="context length reached by the KV reuse episode")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "mixed"])
    parser.add_argument("--parts", default="reuse,throughput,memory",
                        help="comma-separated: reuse, throughput, lone, memory, run")
    parser.add_argument("--memory-context", type=int, default=3000,
                        help="context length each episode of the memory runs reaches")
    parser.add_argument("--memory-dtype", default="auto", choices=["auto", "float32", "bfloat16", "mixed"],
                        help="dtype of the memory runs (default: what `toolself run` uses)")
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="the engine's KV cache dtype (default: the embedded model's choice, `local.kv_dtype`)")
    parser.add_argument("--no-jump-forward", action="store_true",
                        help="let the model pick the tokens of the text a grammar forces mid-reply, one a step")
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args.dtype, args.memory_context, args.max_tokens)))
        return

    import torch

    from toolself.models import local, weights

    global THREADS
    THREADS = args.threads  # None: the embedded model's own choice (`local.default_threads`, `local.lone_threads`)

    out: dict = {"torch_threads_per_engine_thread": THREADS or local.default_threads(),
                 "cpus": len(os.sched_getaffinity(0)), "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    if args.fresh_cache:
        previous = os.environ.get("TOOLSELF_CACHE")
        with tempfile.TemporaryDirectory(prefix="toolself-bench-cache-") as tmp:
            os.environ["TOOLSELF_CACHE"] = tmp
            start = time.perf_counter()
            weights.default_model_dir()
            out["first_conversion_s"] = round(time.perf_counter() - start, 2)
        if previous is None:
            os.environ.pop("TOOLSELF_CACHE")
        else:
            os.environ["TOOLSELF_CACHE"] = previous
    parts = set(args.parts.split(","))
    if parts & {"reuse", "throughput", "lone"}:
        start = time.perf_counter()
        model, tokenizer, _ = weights.load_weights(dtype=args.dtype)
        out["load_s"] = round(time.perf_counter() - start, 2)
        out["dtype"] = args.dtype  # mixed keeps float32 parameters beside its half-precision products
        out["parameter_dtype"] = str(model.dtype).removeprefix("torch.")
        cache_dtype = local.kv_dtype(model) if args.cache_dtype == "auto" else getattr(torch, args.cache_dtype)
        out["cache_dtype"] = str(cache_dtype).removeprefix("torch.")
        out["jump_forward"] = not args.no_jump_forward
        model_cls = functools.partial(local.EmbeddedModel, cache_dtype=cache_dtype,
                                      jump_forward=not args.no_jump_forward)
        start = time.perf_counter()
        model_cls(model, tokenizer, threads=THREADS).close()
        out["grammar_setup_s"] = round(time.perf_counter() - start, 2)
        observations = _observations()
        weights = (model, tokenizer)
    if "reuse" in parts:
        out["kv_reuse"] = bench_kv_reuse(model_cls, weights, observations, args.context, args.max_tokens)
    if "throughput" in parts:
        one = bench_throughput(model_cls, weights, observations, 1, args.steps, args.max_tokens)
        eight = bench_throughput(model_cls, weights, observations, 8, args.steps, args.max_tokens)
        out["throughput"] = {"1": one, "8": eight,
                             "speedup_8_vs_1": round(eight["generated_tokens_per_s"] / one["generated_tokens_per_s"], 2)}
    if "lone" in parts:
        out["lone"] = bench_lone(model_cls, weights, observations, args.steps, args.max_tokens)
    if "memory" in parts:
        out["memory"] = {str(n): bench_memory(n, args) for n in (1, 4)}
    if "run" in parts:
        out["toolself_run"] = bench_run()
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
