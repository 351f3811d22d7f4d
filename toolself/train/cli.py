"""`toolself train ...`: data, rft, kto, cat, merge, plot (mounted as a typer sub-app:
`app.add_typer(train_app, name="train")`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from toolself.cli_errors import fail, json_object_option, warn
from toolself.cli_options import ToolOptions, preset_option, tool_options
from toolself.interrupts import say_how_to_resume
from toolself.models.weights import DTYPE_HELP
from toolself.train.stage_options import KTOOptions, RFTOptions, stage_options

if TYPE_CHECKING:
    from toolself.models.protocol import TextProtocol
    from toolself.train.steps import Built, Collection
    from toolself.variants import RunPreset

train_app = typer.Typer(help="CAT training: RFT on a teacher's successes, then trajectory-level KTO.",
                        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()

TASKS_HELP = "Task specs, comma-separated or repeated (builtin:research, gaia:PATH, jsonl:PATH, ...)."
# The options `train rft` and `train kto` share.
LIMIT = typer.Option(None, min=1, help="At most this many tasks per spec (default: all).")
SEED = typer.Option(0, help="Seed of the built-in suites, of sampling and of training.")
CONCURRENCY = typer.Option(4, min=1, help="Attempts in flight during collection.")
TIMEOUT = typer.Option(600.0, min=1, help="Wall-clock limit per attempt, in seconds.")
RESUME = typer.Option(True, help="Rerunning the command resumes: the collection keeps its finished attempts, "
                                 "training its last checkpoint in OUT/checkpoints, and a finished training is not "
                                 "redone. A run with another base, data or settings in OUT is refused; --no-resume "
                                 "trains from the start, replacing it.")
BACKEND = typer.Option("local", help="Where collection attempts run: local | ray.")
ADDRESS = typer.Option(None, help="Ray cluster to join (auto, ray://HOST:10001).")
RAY_CPUS = typer.Option(1.0, min=0.01, help="Ray CPUs each attempt holds.")
RENDER_PRESET_HELP = ("Render the data as a run preset's policy is prompted (paper: the authors' text protocol, "
                      "<think> kept); the preset's name is saved with the data.")
PRESET = typer.Option(None, "--preset", help="A run preset (paper): its agent settings, sampling, timeout, tool-call "
                      "protocol, tools and scorer for the collection, and its protocol for rendering the data (saved "
                      "with the data).")


def _main_process() -> bool:
    """Under `accelerate launch` every process runs the command; only rank 0 writes shared files."""
    return os.environ.get("RANK", "0") == "0"


_fail = fail


def _split(values: list[str]) -> list[str]:
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def _run_preset(name: Optional[str]) -> Optional[RunPreset]:
    from toolself.variants import load_run_preset

    try:
        return load_run_preset(name) if name else None
    except ValueError as exc:
        _fail(str(exc))


def _rendering(preset: Optional[RunPreset]) -> TextProtocol:
    from toolself.train.steps import rendering

    return rendering(preset)


def _tools_record(options: ToolOptions) -> dict[str, Any]:
    """The options as the pipeline stores them; empty when they are the defaults, so that runs
    made before these options existed still resume."""
    return options.to_dict() if options != ToolOptions.parse() else {}


def _preflight(options: ToolOptions, specs: list[tuple[str, str, Optional[int], int]]) -> None:
    from toolself.evals.preflight import check_specs

    try:
        warnings = check_specs(options, specs)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False, highlight=False)


def _warn_truncated(build: Any, max_length: int) -> None:
    """A cut example trains on less than its attempt saw: say so, with the count, since a
    --max-length below the data's lengths can silently cut every example."""
    if build.truncated:
        warn(f"--max-length {max_length} cut {build.truncated} of {build.examples} examples from the left; "
             "`toolself train data --stats` shows their lengths")


