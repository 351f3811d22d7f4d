"""The training log: every trainer log line (loss, learning rate, KTO rewards and KL, ...) plus
tokens per second, appended to a JSONL file that the plots and the pipeline read back.

Tokens are counted where the batches are built (a wrapper around the collator), because the
trainer's callbacks never see the batches; the count is of real (unpadded) tokens of the
sequences trained on, so it means the same for RFT and KTO (KTO's extra forward passes over
mismatched KL pairs are counted separately as `kl_tokens`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback


class CountingCollator:
    """Wraps a collator and counts the non-padding tokens of every batch it builds."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.tokens = 0
        self.slots = 0  # the batches' token positions, padding included (RFT's batches)
        self.kl_tokens = 0

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.inner(examples)
        if "attention_mask" in batch:
            self.tokens += int(batch["attention_mask"].sum())
        else:
            self.tokens += int(batch["input_ids"].numel())
        if "input_ids" in batch:
            self.slots += int(batch["input_ids"].numel())
        if "KL_attention_mask" in batch:
            self.kl_tokens += int(batch["KL_attention_mask"].sum())
        return batch


class JsonlLog(TrainerCallback):
    """Appends one JSON object per trainer log event (main process only)."""

    def __init__(self, path: str | Path, counter: CountingCollator | None = None, stage: str = "train",
                 extra: dict[str, Any] | None = None):
        self.path = Path(path)
        self.counter = counter
        self.stage = stage
        self.extra = dict(extra or {})
        self.started = 0.0
        self.last_time = 0.0
        self.last_tokens = 0
        self.world_size = 1

    def _write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.last_time = time.perf_counter()
        self.last_tokens = self.counter.tokens if self.counter else 0
        self.world_size = max(1, int(getattr(args, "world_size", 1) or 1))
        if state.is_world_process_zero:
            self._write({"event": "begin", "stage": self.stage, "time": time.time(), "max_steps": state.max_steps,
                         "world_size": self.world_size, **self.extra})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero:
            return
        now = time.perf_counter()
        logs = logs or {}
        summary = "train_runtime" in logs  # the trainer's end-of-training totals, not a step
        record: dict[str, Any] = {"event": "summary" if summary else "log", "stage": self.stage,
                                  "step": state.global_step, "epoch": state.epoch,
                                  "elapsed": round(now - self.started, 3)}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool))})
        if self.counter is not None and not summary:
            tokens = self.counter.tokens * self.world_size
            window = now - self.last_time
            record["tokens"] = tokens
            record["kl_tokens"] = self.counter.kl_tokens * self.world_size
            if window > 0:
                record["tokens_per_second"] = round((tokens - self.last_tokens) / window, 2)
            self.last_time, self.last_tokens = now, tokens
        self._write(record)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        elapsed = time.perf_counter() - self.started
        record: dict[str, Any] = {"event": "end", "stage": self.stage, "step": state.global_step,
                                  "elapsed": round(elapsed, 3)}
        if self.counter is not None:
            tokens = self.counter.tokens * self.world_size
            record.update(tokens=tokens, kl_tokens=self.counter.kl_tokens * self.world_size,
                          tokens_per_second=round(tokens / elapsed, 2) if elapsed > 0 else None)
        self._write(record)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
