"""Tables, plots and comparisons from the result records of one or more runs.

The paper's main table is accuracy per method and dataset plus the average over datasets.
With repeats, each repeat is one estimate of that table: a cell is the mean over repeats and
its standard error the sample standard deviation over repeats divided by sqrt(R) (the average
column is averaged within each repeat first, then the same). Attempts that timed out or
failed count as wrong, as in the paper; their counts are shown beside the table.

`write_report(dirs, out)` writes report.md, accuracy.csv, efficiency.csv, comparison.csv
(when comparing) and PNG plots (matplotlib, Agg backend).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from toolself.evals.records import AttemptRecord
from toolself.evals.runs import Run, load_run

_KINDS = ("builtin", "gaia", "frames", "xbench", "swebench", "hotpotqa", "gsm8k", "jsonl")
AVERAGE = "average"


def short_dataset(spec: str) -> str:
    """`builtin:research?n=5` -> `research`; `gaia:/data/gaia/metadata.jsonl` -> `gaia`;
    a plain JSONL file (or an unprefixed path) -> its file name without extension."""
    body = spec.split("?", 1)[0]
    kind, sep, target = body.partition(":")
    if not sep or kind not in _KINDS:
        return Path(target if sep else body).stem or body
    if kind == "builtin":
        return target
    if kind == "jsonl":
        return Path(target).stem or kind
    return kind


def dataset_labels(specs: Iterable[str]) -> dict[str, str]:
    """Short names, falling back to the full spec where two specs would share one."""
    specs = list(dict.fromkeys(specs))
    shorts = {s: short_dataset(s) for s in specs}
    counts: dict[str, int] = defaultdict(int)
    for short in shorts.values():
        counts[short] += 1
    return {s: (short if counts[short] == 1 else s) for s, short in shorts.items()}


@dataclass
class Cell:
    """One method on one dataset (or the average over datasets)."""

    method: str
    dataset: str
    tasks: int
    attempts: int
    repeats: int
    accuracy: float
    stderr: float | None
    ok: int = 0
    timeout: int = 0
    error: int = 0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    steps: float = 0.0
    stages: float = 0.0
    reconfigurations: float = 0.0
    wall_time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def mean_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    if not values:
        return 0.0, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def _per_repeat_accuracy(records: Sequence[AttemptRecord]) -> dict[int, float]:
    by_repeat: dict[int, list[bool]] = defaultdict(list)
    for r in records:
        by_repeat[r.repeat].append(r.correct)
    return {rep: sum(v) / len(v) for rep, v in sorted(by_repeat.items())}


def _cell(method: str, dataset: str, records: Sequence[AttemptRecord]) -> Cell:
    accuracy, stderr = mean_stderr(list(_per_repeat_accuracy(records).values()))
    n = len(records)

    def mean(attr: str) -> float:
        return statistics.fmean(getattr(r, attr) for r in records) if records else 0.0

    return Cell(method=method, dataset=dataset, tasks=len({r.task_id for r in records}), attempts=n,
                repeats=len({r.repeat for r in records}), accuracy=accuracy, stderr=stderr,
                ok=sum(r.status == "ok" for r in records), timeout=sum(r.status == "timeout" for r in records),
                error=sum(r.status == "error" for r in records), prompt_tokens=mean("prompt_tokens"),
                completion_tokens=mean("completion_tokens"), steps=mean("steps"), stages=mean("stages"),
                reconfigurations=mean("reconfigurations"), wall_time=mean("wall_time"))


@dataclass
class Table:
    """Cells per (method, dataset), the averages, and the row and column order."""

    methods: list[str]
    datasets: list[str]
    cells: dict[tuple[str, str], Cell]
    averages: dict[str, Cell]
    labels: dict[str, str] = field(default_factory=dict)

    def cell(self, method: str, dataset: str) -> Cell | None:
        return self.average(method) if dataset == AVERAGE else self.cells.get((method, dataset))

    def average(self, method: str) -> Cell | None:
        return self.averages.get(method)

    def summary(self) -> dict[str, dict[str, dict[str, float | None]]]:
        """{method: {dataset label | average: {accuracy, stderr, attempts}}}, for comparisons and JSON."""
        out: dict[str, dict[str, dict[str, float | None]]] = {}
        for m in self.methods:
            row = {}
            for d in self.datasets + [AVERAGE]:
                c = self.cell(m, d)
                if c is not None:
                    row[self.labels.get(d, d)] = {"accuracy": c.accuracy, "stderr": c.stderr, "attempts": c.attempts}
            out[m] = row
        return out


def aggregate(records: Sequence[AttemptRecord], methods: Sequence[str] | None = None,
              datasets: Sequence[str] | None = None, method_of=None) -> Table:
    """Build the table. `method_of(record)` names the row (default: the record's method)."""
    method_of = method_of or (lambda r: r.method)
    groups: dict[tuple[str, str], list[AttemptRecord]] = defaultdict(list)
    for r in records:
        groups[(method_of(r), r.dataset)].append(r)
    found_methods = list(dict.fromkeys(m for m, _ in groups))
    found_datasets = list(dict.fromkeys(d for _, d in groups))
    methods = [m for m in (methods or []) if m in found_methods] + [
        m for m in found_methods if m not in (methods or [])]
    datasets = [d for d in (datasets or []) if d in found_datasets] + [
        d for d in found_datasets if d not in (datasets or [])]
    cells = {key: _cell(key[0], key[1], rs) for key, rs in groups.items()}
    averages = {}
    for m in methods:
        per_dataset = {d: _per_repeat_accuracy(groups[(m, d)]) for d in datasets if (m, d) in groups}
        repeats = sorted(set().union(*[set(v) for v in per_dataset.values()])) if per_dataset else []
        # A repeat counts toward the average only where it covers every dataset of the method.
        per_repeat = [statistics.fmean(v[rep] for v in per_dataset.values())
                      for rep in repeats if all(rep in v for v in per_dataset.values())]
        all_records = [r for d in datasets for r in groups.get((m, d), [])]
        average = _cell(m, AVERAGE, all_records)
        average.accuracy, average.stderr = mean_stderr(per_repeat)
        averages[m] = average
    return Table(methods, datasets, cells, averages, dataset_labels(datasets))


def _arm_labels(runs: Sequence[Run]) -> dict[tuple[int, str], str]:
    """Row names: the method, suffixed with its run's folder where several runs share it."""
    seen: dict[str, int] = defaultdict(int)
    for run in runs:
        for m in run.methods:
            seen[m] += 1
    labels = {}
    for i, run in enumerate(runs):
        for m in run.methods:
            labels[(i, m)] = m if seen[m] == 1 else f"{m} [{run.folder.name or run.folder}]"
    return labels


# -- comparison -------------------------------------------------------------------------------

@dataclass
class Comparison:
    baseline: str
    challenger: str
    won: list[tuple[str, str]]
    lost: list[tuple[str, str]]
    same: list[tuple[str, str]]
    rows: list[dict[str, Any]]

    def counts(self) -> dict[str, int]:
        return {"won": len(self.won), "lost": len(self.lost), "same": len(self.same)}


def _task_scores(records: Iterable[AttemptRecord]) -> dict[tuple[str, str], float]:
    by_task: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in records:
        by_task[(r.dataset, r.task_id)].append(r.correct)
    return {k: sum(v) / len(v) for k, v in by_task.items()}


def compare(baseline_name: str, baseline: Iterable[AttemptRecord], challenger_name: str,
            challenger: Iterable[AttemptRecord]) -> Comparison:
    """Per task (mean correctness over repeats), on the tasks both attempted: won where the
    challenger scores higher, lost where lower, same otherwise."""
    a, b = _task_scores(baseline), _task_scores(challenger)
    won, lost, same, rows = [], [], [], []
    for key in sorted(set(a) & set(b)):
        outcome = "won" if b[key] > a[key] else "lost" if b[key] < a[key] else "same"
        {"won": won, "lost": lost, "same": same}[outcome].append(key)
        rows.append({"baseline": baseline_name, "challenger": challenger_name, "dataset": key[0],
                     "task_id": key[1], "baseline_score": a[key], "challenger_score": b[key], "outcome": outcome})
    return Comparison(baseline_name, challenger_name, won, lost, same, rows)


def comparisons(runs: Sequence[Run], baseline: str | None = None) -> list[Comparison]:
    """Two or more runs: each method of the first run against the same method in each other run.
    One run: each method against the baseline method (default: the first)."""
    labels = _arm_labels(runs)
    out = []
    if len(runs) == 1:
        run = runs[0]
        methods = [m for m in run.methods if any(r.method == m for r in run.records)]
        if not methods:
            return []
        base = baseline or methods[0]
        if base not in methods:
            raise ValueError(f"baseline {base!r} is not a method of {run.folder}; methods: {methods}")
        base_records = [r for r in run.records if r.method == base]
        for m in methods:
            if m != base:
                out.append(compare(base, base_records, m, [r for r in run.records if r.method == m]))
        return out
    first = runs[0]
    for i, other in enumerate(runs[1:], 1):
        for m in first.methods:
            if baseline and m != baseline:
                continue
            a = [r for r in first.records if r.method == m]
            b = [r for r in other.records if r.method == m]
            if a and b:
                out.append(compare(labels[(0, m)], a, labels[(i, m)], b))
    return out


# -- rendering --------------------------------------------------------------------------------

def _pct(cell: Cell | None) -> str:
    if cell is None or cell.attempts == 0:
        return "-"
    text = f"{100 * cell.accuracy:.1f}"
    if cell.stderr is not None:
        text += f" ± {100 * cell.stderr:.1f}"
    return text


def markdown_accuracy(table: Table) -> str:
    columns = [table.labels.get(d, d) for d in table.datasets] + ["Avg."]
    lines = ["| Method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for m in table.methods:
        cells = [_pct(table.cell(m, d)) for d in table.datasets] + [_pct(table.average(m))]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_scorers(records: Sequence[AttemptRecord], table: Table, method_of=None) -> str:
    """Which scorer decided each cell, and the other numbers its benchmark reports (mean %), so
    that HotpotQA's F1 and GSM8K's strict match stand beside the accuracy they accompany."""
    method_of = method_of or (lambda r: r.method)
    groups: dict[tuple[str, str], list[AttemptRecord]] = defaultdict(list)
    for r in records:
        groups[(method_of(r), r.dataset)].append(r)
    lines = ["| Method | Dataset | Scorer | Other metrics (%) |", "|---|---|---|---|"]
    for m in table.methods:
        for d in table.datasets:
            group = groups.get((m, d))
            if not group:
                continue
            scorers = ", ".join(sorted({r.scorer for r in group if r.scorer})) or "-"
            names = list(dict.fromkeys(k for r in group for k in r.metrics))
            metrics = ", ".join(f"{k} {100 * statistics.fmean(r.metrics.get(k, 0.0) for r in group):.1f}"
                                for k in names) or "-"
            lines.append(f"| {m} | {table.labels.get(d, d)} | {scorers} | {metrics} |")
    return "\n".join(lines)


EFFICIENCY_COLUMNS = ("prompt_tokens", "completion_tokens", "steps", "stages", "reconfigurations", "wall_time")


def markdown_efficiency(table: Table) -> str:
    header = ("| Method | Tasks | Attempts | Prompt tok. | Completion tok. | Steps | Stages | Reconfig. | "
              "Wall (s) | ok / timeout / error |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for m in table.methods:
        c = table.average(m)
        if c is None:
            continue
        tasks = sum(x.tasks for (mm, _), x in table.cells.items() if mm == m)
        lines.append(f"| {m} | {tasks} | {c.attempts} | {c.prompt_tokens:,.0f} | {c.completion_tokens:,.0f} | "
                     f"{c.steps:.1f} | {c.stages:.2f} | {c.reconfigurations:.2f} | {c.wall_time:.1f} | "
                     f"{c.ok} / {c.timeout} / {c.error} |")
    return "\n".join(lines)


def markdown_comparison(comparison: Comparison, limit: int = 30) -> str:
    counts = comparison.counts()
    lines = [f"**{comparison.challenger}** against **{comparison.baseline}**: "
             f"won {counts['won']}, lost {counts['lost']}, same {counts['same']}"]
    for name in ("won", "lost"):
        keys = getattr(comparison, name)
        if keys:
            shown = ", ".join(f"{short_dataset(d)}/{t}" for d, t in keys[:limit])
            more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
            lines.append(f"- {name}: {shown}{more}")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


CELL_COLUMNS = ("method", "dataset", "tasks", "attempts", "repeats", "accuracy", "stderr", "ok", "timeout", "error")


def _cell_rows(table: Table, columns: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for m in table.methods:
        for d in table.datasets + [AVERAGE]:
            c = table.cell(m, d)
            if c is not None:
                row = c.to_dict()
                row["dataset"] = table.labels.get(d, d)
                rows.append({k: row[k] for k in columns})
    return rows


# -- plots ------------------------------------------------------------------------------------

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(table: Table, path: Path) -> None:
    plt = _pyplot()
    groups = table.datasets + [AVERAGE]
    width = 0.8 / max(1, len(table.methods))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(groups) + 0.3 * len(table.methods)), 4.5))
    for i, m in enumerate(table.methods):
        xs, ys, errs = [], [], []
        for j, d in enumerate(groups):
            c = table.cell(m, d)
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(100 * c.accuracy if c else 0.0)
            errs.append(100 * c.stderr if c and c.stderr is not None else 0.0)
        ax.bar(xs, ys, width, yerr=errs if any(errs) else None, label=m, capsize=2)
    ax.set_xticks(range(len(groups)), [table.labels.get(d, d) if d != AVERAGE else "Avg." for d in groups])
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small", ncol=min(4, len(table.methods)), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.set_title("Accuracy per method and dataset")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accuracy_vs_tokens(table: Table, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m in table.methods:
        c = table.average(m)
        if c is None:
            continue
        tokens = c.prompt_tokens + c.completion_tokens
        ax.scatter([tokens], [100 * c.accuracy], label=m, s=40)
    ax.set_xlabel("mean tokens per task (prompt + completion)")
    ax.set_ylabel("average accuracy (%)")
    ax.set_ylim(-5, 105)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("Accuracy against tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_stages(records: Sequence[AttemptRecord], methods: Sequence[str], path: Path, method_of=None) -> None:
    plt = _pyplot()
    method_of = method_of or (lambda r: r.method)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    top = max([r.stages for r in records] + [1])
    low = 0 if any(r.stages == 0 for r in records) else 1
    bins = [b - 0.5 for b in range(low, top + 2)]
    series = [[r.stages for r in records if method_of(r) == m] for m in methods]
    ax.hist(series, bins=bins, label=list(methods))
    ax.set_xlabel("stages per task")
    ax.set_ylabel("attempts")
    ax.set_xticks(range(low, top + 1))
    ax.legend(fontsize="small")
    ax.set_title("Stages per task")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the report -------------------------------------------------------------------------------

@dataclass
class ReportFiles:
    markdown: Path
    files: list[Path]
    table: Table
    comparisons: list[Comparison]
    runs: list[Run] = field(default_factory=list)


def write_report(dirs: Sequence[Path], out: Path | None = None, compare_runs: bool | None = None,
                 baseline: str | None = None) -> ReportFiles:
    """Write the report for the runs in `dirs` into `out` (default: the first run's folder,
    under `report/`)."""
    runs = [load_run(Path(d)) for d in dirs]
    out = Path(out) if out is not None else runs[0].folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    labels = _arm_labels(runs)
    records: list[AttemptRecord] = []
    label_of: dict[int, str] = {}
    for i, run in enumerate(runs):
        for r in run.records:
            label_of[id(r)] = labels[(i, r.method)]
            records.append(r)
    method_of = lambda r: label_of[id(r)]  # noqa: E731
    methods = [labels[(i, m)] for i, run in enumerate(runs) for m in run.methods]
    datasets = list(dict.fromkeys(d for run in runs for d in run.datasets))
    table = aggregate(records, methods, datasets, method_of=method_of)
    compare_runs = len(runs) > 1 if compare_runs is None else compare_runs
    found = comparisons(runs, baseline) if compare_runs else []

    files: list[Path] = []
    accuracy_csv = out / "accuracy.csv"
    write_csv(accuracy_csv, _cell_rows(table, CELL_COLUMNS), CELL_COLUMNS)
    efficiency_csv = out / "efficiency.csv"
    eff_columns = ("method", "dataset", "tasks", "attempts") + EFFICIENCY_COLUMNS
    write_csv(efficiency_csv, _cell_rows(table, eff_columns), eff_columns)
    files += [accuracy_csv, efficiency_csv]
    if found:
        comparison_csv = out / "comparison.csv"
        write_csv(comparison_csv, [row for c in found for row in c.rows],
                  ("baseline", "challenger", "dataset", "task_id", "baseline_score", "challenger_score", "outcome"))
        files.append(comparison_csv)

    plots: list[tuple[str, Path]] = []
    if records and _pyplot() is not None:
        for title, name, draw in (
            ("Accuracy per method and dataset", "accuracy.png", lambda p: plot_accuracy(table, p)),
            ("Accuracy against tokens", "accuracy_vs_tokens.png", lambda p: plot_accuracy_vs_tokens(table, p)),
            ("Stages per task", "stages.png", lambda p: plot_stages(records, table.methods, p, method_of)),
        ):
            draw(out / name)
            plots.append((title, out / name))
            files.append(out / name)

    md = ["# Evaluation report", ""]
    for run in runs:
        s = run.settings
        md.append(f"- `{run.folder}`: model `{s.get('model', '?')}`, split `{s.get('split', '?')}`, "
                  f"{len(run.records)} attempts, repeats {s.get('repeats', '?')}, timeout {s.get('timeout', '?')} s")
        preflight = run.folder / "preflight.json"  # needs the run was allowed to miss (`--allow-missing`)
        if preflight.exists():
            md += [f"  - **warning**: {w}" for w in json.loads(preflight.read_text(encoding="utf-8"))["warnings"]]
        md += [f"  - {line}" for line in run.history]
    repeats = max((c.repeats for c in table.cells.values()), default=1)
    md += ["", "## Accuracy (%)", "",
           "Mean over repeats ± standard error across repeats." if repeats > 1 else
           "One attempt per task; timeouts and errors count as wrong.", "", markdown_accuracy(table), "",
           "## Scorers", "", markdown_scorers(records, table, method_of), "",
           "## Efficiency (mean per task, all datasets)", "", markdown_efficiency(table), ""]
    if found:
        md += ["## Per-task comparison", ""]
        for c in found:
            md += [markdown_comparison(c), ""]
    if plots:
        md += ["## Plots", ""] + [f"![{title}]({path.name})" for title, path in plots] + [""]
    elif records:
        md += ["Plots need matplotlib (`pip install matplotlib`).", ""]
    markdown = out / "report.md"
    markdown.write_text("\n".join(md), encoding="utf-8")
    files.insert(0, markdown)
    return ReportFiles(markdown, files, table, found, runs)
