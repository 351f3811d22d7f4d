"""The CAT study: the paper's training claim as one resumable command.

For each seed, CAT (`pipeline.run_cat`) runs twice from the same teacher, budget and recipe:
once for ToolSelf and once for the vanilla agent, the control the paper's argument needs (does
CAT teach *reconfiguration*, or just the tasks?). Every model is evaluated on the same held-out
tasks (the suites' seed is fixed; the training seed varies what is trained on and how it is
sampled), so a row's spread over seeds is the recipe's, not the test set's. The zero-shot
student decodes greedily on those fixed tasks, so it is evaluated once, outside the pipelines.

    OUT/study.json                          the settings (checked on resume; seeds may be added)
    OUT/zero-shot/                          runner folder: the untrained student on the held-out tasks
    OUT/<method>/seed-<s>/                  one CAT pipeline folder each (state.json, rft/, kto/, eval/)
    OUT/results.md, OUT/*.png               the table (mean ± standard error over seeds) and plots
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

from toolself.train.pipeline import (STEPS, CATSettings, PipelineMismatch, State, evaluate, isolated, reread,
                                     run_cat, student_spec)
from toolself.train.settings import UNSET, AgentOverrides, KTOOverrides, Overrides, RFTOverrides, overriding

STUDY_FILE = "study.json"
BEGIN, END = "<!-- cat-study:begin -->", "<!-- cat-study:end -->"


@dataclass(frozen=True)
class Row:
    method: str
    model: str  # student | rft | kto: which model of the pipeline
    label: str


ROWS = (
    Row("toolself", "student", "ToolSelf, zero-shot"),
    Row("toolself", "rft", "ToolSelf + RFT"),
    Row("toolself", "kto", "ToolSelf + RFT + KTO"),
    Row("vanilla", "rft", "Vanilla + RFT"),
    Row("vanilla", "kto", "Vanilla + RFT + KTO"),
)


PER_PIPELINE = ("tasks", "eval_tasks", "method", "seed", "evaluate")
"""The CATSettings fields a study sets for each pipeline itself."""


@overriding(CATSettings, exclude=PER_PIPELINE)
class Recipe(Overrides):
    """The CATSettings fields every pipeline of a study shares (samples, budgets, training
    options), as set; the rest keep CATSettings' defaults."""

    what: ClassVar[str] = "CAT setting"

    def check(self) -> None:
        for name, record in (("agent", AgentOverrides), ("rft", RFTOverrides), ("kto", KTOOverrides)):
            if getattr(self, name) is not UNSET:
                object.__setattr__(self, name, record.from_dict(getattr(self, name)))
        CATSettings(tasks=[], **self.set_fields())


@dataclass
class StudySettings:
    """What defines a study (compared on resume); `cat` takes a Recipe or its dict."""

    train_tasks: list[str]
    eval_tasks: list[str]
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: ["toolself", "vanilla"])
    cat: Recipe = field(default_factory=Recipe)

    def __post_init__(self) -> None:
        self.cat = Recipe.from_dict(self.cat)

    def pipeline(self, method: str, seed: int) -> CATSettings:
        return CATSettings(tasks=list(self.train_tasks), eval_tasks=list(self.eval_tasks), method=method, seed=seed,
                           evaluate=("rft", "kto"), **self.cat.set_fields())

    def to_dict(self) -> dict[str, Any]:
        return {"train_tasks": list(self.train_tasks), "eval_tasks": list(self.eval_tasks), "seeds": list(self.seeds),
                "methods": list(self.methods), "cat": self.cat.to_dict()}


def pipeline_dir(out: Path, method: str, seed: int) -> Path:
    return out / method / f"seed-{seed}"


def run_study(settings: StudySettings, out: str | Path, *, force: bool = False,
              echo: Callable[[str], None] = print, backend: Any = "local", isolate: bool = False) -> dict[str, Any]:
    """Run (or resume) every pipeline, then write the table; returns its summary. isolate: each
    evaluation and pipeline step in a process of its own (`pipeline.isolated`)."""
    out = Path(out)
    claim(out, settings, force)
    zero_shot(settings, out, echo, backend, isolate)
    for seed in settings.seeds:
        for method in settings.methods:
            echo(f"== {method}, seed {seed} ==")
            run_cat(settings.pipeline(method, seed), pipeline_dir(out, method, seed), force=force, echo=echo,
                    backend=backend, isolate=isolate)
    return write_results(out, settings)


