"""`toolself eval` and `toolself report`, as plain functions the main app registers:

    app.command("eval")(eval_command)
    app.command("report")(report_command)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from toolself.cli_errors import fail
from toolself.cli_options import (ToolOptions, preset_option, preset_pool, request_options, request_options_option,
                                  tool_options)
from toolself.evals.preflight import CheckingLoader, Provided
from toolself.interrupts import say_how_to_resume
from toolself.models.weights import DTYPE_HELP
from toolself.models.spec import ModelSpec

console = Console()


def _split_list(values: list[str]) -> list[str]:
    """`--methods a,b --methods c` -> [a, b, c] (a spec's own options are joined by `&`)."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


_fail = fail


def backend_option(backend: str, address: str | None = None, ray_cpus: float = 1.0):
    """The runner backend the `--backend`, `--address` and `--ray-cpus` options name (shared by
    `toolself eval` and the collection steps of `toolself train`)."""
    from toolself.evals.backends import LocalBackend, RayBackend, import_ray

    if backend == "local":
        if address is not None:
            raise ValueError("--address is for --backend ray")
        return LocalBackend()
    if backend == "ray":
        import_ray()  # a clear message before any work when ray is missing
        return RayBackend(address=address, num_cpus=ray_cpus)
    raise ValueError(f"unknown backend {backend!r}; expected local or ray")


@tool_options
@say_how_to_resume
def eval_command(
    tasks: list[str] = typer.Option(..., "--tasks", "-t", help="Dataset specs, comma-separated or repeated: "
                                    "builtin:research, gaia:PATH, frames:PATH, swebench:PATH, jsonl:PATH, ..."),
    methods: list[str] = typer.Option(["toolself"], "--methods", help="Methods, comma-separated (see `toolself methods`), or `all`."),
    model: str = typer.Option("embedded", "--model", "-m",
                              help="embedded | embedded:cat | local:PATH | openai:NAME@URL | expert; several servers "
                                   "of one model: openai:NAME@URL1,URL2 (URL#N: at most N in flight there)"),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder; rerunning the same command resumes it."),
    config_model: Optional[str] = typer.Option(None, help="For `decoupled`: the model that writes configurations."),
    concurrency: int = typer.Option(4, min=1, help="Attempts in flight at once."),
    timeout: float = typer.Option(600.0, min=0, help="Wall-clock limit per attempt, in seconds (0: none)."),
    grace: Optional[float] = typer.Option(None, min=0, help="Seconds past the limit before a stuck attempt is "
                                          "abandoned (default: a quarter of the timeout, at least 5 s)."),
    limit: Optional[int] = typer.Option(None, min=1, help="At most this many tasks per dataset (default: all)."),
    repeats: int = typer.Option(1, min=1, help="Attempts per task, for mean and standard error."),
    freeze: list[str] = typer.Option([], help="Ablation for every method: subgoal, strategy, toolbox, knowledge, mode."),
    split: str = typer.Option("heldout", help="Split of the built-in suites (train | heldout) or of a file."),
    seed: int = typer.Option(0, help="Seed for generated suites and shuffling."),
    max_stages: int = typer.Option(6, min=1, help="Most stages per attempt."),
    max_steps: int = typer.Option(12, min=1, help="Most actions per stage."),
    max_tokens: int = typer.Option(200_000, min=1, help="Most prompt + completion tokens per attempt."),
    context_budget: Optional[int] = typer.Option(None, min=1, help="Visible-context budget in the model's tokens "
                                                 "(default: 3000 for the embedded model and local ones under 1B "
                                                 "parameters, else 16000)."),
    temperature: float = typer.Option(0.0, min=0, help="Sampling temperature of the policy (0: greedy)."),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    request: Optional[str] = request_options_option(),
    force: bool = typer.Option(False, help="Add to an output folder made under other settings."),
    retry_errors: bool = typer.Option(True, "--retry-errors/--keep-errors",
                                      help="On a rerun, run again the attempts that ended in an error (a model "
                                           "server down, a judge failing); their records move to METHOD/errors.jsonl."),
    stop_after_errors: Optional[int] = typer.Option(None, min=0, help="Stop once this many attempts in a row ended "
                                                    "in an error, leaving the rest for a rerun (default: the "
                                                    "concurrency, at least 5; 0: never)."),
    report: bool = typer.Option(True, help="Write the report into OUT/report when the run ends."),
    backend: str = typer.Option("local", help="Where attempts run: local (threads here) | ray (Ray tasks)."),
    address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, ray://HOST:10001); default: a local one."),
    ray_cpus: float = typer.Option(1.0, min=0.01, help="Ray CPUs each attempt holds (fractions let I/O-bound attempts "
                                   "share cores)."),
    preset: Optional[str] = preset_option(),
    tool_options: ToolOptions = ToolOptions(),
) -> None:
    """Run methods on datasets; resumable, with per-attempt timeouts and a live progress line.
    Every task's needs (web search, page reading, a judge, ...) are checked before any work."""
    from toolself.evals.cli import check_spec
    from toolself.evals.records import atomic_write_text
    from toolself.evals.report import markdown_accuracy, write_report
    from toolself.evals.runner import RunInProgress, SettingsMismatch, run_eval
    from toolself.variants import load_run_preset

    try:
        run_preset = load_run_preset(preset) if preset else None
    except ValueError as exc:
        _fail(str(exc))
    specs, names = _split_list(tasks), _split_list(methods)
    for spec in specs:
        try:
            check_spec(spec)
        except ValueError as exc:
            _fail(str(exc))
    policy, judge, writer = (_model_spec(option, spec) for option, spec in (
        ("--model", model), ("--judge", tool_options.judge), ("--config-model", config_model)))
    if names == ["all"]:
        from toolself.variants import methods as all_methods

        names = [m.name for m in all_methods()]
    settings = {"max_stages": max_stages, "max_steps_per_stage": max_steps, "max_total_tokens": max_tokens}
    if context_budget is not None:
        settings["context_budget"] = context_budget
    options = policy.options(temperature, seed, dtype)
    if run_preset is not None:
        settings.update(run_preset.settings())
        options.update(run_preset.model_options(model))
        timeout = run_preset.timeout
        judge = run_preset.judge(judge)
    options = request_options(policy, options, request)
    fresh = not (out / "run.json").exists()
    tool_options = tool_options.with_cache(out / "web_cache")
    pool = preset_pool(tool_options, run_preset)
    loader = CheckingLoader(Provided.of(pool, tool_options.web, tool_options.judge, tool_options.docs),
                            tool_options.allow_missing)
    try:
        runner_backend = backend_option(backend, address, ray_cpus)
        summary = run_eval(specs, names, policy, out, concurrency=concurrency, timeout=timeout or None, grace=grace,
                           limit=limit, repeats=repeats, judge=judge, freeze=tuple(freeze),
                           config_model=writer, split=split, seed=seed, force=force, settings=settings,
                           model_options=options, backend=runner_backend, pool=pool,
                           loader=run_preset.retarget(loader) if run_preset else loader, retry_errors=retry_errors,
                           stop_after_errors=stop_after_errors)
    except (SettingsMismatch, RunInProgress) as exc:
        _fail(str(exc))
    except (ValueError, FileNotFoundError, ImportError) as exc:
        _forget_empty_run(out, fresh)
        _fail(str(exc))
    except Exception:
        _forget_empty_run(out, fresh)
        raise
    finally:
        pool.close()
    for warning in loader.warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False)
    if loader.warnings:
        atomic_write_text(out / "preflight.json", json.dumps({"warnings": loader.warnings}, indent=2) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(summary.to_dict(), indent=2) + "\n")
    status = ", ".join(f"{n} {s}" for s, n in summary.status.items())
    if summary.retried:
        status += f"; {summary.retried} again after an earlier error"
    console.print(f"ran {summary.ran} attempts ({status}), skipped {summary.skipped} finished earlier, "
                  f"{summary.wall_time:.1f} s", highlight=False)
    for who, fields in summary.refused_fields().items():
        console.print(f"warning: the {who}'s server refused {', '.join(fields)}: those requests went without them, "
                      "at the server's defaults", highlight=False, markup=False)
    console.print(markdown_accuracy(summary.table), highlight=False, markup=False)
    console.print(f"summary: {out / 'summary.json'}", highlight=False)
    if report and summary.records:
        files = write_report([out])
        console.print(f"report: {files.markdown}")
    if summary.ran and summary.status.get("error", 0) == summary.ran:
        last = [r for r in summary.records if r.status == "error"][-1].error_line
        _fail(f"every attempt of this run failed ({summary.ran}); the last: {last}", code=1)