def _print_stats(title: str, stats: dict[str, Any]) -> None:
    table = Table(title=title, show_header=True)
    table.add_column("what")
    table.add_column("value", overflow="fold")
    build = stats["build"]
    for key in ("trajectories", "skipped_trajectories", "decisions", "examples", "truncated", "recorded_ids",
                "prompt_mismatches", "masked_rejected"):
        table.add_row(key.replace("_", " "), str(build[key]))
    for key in ("sequence_tokens", "loss_tokens", "prompt_tokens", "completion_tokens"):
        if key in stats:
            s = stats[key]
            row = "none" if not s.get("count") else (f"min {s['min']}  median {s['median']}  p90 {s['p90']}  "
                                                    f"max {s['max']}  total {s['total']}")
            table.add_row(key.replace("_", " "), row)
    if "labels" in stats:
        table.add_row("labels", f"desirable {stats['labels']['desirable']}  undesirable {stats['labels']['undesirable']}")
        w = stats["weights"]
        table.add_row("KTO weights", f"desirable {w['desirable_weight']}  undesirable {w['undesirable_weight']}  "
                                     f"(weighted ratio {w['ratio']})")
        for kind, counts in stats["by_kind"].items():
            table.add_row(f"  {kind}", f"desirable {counts['desirable']}  undesirable {counts['undesirable']}")
    for note in build.get("notes", []):
        table.add_row("note", note)
    console.print(table)


@train_app.command()
def data(
    sources: list[Path] = typer.Argument(..., help="Trajectory JSONL files (labelled by metadata.correct) or "
                                                   "evaluation-runner folders (labelled by their results)."),
    kind: str = typer.Option("both", help="sft | kto | both."),
    student: str = typer.Option("embedded", help="The model whose tokenizer and chat template render the data."),
    out: Optional[Path] = typer.Option(None, help="Save the datasets here (OUT/sft, OUT/kto)."),
    max_length: int = typer.Option(16384, min=16, help="Longest example in tokens; longer prompts are cut from the "
                                   "left, with a warning that says how many were."),
    stats: bool = typer.Option(False, "--stats", help="Print counts, token lengths and label balance."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
    preset: Optional[str] = typer.Option(None, "--preset", help=RENDER_PRESET_HELP),
) -> None:
    """Build SFT (RFT) and KTO datasets from trajectories."""
    from toolself.train.data import RenderError, save_dataset
    from toolself.train.steps import kto_data, load_sources, sft_data

    if kind not in ("sft", "kto", "both"):
        _fail("--kind must be sft, kto or both")
    protocol = _rendering(_run_preset(preset))
    weights = _weights(student)
    try:
        trajectories, schemas = load_sources(sources)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    report: dict[str, Any] = {}
    try:
        for name, build in (("sft", sft_data), ("kto", kto_data)):
            if kind in (name, "both"):
                built = build(trajectories, schemas, weights, max_length, protocol)
                built.info["preset"] = preset
                _warn_truncated(built.build, max_length)
                report[name] = built.info
                if out:
                    save_dataset(built.dataset, out / name, built.info)
    except RenderError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(report, indent=2))
    elif stats or not out:
        for name, s in report.items():
            _print_stats(f"{name.upper()} data from {len(trajectories)} trajectories", s)
    if out:
        console.print(f"datasets written to {out}")


def _weights(spec: str) -> Path:
    """The directory a student or policy given on the command line trains from."""
    from toolself.models.spec import ModelSpec

    try:
        return ModelSpec.parse(spec, directories=True).weights()
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))


def _training_data(collection: Collection, trajectories: list[Path], model: str, out: Path,
                   build: Callable[..., Built], trained: str, max_length: int,
                   backend: tuple[str, Optional[str], float]) -> tuple[list[Any], Built, Path]:
    """`train rft` and `train kto` alike: collect with `model` (or take the given trajectories),
    render them with `build` (`steps.sft_data`, `steps.kto_data`), the tokenizer of the model
    being `trained` and the text protocol of the collection's preset, noting the preset's name
    in the data's info; returns the trajectories, the `steps.Built` data and the trained model's
    weights."""
    from toolself.train.steps import load_sources

    if not collection.tasks and not trajectories:
        _fail("give --tasks to collect, or --trajectories")
    weights = _weights(trained)
    if collection.tasks and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _fail("under accelerate launch, collect first in a single process (`toolself eval ... --split train "
              "--repeats K`, see docs/training.md) and pass the folder with --trajectories")
    sources = list(trajectories)
    if collection.tasks:
        _collect(model, out / "collect", collection, _backend(*backend))
        sources.append(out / "collect")
    found, schemas = load_sources(sources)
    built = build(found, schemas, weights, max_length, _rendering(_run_preset(collection.preset)))
    built.info["preset"] = collection.preset
    _warn_truncated(built.build, max_length)
    for note in built.build.notes:
        warn(note)
    return found, built, weights


