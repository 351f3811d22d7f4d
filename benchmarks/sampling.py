"""What drawing a sampled token costs the embedded engine: prints one JSON object.

- per_row: milliseconds to draw one token from one row of logits at temperature 0.7, with
  `torch.multinomial` (the engine's sampler before `engine.sample_token`) and with
  `engine.sample_token`, on one torch thread as the engine's decode thread runs: at the default
  model's vocabulary (49,152) on its own next-token logits along a prompt, and at Qwen3's
  (151,936) on random logits; `rest_wins` is how often the rest of the vocabulary won the
  race against the likeliest tokens (the slow path);
- episodes: generated tokens per second of the default model for eight concurrent sampled
  tool-call replies (temperature 0.7, as CAT's collections sample), with each sampler in turn,
  alternated over the rounds in one process so that both meet the same machine.

Usage: python benchmarks/sampling.py [--rows N] [--rounds N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embedded import TASKS, TOOLS, _episode_messages  # noqa: E402

from toolself.models import engine  # noqa: E402
from toolself.models.cores import cpu_name  # noqa: E402

TEMPERATURE = 0.7


def multinomial_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """The engine's sampler before `sample_token` (top_p 1: no nucleus)."""
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def per_row_ms(rows: torch.Tensor, sampler, rounds: int = 3) -> float:
    generator = torch.Generator().manual_seed(0)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for row in rows:
            sampler(row, TEMPERATURE, 1.0, generator)
        best = min(best, (time.perf_counter() - start) / len(rows))
    return round(best * 1e3, 3)


def rest_wins(rows: torch.Tensor) -> float:
    """The share of draws whose winner lies outside the raced candidates."""
    generator = torch.Generator().manual_seed(0)
    outside = 0
    for row in rows:
        token = engine.sample_token(row, TEMPERATURE, 1.0, generator)
        candidates = torch.softmax(row / TEMPERATURE, -1).topk(engine.SAMPLE_CANDIDATES).indices
        outside += token not in set(candidates.tolist())
    return round(outside / len(rows), 3)


def compare(rows: torch.Tensor) -> dict:
    old, new = per_row_ms(rows, multinomial_token), per_row_ms(rows, engine.sample_token)
    return {"vocabulary": rows.shape[1], "rows": rows.shape[0], "multinomial_ms": old, "sample_token_ms": new,
            "speedup": round(old / new, 2), "rest_wins": rest_wins(rows)}


def default_model_logits(model, rows: int) -> torch.Tensor:
    messages = _episode_messages(TASKS[0])
    ids = torch.tensor([model.prompt_ids(messages, TOOLS)[-rows:]])
    with torch.no_grad():
        return model.model(input_ids=ids).logits[0].float()


def episodes_tokens_per_second(model, max_tokens: int) -> float:
    from toolself.models.local import Sampling

    def reply(i: int):
        future = model.submit(_episode_messages(TASKS[i % len(TASKS)]), tools=TOOLS, max_tokens=max_tokens,
                              sampling=Sampling(TEMPERATURE, 1.0, seed=i))
        return len(future.result(timeout=600).completion_ids)

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        generated = sum(pool.map(reply, range(8)))
    return generated / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200, help="rows of logits per vocabulary")
    parser.add_argument("--rounds", type=int, default=3, help="episode rounds per sampler, alternated")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per sampled reply")
    args = parser.parse_args(argv)

    from toolself.models.local import EmbeddedModel

    torch.set_num_threads(1)
    model = EmbeddedModel.load(dtype="float32", threads=1)
    try:
        generator = torch.Generator().manual_seed(0)
        report = {"machine": {"cpu": cpu_name(), "torch": torch.__version__,
                              "torch_threads": 1},
                  "per_row": [compare(default_model_logits(model, args.rows)),
                              compare(3 * torch.randn(args.rows, 151_936, generator=generator))]}
        model.complete(_episode_messages("Warm-up."), tools=TOOLS, max_tokens=8)
        speeds: dict[str, list[float]] = {"multinomial": [], "sample_token": []}
        for _ in range(args.rounds):
            for name, sampler in (("multinomial", multinomial_token), ("sample_token", engine.sample_token)):
                engine.sample_token, kept = sampler, engine.sample_token
                try:
                    speeds[name].append(episodes_tokens_per_second(model, args.max_tokens))
                finally:
                    engine.sample_token = kept
        medians = {name: round(statistics.median(values), 1) for name, values in speeds.items()}
        report["episodes"] = {"concurrent": 8, "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
                              "tokens_per_second": medians,
                              "speedup": round(medians["sample_token"] / medians["multinomial"], 2)}
    finally:
        model.close()
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