def _model_spec(option: str, spec: str | None) -> ModelSpec | None:
    """The spec parsed, here at the edge; a `local:PATH` that is not there is caught before the
    run writes anything."""
    if not spec:
        return None
    try:
        parsed = ModelSpec.parse(spec)
    except ValueError as exc:
        _fail(f"{option}: {exc}")
    if parsed.kind == "local" and not Path(str(parsed.path)).expanduser().exists():
        _fail(f"{option} {spec}: no model directory at {parsed.path}")
    return parsed


def _forget_empty_run(out: Path, fresh: bool) -> None:
    """A run that failed before any result (a model that would not load) leaves no run.json
    behind: its settings would make the corrected rerun refuse the folder."""
    if fresh and not any(p.stat().st_size for p in out.glob("*/results.jsonl")):
        (out / "run.json").unlink(missing_ok=True)


def report_command(
    dirs: list[Path] = typer.Argument(..., help="Eval output folders."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Report folder (default: DIR/report of the first)."),
    compare: Optional[bool] = typer.Option(None, "--compare/--no-compare",
                                           help="Per-task won / lost / same (default: on for several folders)."),
    baseline: Optional[str] = typer.Option(None, help="Method to compare against (default: the first)."),
) -> None:
    """Tables (Markdown, CSV) and plots (PNG) from one or more eval runs; compare runs per task."""
    from toolself.evals.report import markdown_accuracy, markdown_comparison, write_report

    try:
        files = write_report(dirs, out, compare_runs=compare, baseline=baseline)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    console.print(markdown_accuracy(files.table), highlight=False, markup=False)
    for run in files.runs:
        for line in run.history:
            console.print(f"{run.folder}: {line}", highlight=False, markup=False, soft_wrap=True)
    for c in files.comparisons:
        console.print(markdown_comparison(c, limit=10), highlight=False, markup=False)
    console.print("wrote " + ", ".join(str(p) for p in files.files), highlight=False)