def _train(step: Callable[..., Any], built: Built, base: Path, out: Path, config: Any, resume: bool) -> Any:
    """Train, saving the data in OUT/data once the run is known to stand: not while a run that
    is then refused still holds the folder."""
    from toolself.train.data import save_dataset
    from toolself.train.reruns import TrainingMismatch

    def save_data() -> None:
        if _main_process():
            save_dataset(built.dataset, out / "data", built.info)

    try:
        return step(built.dataset, base, out, config, resume=resume, before_training=save_data)
    except TrainingMismatch as exc:
        _fail(str(exc))


def _say_if_finished_earlier(result: Any, out: Path) -> None:
    if result.extra.get("finished_earlier"):
        console.print(f"{out} already holds this run's trained model (same base, data and settings): nothing "
                      "to train; --no-resume trains it again", markup=False, highlight=False)


def _collect(model: str, run_dir: Path, collection: Collection, backend: Any) -> None:
    from toolself.models.spec import ModelSpec
    from toolself.train.steps import collect_attempts

    try:
        spec = ModelSpec.parse(model, directories=True)
    except ValueError as exc:
        _fail(str(exc))
    result = collect_attempts(spec, run_dir, collection, backend=backend)
    console.print(f"collected {result.attempts} attempts ({result.correct} correct, {result.errors} errors) "
                  f"in {run_dir}")


def _backend(backend: str, address: Optional[str], ray_cpus: float) -> Any:
    from toolself.evals.eval_cli import backend_option

    try:
        return backend_option(backend, address, ray_cpus)
    except (ValueError, ImportError) as exc:
        _fail(str(exc))


def _collection(tasks: list[str], student: str, samples: int, limit: Optional[int], temperature: float,
                seed: int, concurrency: int, timeout: float, context_budget: Optional[int],
                preset: Optional[str]) -> Collection:
    """How `train rft` and `train kto` collect: under the budgets of the model being trained and
    the preset's settings, sampling and timeout (its tools and scorer: `steps.AttemptTools`)."""
    from toolself.models.spec import ModelSpec
    from toolself.train.settings import AgentOverrides
    from toolself.train.steps import Collection, agent_budgets

    run_preset = _run_preset(preset)
    try:
        budgets = agent_budgets(ModelSpec.parse(student, directories=True),
                                AgentOverrides(context_budget=context_budget) if context_budget else None, run_preset)
    except ValueError as exc:
        _fail(str(exc))
    if run_preset is not None:
        temperature, timeout = run_preset.sampling.temperature, run_preset.timeout
    return Collection(tasks=tasks, samples=samples, limit=limit, temperature=temperature, seed=seed,
                      concurrency=concurrency, timeout=timeout, agent=budgets, preset=preset)


