"""Training curves as PNG, drawn from the JSONL training log (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolself.train.trainlog import read_log

PANELS: list[tuple[str, list[str]]] = [
    ("loss", ["loss"]),
    ("learning rate", ["learning_rate"]),
    ("tokens / s", ["tokens_per_second"]),
    ("KTO rewards", ["rewards/chosen", "rewards/rejected", "rewards/margins"]),
    ("KTO KL estimate", ["kl"]),
    ("gradient norm", ["grad_norm"]),
]


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            xs.append(r.get("step", len(xs)))
            ys.append(float(value))
    return xs, ys


def plot_log(log_path: str | Path, out_png: str | Path, title: str | None = None) -> Path | None:
    """Draw every panel the log has data for; None when the log has no step records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in read_log(log_path) if r.get("event") == "log"]
    panels = [(name, keys) for name, keys in PANELS if any(_series(records, k)[0] for k in keys)]
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for key in keys:
            xs, ys = _series(records, key)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=2, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