def _without_seeds(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != "seeds"}


def claim(out: Path, settings: StudySettings, force: bool = False) -> None:
    """Record the settings in `out`, refusing a folder that holds a study with other settings.
    Seeds may differ (the full study extends the demo's seed): each pipeline checks its own
    settings as it resumes."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / STUDY_FILE
    wanted = settings.to_dict()
    if path.is_file() and not force:
        saved = json.loads(path.read_text(encoding="utf-8"))
        recipe = _without_seeds(wanted)
        if _without_seeds(saved) != recipe and _without_seeds(reread(StudySettings, saved) or {}) != recipe:
            raise PipelineMismatch(f"{out} holds a CAT study with other settings; use another folder or force")
    path.write_text(json.dumps(wanted, indent=2) + "\n", encoding="utf-8")


def zero_shot(settings: StudySettings, out: Path, echo: Callable[[str], None], backend: Any,
              isolate: bool = False) -> None:
    cat = settings.pipeline(next(r.method for r in ROWS if r.model == "student"), settings.seeds[0])
    echo(f"== {cat.method}, zero-shot ==")
    if isolate:
        isolated(_evaluate_quietly, cat, student_spec(cat), out / "zero-shot", backend)
    else:
        evaluate(cat, student_spec(cat), out / "zero-shot", backend)


def _evaluate_quietly(*args: Any) -> None:
    """`evaluate` for a child process: the records are on disk, so nothing needs to come back."""
    evaluate(*args)


def study_records(out: Path, settings: StudySettings) -> list[Any]:
    """Every evaluation record of the study, renamed to its table row, with the seed's index
    as the repeat (so that the report's mean and standard error run over seeds)."""
    from toolself.evals.records import read_records, safe_name

    records = []
    for row in ROWS:
        if row.method not in settings.methods:
            continue
        for index, seed in enumerate(settings.seeds):
            if row.model == "student" and index:
                break
            folder = (out / "zero-shot" if row.model == "student" else pipeline_dir(out, row.method, seed) / "eval"
                      / row.model) / safe_name(row.method)
            if folder.is_dir():
                records += [replace(r, method=row.label, repeat=index) for r in read_records(folder)]
    return records


def pipeline_steps(out: Path, settings: StudySettings) -> dict[tuple[str, int], dict[str, Any]]:
    """The finished steps of every pipeline of the study, by (method, seed)."""
    return {(method, seed): State(pipeline_dir(out, method, seed)).data["steps"]
            for method in settings.methods for seed in settings.seeds}


def step_times(pipelines: dict[tuple[str, int], dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Seconds per pipeline step, summed over seeds, per method."""
    times: dict[str, dict[str, float]] = {}
    for (method, _), pipeline in pipelines.items():
        for step, info in pipeline.items():
            bucket = times.setdefault(method, {})
            bucket[step] = bucket.get(step, 0.0) + float(info.get("seconds", 0.0))
    return times


def write_results(out: Path, settings: StudySettings) -> dict[str, Any]:
    from toolself.evals.report import (aggregate, markdown_accuracy, markdown_efficiency, plot_accuracy,
                                       plot_accuracy_vs_tokens, short_dataset)

    records = study_records(out, settings)
    if not records:
        raise ValueError(f"{out} holds no evaluation records yet")
    datasets = list(settings.eval_tasks)
    table = aggregate(records, methods=[r.label for r in ROWS], datasets=datasets)
    plot_accuracy(table, out / "accuracy.png")
    plot_accuracy_vs_tokens(table, out / "accuracy_vs_tokens.png")
    pipelines = pipeline_steps(out, settings)
    times = step_times(pipelines)
    trained = ", ".join(short_dataset(t) for t in settings.train_tasks)
    lines = [
        f"Success rate (%) on the held-out split, mean ± standard error over seeds {settings.seeds} "
        f"(a cell without ± had one evaluation). Trained on {trained}; every suite evaluated.",
        "",
        markdown_accuracy(table),
        "",
        "Cost per attempt (means over every evaluated attempt):",
        "",
        markdown_efficiency(table),
        "",
        "Wall time per step, summed over seeds (minutes):",
        "",
        "| Method | " + " | ".join(s.replace("_", " ") for s in STEPS) + " | Total |",
        "|---|" + "---:|" * (len(STEPS) + 1),
    ]
    for method, steps in times.items():
        cells = [f"{steps.get(s, 0.0) / 60:.1f}" for s in STEPS]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {sum(steps.values()) / 60:.1f} |")
    for (method, seed), pipeline in pipelines.items():
        skipped = pipeline.get("kto", {}).get("result", {}).get("skipped")
        if skipped:
            lines += ["", f"KTO skipped for {method}, seed {seed}: {skipped}."]
    lines += ["", "![accuracy](accuracy.png)", ""]
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text, encoding="utf-8")
    summary = {"table": table.summary(), "minutes": {m: round(sum(s.values()) / 60, 1) for m, s in times.items()},
               "written_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return {"markdown": text, **summary}





def publish(out: Path, results_file: Path, markdown: str) -> Path:
    """Put the study's table into `results_file` between the study markers (the rest of the
    file, such as the experiments that chose the defaults, is kept), with the plots in a
    folder beside it named after it."""
    import shutil

    results_file = Path(results_file)
    images = results_file.with_suffix("")
    images.mkdir(parents=True, exist_ok=True)
    for png in ("accuracy.png", "accuracy_vs_tokens.png"):
        if (out / png).is_file():
            shutil.copyfile(out / png, images / png)
    block = markdown.replace("](accuracy.png)", f"]({images.name}/accuracy.png)")
    block = f"{BEGIN}\n{block}{END}"
    text = results_file.read_text(encoding="utf-8") if results_file.is_file() else f"# CAT on a CPU\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    results_file.write_text(text, encoding="utf-8")
    return results_file


TRAIN_SUITES = ["builtin:research", "builtin:data", "builtin:code"]
EVAL_SUITES = TRAIN_SUITES + ["builtin:mixed"]


def _recipe() -> Recipe:
    """The CAT settings of both presets: the smallest scale that learned anything on validation
    tasks (docs/notes/2026-12-03-x5-108-trajectories-two-epochs.md,
    docs/notes/2026-12-03-x8-two-thirds-of-the-data.md)."""
    return Recipe(
        teacher="expert", teacher_samples=1, limit=36, policy_samples=2, policy_limit=3, temperature=0.7,
        eval_limit=4, max_length=4096, concurrency=8, timeout=300.0, dtype="auto",
        agent=AgentOverrides(context_budget=2000, config_max_text=600, max_stages=3, max_steps_per_stage=6),
        rft=RFTOverrides(per_device_train_batch_size=1, gradient_accumulation_steps=4, num_train_epochs=2,
                         learning_rate=1e-3, lora_layers=12),
        # without recomputing the forward pass: docs/notes/2026-12-03-kto-without-recomputation.md
        kto=KTOOverrides(per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=6,
                         learning_rate=1e-4, lora_layers=12, extra={"activation_checkpointing": False}),
    )


def demo_preset() -> StudySettings:
    """One seed (`make cat-demo`); how long it takes: docs/results/cat-cpu.md and
    docs/notes/2026-12-04-cat-demo-from-a-fresh-clone.md."""
    return StudySettings(TRAIN_SUITES, EVAL_SUITES, seeds=[0], cat=_recipe())


def full_preset() -> StudySettings:
    """The demo's recipe over three seeds (rerun in the demo's folder, it adds seeds 1 and 2)."""
    settings = demo_preset()
    settings.seeds = [0, 1, 2]
    return settings


PRESETS: dict[str, Callable[[], StudySettings]] = {"demo": demo_preset, "full": full_preset}