@train_app.command()
@say_how_to_resume
@stage_options(RFTOptions)
def rft(
    tasks: list[str] = typer.Option([], "--tasks", "-t", help=TASKS_HELP),
    teacher: str = typer.Option("expert", help="expert (built-in suites) | embedded | embedded:cat | local:DIR | "
                                               "openai:NAME@URL."),
    samples: int = typer.Option(4, help="Attempts per task by the teacher (K)."),
    student: str = typer.Option("embedded", help="The model to fine-tune: embedded | local:DIR | a model directory."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: the adapter, collect/, data/, logs, curves."),
    trajectories: list[Path] = typer.Option([], help="Use these trajectories (JSONL / runner folders) instead of "
                                                     "collecting."),
    limit: Optional[int] = LIMIT,
    temperature: float = typer.Option(0.7, min=0, help="Teacher sampling temperature (for model teachers)."),
    seed: int = SEED,
    concurrency: int = CONCURRENCY,
    timeout: float = TIMEOUT,
    context_budget: Optional[int] = typer.Option(None, min=1, help="Visible-context budget (default: the student's)."),
    max_length: int = typer.Option(16384, min=16, help="Longest training sequence in tokens; a longer example is "
                                   "cut from the left, with a warning that says how many were."),
    resume: bool = RESUME,
    backend: str = BACKEND,
    address: Optional[str] = ADDRESS,
    ray_cpus: float = RAY_CPUS,
    preset: Optional[str] = PRESET,
    training: RFTOptions = RFTOptions(),
) -> None:
    """Stage I: K teacher attempts per task, keep the successful ones, fine-tune the student."""
    from toolself.train.rft_config import RFTConfig
    from toolself.train.steps import sft_data, train_rft_step

    collection = _collection(_split(tasks), student, samples, limit, temperature, seed, concurrency, timeout,
                             context_budget, preset)
    found, built, student_path = _training_data(collection, trajectories, teacher, out, sft_data, student,
                                                max_length, (backend, address, ray_cpus))
    dataset, build = built.dataset, built.build
    _print_stats(f"RFT data: {build.trajectories} successful of {len(found)} attempts", built.info)
    if len(dataset) == 0:
        _fail("no successful trajectory: nothing to fine-tune on")
    config = RFTConfig(output_dir=str(out / "checkpoints"), max_length=max_length, seed=seed,
                       **dataclasses.asdict(training))
    result, png = _train(train_rft_step, built, student_path, out, config, resume)
    if not _main_process():
        return
    _say_if_finished_earlier(result, out)
    console.print(f"RFT done: {result.steps} steps, loss {result.train_loss:.4f}, {result.tokens_per_second} tokens/s")
    console.print(f"model: --model local:{out}   log: {result.log}   curves: {png}")


@train_app.command()
@say_how_to_resume
@stage_options(KTOOptions)
def kto(
    policy: Path = typer.Option(..., help="The RFT adapter (or a model directory) to improve."),
    tasks: list[str] = typer.Option([], "--tasks", "-t", help=TASKS_HELP),
    samples: int = typer.Option(4, help="On-policy attempts per task (K)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: the adapter, base/, collect/, data/, logs."),
    trajectories: list[Path] = typer.Option([], help="Use these labelled trajectories instead of collecting."),
    limit: Optional[int] = LIMIT,
    temperature: float = typer.Option(0.7, min=0, help="Sampling temperature of the on-policy attempts."),
    seed: int = SEED,
    concurrency: int = CONCURRENCY,
    timeout: float = TIMEOUT,
    context_budget: Optional[int] = typer.Option(None, min=1, help="Visible-context budget (default: the policy's)."),
    max_length: int = typer.Option(16384, min=16, help="Longest prompt + completion in tokens; a longer example is "
                                   "cut from the left, with a warning that says how many were."),
    resume: bool = RESUME,
    backend: str = BACKEND,
    address: Optional[str] = ADDRESS,
    ray_cpus: float = RAY_CPUS,
    preset: Optional[str] = PRESET,
    training: KTOOptions = KTOOptions(),
) -> None:
    """Stage II: on-policy attempts labelled by outcome; every decision gets its attempt's label."""
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.steps import kto_data, train_kto_step

    if not ((policy / "adapter_config.json").is_file() or (policy / "config.json").is_file()):
        _fail(f"{policy} is neither an adapter nor a model directory")
    collection = _collection(_split(tasks), f"local:{policy}", samples, limit, temperature, seed, concurrency,
                             timeout, context_budget, preset)
    _, built, _ = _training_data(collection, trajectories, f"local:{policy}", out, kto_data, f"local:{policy}",
                                 max_length, (backend, address, ray_cpus))
    _print_stats(f"KTO data from {built.build.trajectories} attempts", built.info)
    try:
        config = CATKTOConfig(output_dir=str(out / "checkpoints"), max_length=max_length, seed=seed,
                              **dataclasses.asdict(training))
    except ValueError as exc:
        _fail(str(exc))
    result, png = _train(train_kto_step, built, policy, out, config, resume)
    if not _main_process():
        return
    _say_if_finished_earlier(result, out)
    console.print(f"KTO done: {result.steps} steps, loss {result.train_loss:.4f}, {result.tokens_per_second} tokens/s, "
                  f"weights {result.extra['weights']}")
    console.print(f"model: --model local:{out}   log: {result.log}   curves: {png}")


@train_app.command("cat")
@tool_options
@say_how_to_resume
def cat_command(
    tasks: list[str] = typer.Option(..., "--tasks", "-t", help=TASKS_HELP + " Train split for collection."),
    out: Path = typer.Option(..., "--out", "-o", help="Pipeline folder (state.json; rerun to resume)."),
    teacher: str = typer.Option("expert", help="expert | embedded | embedded:cat | local:DIR | openai:NAME@URL."),
    student: str = typer.Option("embedded", help="embedded | local:DIR | a model directory."),
    teacher_samples: int = typer.Option(4, min=1, help="Teacher attempts per task (RFT)."),
    policy_samples: int = typer.Option(4, min=1, help="RFT-policy attempts per task (KTO)."),
    limit: Optional[int] = typer.Option(None, min=1, help="At most this many training tasks per spec (default: all)."),
    policy_limit: Optional[int] = typer.Option(None, min=1, help="Training tasks per spec for the on-policy "
                                                                 "collection (default: --limit)."),
    eval_tasks: list[str] = typer.Option([], help="Specs for the final evaluation (default: --tasks), held-out split."),
    eval_limit: Optional[int] = typer.Option(None, min=1, help="At most this many evaluation tasks per spec "
                                                               "(default: all)."),
    temperature: float = typer.Option(0.7, min=0, help="Sampling temperature of model collections."),
    seed: int = typer.Option(0, help="Seed of the built-in suites, of sampling and of training."),
    concurrency: int = typer.Option(4, min=1, help="Attempts in flight during collections and evaluations."),
    timeout: float = typer.Option(600.0, min=1, help="Wall-clock limit per attempt, in seconds."),
    max_length: int = typer.Option(16384, min=16, help="Longest training example in tokens (both stages)."),
    method: str = typer.Option("toolself", help="The agent trained and evaluated: toolself, or vanilla (the "
                                                "static-configuration control)."),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    rft_options: str = typer.Option("{}", help='RFTConfig fields as JSON, e.g. \'{"num_train_epochs": 3}\'.'),
    kto_options: str = typer.Option("{}", help='KTOConfig fields as JSON, e.g. \'{"beta": 0.2}\'.'),
    agent_options: str = typer.Option("{}", help='Agent settings as JSON, e.g. \'{"max_stages": 4}\' (over the '
                                            "student's budgets and the preset's settings)."),
    stop_after: Optional[str] = typer.Option(None, help="Stop after this step (collect_teacher, data_sft, rft, "
                                                        "collect_policy, data_kto, kto, evaluate)."),
    force: bool = typer.Option(False, help="Continue a folder made with other settings."),
    backend: str = typer.Option("local", help="Where collection attempts run: local | ray."),
    address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, ray://HOST:10001)."),
    ray_cpus: float = typer.Option(1.0, help="Ray CPUs each attempt holds."),
    vllm: Optional[str] = typer.Option(None, help="Serve the RFT and KTO adapters with this vLLM command (vllm) "
                                                  "for the on-policy collection and the evaluations, one server "
                                                  "at a time, none while training (default: toolself's engine)."),
    vllm_port: int = typer.Option(8001, min=1, max=65535, help="Port of the --vllm server."),
    preset: Optional[str] = preset_option(),
    tool_options: ToolOptions = ToolOptions(),
) -> None:
    """CAT end to end: collect -> RFT -> collect -> KTO -> evaluate, resumable step by step.
    Every task's needs (web search, a judge, ...) are checked before any work. `--preset` sets
    the agent's settings, the sampling, the timeout and the tool-call protocol of every model the
    run loads, the tools and scorer of every attempt, and the protocol the data is rendered in."""
    from toolself.train.pipeline import CATSettings, PipelineMismatch, StepDied, run_cat
    from toolself.train.served import AdapterServer, ServerError, max_lora_rank

    run_preset = _run_preset(preset)
    if run_preset is not None:
        temperature, timeout = run_preset.sampling.temperature, run_preset.timeout
    try:
        settings = CATSettings(tasks=_split(tasks), teacher=teacher, student=student, teacher_samples=teacher_samples,
                               policy_samples=policy_samples, limit=limit, policy_limit=policy_limit,
                               eval_tasks=_split(eval_tasks) or None,
                               eval_limit=eval_limit, temperature=temperature, seed=seed, max_length=max_length,
                               method=method, dtype=dtype, agent=json_object_option("--agent-options", agent_options),
                               rft=json_object_option("--rft-options", rft_options),
                               kto=json_object_option("--kto-options", kto_options), concurrency=concurrency,
                               timeout=timeout, tools=_tools_record(tool_options), preset=preset)
    except ValueError as exc:
        _fail(str(exc))
    _preflight(tool_options, [(s, "train", limit, seed) for s in settings.tasks]
               + [(s, "heldout", eval_limit, settings.eval_seed) for s in settings.eval_tasks or settings.tasks])
    server = None
    if vllm is not None:
        if shutil.which(vllm) is None:
            _fail(f"--vllm {vllm}: no such command")
        if settings.rft.to_dict().get("full_finetune"):
            _fail("--vllm serves LoRA adapters, and full_finetune trains none")
        for stage, options in (("--rft-options", settings.rft), ("--kto-options", settings.kto)):
            try:
                max_lora_rank(options.to_dict().get("lora_r", 1))  # the default rank is served
            except ServerError as exc:
                _fail(f"{stage}: {exc}")
        server = AdapterServer(vllm, vllm_port)
    try:
        results = run_cat(settings, out, force=force, stop_after=stop_after,
                          echo=lambda line: console.print(line, markup=False, highlight=False),
                          backend=_backend(backend, address, ray_cpus), isolate=True, server=server)
    except (PipelineMismatch, ValueError, FileNotFoundError, StepDied, ServerError) as exc:
        _fail(str(exc))
    if "evaluate" in results:
        console.print_json(json.dumps(results["evaluate"]))


@train_app.command("study")
@tool_options
@say_how_to_resume
def study_command(
    out: Path = typer.Option(Path("runs/cat-study"), "--out", "-o", help="Study folder (rerun to resume)."),
    preset: str = typer.Option("demo", help="Scale: demo (one seed, the `make cat-demo` run) | full (three seeds)."),
    seeds: Optional[str] = typer.Option(None, help="Comma-separated training seeds (default: the preset's)."),
    results: Optional[Path] = typer.Option(None, help="Also write the table into this Markdown file (between "
                                                      "markers; the rest of the file is kept), plots beside it."),
    concurrency: Optional[int] = typer.Option(None, help="Attempts in flight (default: the preset's)."),
    force: bool = typer.Option(False, help="Continue a folder made with other settings."),
    backend: str = typer.Option("local", help="Where collection and evaluation attempts run: local | ray."),
    address: Optional[str] = typer.Option(None, help="Ray cluster to join (auto, ray://HOST:10001)."),
    tool_options: ToolOptions = ToolOptions(),
) -> None:
    """The paper's training claim on the built-in suites: CAT for ToolSelf and for the vanilla
    agent (same teacher, budget, recipe), trained on research, data and code, evaluated on all
    four held-out suites; prints and writes the table."""
    from toolself.train.pipeline import PipelineMismatch, StepDied
    from toolself.train.study import PRESETS, publish, run_study

    if preset not in PRESETS:
        _fail(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    settings = PRESETS[preset]()
    if seeds:
        try:
            settings.seeds = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            _fail(f"--seeds takes comma-separated integers, not {seeds!r}")
    if concurrency is not None:
        settings.cat = replace(settings.cat, concurrency=concurrency)
    if _tools_record(tool_options):
        settings.cat = replace(settings.cat, tools=_tools_record(tool_options))
    shared = settings.pipeline(settings.methods[0], settings.seeds[0])
    _preflight(tool_options, [(s, "train", shared.limit, 0) for s in settings.train_tasks]
               + [(s, "heldout", shared.eval_limit, 0) for s in settings.eval_tasks])
    try:
        summary = run_study(settings, out, force=force, backend=_backend(backend, address, 1.0),
                            echo=lambda line: console.print(line, markup=False, highlight=False), isolate=True)
    except (PipelineMismatch, ValueError, FileNotFoundError, StepDied) as exc:
        _fail(str(exc))
    console.print(summary["markdown"], markup=False, highlight=False)
    console.print(f"table: {out / 'results.md'}   plots: {out / 'accuracy.png'}")
    if results is not None:
        console.print(f"written into {publish(out, results, summary['markdown'])}")


@train_app.command()
def merge(
    adapter: Path = typer.Argument(..., help="A LoRA adapter directory."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the merged model."),
) -> None:
    """Merge an adapter into its base and write a plain transformers directory."""
    from toolself.train.merge import merge_adapter

    if not (adapter / "adapter_config.json").is_file():
        _fail(f"{adapter} holds no adapter_config.json")
    try:
        path = merge_adapter(adapter, out)
    except (FileExistsError, FileNotFoundError) as exc:
        _fail(str(exc))
    console.print(f"merged model written to {path} (serve it, or use --model local:{path})")


@train_app.command()
def plot(
    log: Path = typer.Argument(..., help="A train_log.jsonl."),
    out: Path = typer.Option(..., "--out", "-o", help="PNG to write."),
) -> None:
    """Draw training curves from a training log."""
    from toolself.train.plots import plot_log

    path = plot_log(log, out, log.parent.name)
    if path is None:
        _fail(f"{log} has no step records")
    console.print(f"curves written to {path}")
