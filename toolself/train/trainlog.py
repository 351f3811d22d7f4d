"""The training log: every trainer log line (loss, learning rate, KTO rewards and KL, ...) plus
tokens per second, appended to a JSONL file that the plots and the pipeline read back.

Tokens are counted as each micro-batch reaches the trainer's training step (`TokenCounter.watch`),
because the callbacks never see the batches, and the data loader builds one batch ahead of the
step that trains on it. The count is of real (unpadded) tokens of the sequences trained on, so
it means the same for RFT and KTO (KTO's extra forward passes over mismatched KL pairs are
counted separately as `kl_tokens`). Under several processes each counts its own batches, and
what is logged is their sum.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from toolself.train.collective import summed_over_processes


@dataclass
class TokenCounts:
    tokens: int = 0
    slots: int = 0  # the batches' token positions, padding included (RFT's batches)
    kl_tokens: int = 0


class TokenCounter:
    """Counts the non-padding tokens of every batch trained on, in this process."""

    def __init__(self):
        self.counts = TokenCounts()

    def count(self, batch: dict[str, Any]) -> None:
        if "attention_mask" in batch:
            self.counts.tokens += int(batch["attention_mask"].sum())
        else:
            self.counts.tokens += int(batch["input_ids"].numel())
        if "input_ids" in batch:
            self.counts.slots += int(batch["input_ids"].numel())
        if "KL_attention_mask" in batch:
            self.counts.kl_tokens += int(batch["KL_attention_mask"].sum())

    def watch(self, trainer: Any) -> None:
        """Count each batch `trainer` trains on, as its training step receives it."""
        step = trainer.training_step

        def counted_step(model, inputs, *args, **kwargs):
            self.count(inputs)
            return step(model, inputs, *args, **kwargs)

        trainer.training_step = counted_step

    def summed(self, device: Any) -> TokenCounts:
        """The counts of every process of the run, summed (a collective: every process calls it)."""
        c = self.counts
        return TokenCounts(*summed_over_processes([c.tokens, c.slots, c.kl_tokens], device))


class JsonlLog(TrainerCallback):
    """Appends one JSON object per trainer log event (main process only)."""

    def __init__(self, path: str | Path, counter: TokenCounter | None = None, stage: str = "train",
                 extra: dict[str, Any] | None = None):
        self.path = Path(path)
        self.counter = counter
        self.stage = stage
        self.extra = dict(extra or {})
        self.started = 0.0
        self.last_time = 0.0
        self.last_tokens = 0

    def _write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.last_time = time.perf_counter()
        self.last_tokens = 0
        if state.is_world_process_zero:
            self._write({"event": "begin", "stage": self.stage, "time": time.time(), "max_steps": state.max_steps,
                         "world_size": max(1, int(getattr(args, "world_size", 1) or 1)), **self.extra})

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        summary = "train_runtime" in logs  # the trainer's end-of-training totals, not a step
        counted = self.counter.summed(args.device) if self.counter is not None and not summary else None
        if not state.is_world_process_zero:
            return
        now = time.perf_counter()
        record: dict[str, Any] = {"event": "summary" if summary else "log", "stage": self.stage,
                                  "step": state.global_step, "epoch": state.epoch,
                                  "elapsed": round(now - self.started, 3)}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool))})
        if counted is not None:
            tokens = counted.tokens
            window = now - self.last_time
            record["tokens"] = tokens
            record["kl_tokens"] = counted.kl_tokens
            if window > 0:
                record["tokens_per_second"] = round((tokens - self.last_tokens) / window, 2)
            self.last_time, self.last_tokens = now, tokens
        self._write(record)

    def on_train_end(self, args, state, control, **kwargs):
        counted = self.counter.summed(args.device) if self.counter is not None else None
        if not state.is_world_process_zero:
            return
        elapsed = time.perf_counter() - self.started
        record: dict[str, Any] = {"event": "end", "stage": self.stage, "step": state.global_step,
                                  "elapsed": round(elapsed, 3)}
        if counted is not None:
            tokens = counted.tokens
            record.update(tokens=tokens, kl_tokens=counted.kl_tokens,
                          tokens_per_second=round(tokens / elapsed, 2) if elapsed > 0 else None)
        self._write(record)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
