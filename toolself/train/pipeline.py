"""CAT end to end: collect (teacher) -> RFT data -> RFT -> collect (RFT policy) -> KTO data ->
KTO -> evaluate, each step checkpointed in `OUT/state.json`.

A step is marked done only after its outputs are complete (the state file is replaced
atomically), so an interrupted pipeline, rerun with the same command, skips the finished steps
and redoes the one it stopped in. The collection and evaluation steps resume inside themselves
too (the evaluation runner skips finished attempts). A rerun with different settings that would
change a finished step's meaning is refused unless `force`.

    OUT/state.json            settings and finished steps with their results
    OUT/collect/teacher/      runner folder: teacher attempts on the train split
    OUT/data/sft/             datasets folder + stats.json
    OUT/rft/                  RFT adapter (loads with --model local:OUT/rft), train_log.jsonl, curves.png
    OUT/collect/policy/       runner folder: RFT-policy attempts on the train split
    OUT/data/kto/             datasets folder + stats.json
    OUT/kto/                  KTO adapter on OUT/kto/base (the merged RFT model), log, curves.png
                              (a copy of OUT/rft when every on-policy attempt had one outcome)
    OUT/eval/                 runner folder: student, RFT and KTO on the held-out split
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from toolself.evals.records import changed_settings
from toolself.evals.runner import run_eval
from toolself.models.digests import local_model_identity, relocate_base, same_base
from toolself.models.spec import ModelSpec, served_name
from toolself.tools.options import ToolOptions
from toolself.train.data import load_dataset_dir, save_dataset
from toolself.train.served import AdapterServer, stop_servers
from toolself.train.settings import AgentOverrides, KTOOverrides, RFTOverrides
from toolself.train.steps import (
    AttemptTools,
    Collection,
    agent_budgets,
    collect_attempts,
    kto_data,
    load_sources,
    preset_options,
    rendering,
    run_preset,
    served_student_request,
    sft_data,
    train_kto_step,
    train_rft_step,
)
from toolself.variants import RunPreset, settings_for

STEPS = ("collect_teacher", "data_sft", "rft", "collect_policy", "data_kto", "kto", "evaluate")
STATE_FILE = "state.json"
EVALUATED = ("student", "rft", "kto")


@dataclass
class CATSettings:
    """What defines a CAT run (compared on resume). `agent`, `rft` and `kto` take a record or
    its dict (as a run file holds it). preset: a run preset (`paper`) whose agent settings come
    between the student's budgets and `agent`, whose load options reach every model the run
    loads, whose tools, judge and scorer every attempt works and is scored with
    (`steps.AttemptTools`), and whose text protocol the training data is rendered in;
    `temperature` and `timeout` stay as given (the command line sets them from the preset)."""

    tasks: list[str]
    method: str = "toolself"
    teacher: str = "expert"
    student: str = "embedded"
    teacher_samples: int = 4
    policy_samples: int = 4
    limit: int | None = None
    policy_limit: int | None = None  # tasks per spec for the on-policy collection (default: limit)
    eval_tasks: list[str] | None = None
    eval_limit: int | None = None
    eval_seed: int = 0  # the held-out tasks' seed, fixed so that every training seed is tested alike
    temperature: float = 0.7
    seed: int = 0
    max_length: int = 16384
    agent: AgentOverrides = field(default_factory=AgentOverrides)
    rft: RFTOverrides = field(default_factory=RFTOverrides)
    kto: KTOOverrides = field(default_factory=KTOOverrides)
    concurrency: int = 4
    timeout: float | None = 600.0
    dtype: str = "auto"
    evaluate: tuple[str, ...] = EVALUATED
    tools: dict[str, Any] = field(default_factory=dict)  # `ToolOptions.to_dict()`; empty: the default pool
    preset: str | None = None

    def __post_init__(self) -> None:
        self.agent = AgentOverrides.from_dict(self.agent)
        self.rft = RFTOverrides.from_dict(self.rft)
        self.kto = KTOOverrides.from_dict(self.kto)
        settings_for(self.method)  # an unknown method, student or preset fails here, before any work
        self.student_model()
        self.run_preset()
        self.evaluate = tuple(self.evaluate)
        unknown = set(self.evaluate) - set(EVALUATED)
        if unknown:
            raise ValueError(f"unknown models to evaluate {sorted(unknown)}; choose from {list(EVALUATED)}")

    def student_model(self) -> ModelSpec:
        """The untrained student (`default` is the embedded model; a bare directory is local)."""
        return ModelSpec.parse(self.student, directories=True)

    def run_preset(self) -> RunPreset | None:
        return run_preset(self.preset)

    def agent_settings(self) -> AgentOverrides:
        """The student's budgets, the preset's settings, then `agent` (see `steps.agent_budgets`)."""
        return agent_budgets(self.student_model(), self.agent, self.run_preset())

    def model_options(self, model: str, served: bool = False) -> dict[str, Any]:
        """How every evaluated model loads: in the run's dtype (a model in this process), with
        the preset's options; a student vLLM serves (`served`) decodes as its data renders it."""
        spec = ModelSpec.parse(model)
        options = {**({"dtype": self.dtype} if spec.in_process else {}), **preset_options(self.run_preset(), spec)}
        return spec.with_request_fields(options, self.student_request(served))

    def student_request(self, served: bool) -> dict[str, Any] | None:
        """The fields every request to the student, or a model trained from it, carries when vLLM
        serves it (`steps.served_student_request`); none when it runs in this process."""
        return served_student_request(self.run_preset()) if served else None

    def collection(self, samples: int, limit: int | None) -> Collection:
        return Collection(tasks=self.tasks, samples=samples, method=self.method, limit=limit,
                          temperature=self.temperature, seed=self.seed, concurrency=self.concurrency,
                          timeout=self.timeout, dtype=self.dtype, agent=self.agent_settings(), preset=self.preset)

    def to_dict(self) -> dict[str, Any]:
        """As the state file records it; a field added since runs were first saved is left out
        while it holds its default, so that those runs resume."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(tasks=list(self.tasks), eval_tasks=None if self.eval_tasks is None else list(self.eval_tasks),
                 agent=self.agent.to_dict(), rft=self.rft.to_dict(), kto=self.kto.to_dict(),
                 evaluate=list(self.evaluate), tools=dict(self.tools))
        if not d["tools"]:
            del d["tools"]
        if d["preset"] is None:
            del d["preset"]
        return d


class PipelineMismatch(ValueError):
    """The output folder holds a CAT run made with other settings."""


class EmptyData(ValueError):
    """A data step produced nothing to train on; the step is left unfinished."""


def without_addresses(settings: dict[str, Any]) -> dict[str, Any]:
    """Saved settings without where their services run (the teacher's and judge's servers, the
    search and reader endpoints): a run resumed on another node, or with a server restarted on
    another port, is the same run (see `spec.served_name`)."""
    kept = {**settings, "teacher": served_name(settings["teacher"])} if "teacher" in settings else dict(settings)
    tools = settings.get("tools")
    if tools:
        web = {k: served_name(v) if isinstance(v, str) else v for k, v in (tools.get("web") or {}).items()
               if k not in ("search_url", "reader_url")}
        kept["tools"] = {**tools, "web": web, "judge": served_name(tools["judge"]) if tools.get("judge") else None}
    return kept


def reread(record: Callable[..., Any], saved: dict[str, Any]) -> dict[str, Any] | None:
    """Saved settings as this installation records them (a TrainingArguments field that
    transformers renamed comes back under the installed name: see `settings.installed_spelling`),
    or None when they no longer read."""
    try:
        return record(**saved).to_dict()
    except (TypeError, ValueError):
        return None


class State:
    def __init__(self, out: Path):
        self.path = out / STATE_FILE
        self.data: dict[str, Any] = {"settings": None, "steps": {}}
        if self.path.is_file():
            self.data = json.loads(self.path.read_text(encoding="utf-8"))

    def done(self, step: str) -> bool:
        return bool(self.data["steps"].get(step, {}).get("done"))

    def result(self, step: str) -> dict[str, Any]:
        return self.data["steps"][step]["result"]

    def finish(self, step: str, result: dict[str, Any], seconds: float) -> None:
        self.data["steps"][step] = {"done": True, "result": result, "seconds": round(seconds, 3),
                                    "finished_at": time.time()}
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def agent_overrides(settings: CATSettings) -> dict[str, Any]:
    """The agent settings of every collection and evaluation, as the runner takes them (see
    `steps.agent_budgets`)."""
    return settings.agent_settings().to_dict()


def student_spec(settings: CATSettings) -> str:
    """The model spec that loads the untrained student."""
    return settings.student_model().text


def tool_options(settings: CATSettings, out: Path) -> ToolOptions | None:
    """The run's tool options (search, visit, judge, pool), with web answers cached in `out`;
    None when the run takes the defaults."""
    if not settings.tools:
        return None
    return ToolOptions.from_dict(settings.tools).with_cache(Path(out) / "web_cache")


def evaluate(settings: CATSettings, model: str, out: Path, backend: Any = "local", served: bool = False) -> Any:
    """One model on the held-out split, run as every evaluation of a CAT run is; returns the
    runner's summary, or raises `AttemptsFailing` when every attempt ended in an error.
    served: the model is the student, or a model trained from it, that vLLM serves."""
    attempt = AttemptTools.of(tool_options(settings, out), settings.run_preset())
    try:
        summary = run_eval(settings.eval_tasks or settings.tasks, [settings.method], model, out, split="heldout",
                           limit=settings.eval_limit, seed=settings.eval_seed, concurrency=settings.concurrency,
                           timeout=settings.timeout, settings=agent_overrides(settings), backend=backend,
                           model_options=settings.model_options(model, served), pool=attempt.pool, judge=attempt.judge,
                           loader=attempt.loader)
    finally:
        attempt.close()
    summary.raise_if_all_failed()  # not a score of 0: the model was never reached
    return summary


def run_cat(settings: CATSettings, out: str | Path, force: bool = False, stop_after: str | None = None,
            echo: Callable[[str], None] = print, backend: Any = "local", isolate: bool = False,
            server: AdapterServer | None = None) -> dict[str, Any]:
    """Run (or resume) the pipeline; returns the state's step results. backend: where the
    collection and evaluation attempts run (`local`, `ray`, a runner Backend); not a setting of
    the results, so a run may resume on another backend. isolate: run each step in a process of
    its own (see `isolated`), as the command line does, so that memory does not pile up over a run.
    server: serve the trained adapters with vLLM for the on-policy collection and the
    evaluations (see `served`) instead of loading them in toolself's engine."""
    if stop_after is not None and stop_after not in STEPS:
        raise ValueError(f"unknown step {stop_after!r}; steps: {list(STEPS)}")
    out = Path(out)
    state = State(out)
    wanted = settings.to_dict()
    saved = state.data["settings"]
    student = local_model_identity(settings.student_model())
    if saved is not None and not force:
        before = reread(CATSettings, saved) or saved
        if student and same_base(state.data.get("student_weights") or {}, student):
            before = {**before, "student": wanted["student"]}
        differ = changed_settings(without_addresses(before), without_addresses(wanted))
        if differ:
            raise PipelineMismatch(f"{out} holds a CAT run with other settings:\n"
                                   + "\n".join(f"  {line}" for line in differ)
                                   + "\nUse another --out folder, or --force to continue this one anyway.")
    state.data["settings"] = wanted
    state.data["student_weights"] = student
    state.save()
    try:
        for step in STEPS:
            if state.done(step):
                echo(f"[{step}] done earlier, skipped")
            else:
                echo(f"[{step}] running")
                started = time.monotonic()
                if isolate:
                    result = isolated(run_step, settings, out, step, print, backend, server)
                else:
                    result = run_step(settings, out, step, echo, backend, server)
                seconds = time.monotonic() - started
                state.finish(step, result, seconds)
                echo(f"[{step}] finished in {seconds:.1f} s: {json.dumps(result, default=str)[:300]}")
            if step == stop_after:
                break
    finally:
        stop_servers(out)  # a step's process killed while its server ran leaves it running
    return {s: state.result(s) for s in STEPS if state.done(s)}


def run_step(settings: CATSettings, out: Path, step: str, echo: Callable[[str], None] = print,
             backend: Any = "local", server: AdapterServer | None = None) -> dict[str, Any]:
    """One step's work on what the steps before it left in `out`; returns its result."""
    work = Step(settings, Path(out), echo, backend, server)
    work.locate_student()
    return STEP_FUNCTIONS[step](work)


@dataclass
class Step:
    """What each step of one pipeline works with: its settings, its folder and where to say
    what it does; the models it trains live at fixed places in the folder."""

    settings: CATSettings
    out: Path
    echo: Callable[[str], None] = print
    backend: Any = "local"
    server: AdapterServer | None = None

    @property
    def rft_dir(self) -> Path:
        return self.out / "rft"

    @property
    def kto_dir(self) -> Path:
        return self.out / "kto"

    def student(self) -> Path:
        return self.settings.student_model().weights()

    def locate_student(self) -> None:
        """The RFT adapter (and the copy that stands for KTO when KTO was skipped) names the
        student's path at training time. A student mounted elsewhere since, on the node a run
        resumed on (`run_cat` has checked its digest), is recorded as their base there."""
        student = self.settings.student_model()
        if student.kind != "local":
            return
        weights = student.weights()
        for adapter in [self.rft_dir] + ([self.kto_dir] if self.kto_skipped() else []):
            relocate_base(adapter, weights)

    def kto_skipped(self) -> str | None:
        """Why KTO was skipped (data_kto found one label only), or None."""
        return State(self.out).data["steps"].get("data_kto", {}).get("result", {}).get("skip_kto")

    def collect(self, model: str, folder: str, samples: int, limit: int | None,
                served: bool = False) -> dict[str, Any]:
        """served: `model` is a trained student that vLLM serves (see `served_student_request`)."""
        collection = self.settings.collection(samples, limit)
        return collect_attempts(ModelSpec.parse(model), self.out / "collect" / folder, collection,
                                backend=self.backend, tools=tool_options(self.settings, self.out),
                                request=self.settings.student_request(served)).to_dict()


def _collect_teacher(step: Step) -> dict[str, Any]:
    s = step.settings
    return step.collect(s.teacher, "teacher", s.teacher_samples, s.limit)


def _data_sft(step: Step) -> dict[str, Any]:
    trajectories, schemas = load_sources([step.out / "collect" / "teacher"], step.settings.method)
    built = sft_data(trajectories, schemas, step.student(), step.settings.max_length,
                     rendering(step.settings.run_preset()))
    dataset, stats = built.dataset, built.build
    if len(dataset) == 0:
        raise EmptyData(f"none of the teacher's {len(trajectories)} attempts succeeded: nothing to fine-tune "
                        "on (more samples, looser budgets or a stronger teacher); rerun to retry this step")
    save_dataset(dataset, step.out / "data" / "sft", built.info)
    for note in stats.notes:
        step.echo(f"note: {note}")
    return {"examples": len(dataset), "trajectories": stats.trajectories,
            "rejected_trajectories": stats.skipped_trajectories, "truncated": stats.truncated}


def _rft(step: Step) -> dict[str, Any]:
    from toolself.train.rft_config import RFTConfig  # imports trl: seconds

    s = step.settings
    config = RFTConfig(output_dir=str(step.rft_dir / "checkpoints"), max_length=s.max_length, seed=s.seed,
                       **s.rft.to_dict())
    # the state refused changed settings unless forced: a forced change replaces the old run's checkpoint
    result, _ = train_rft_step(load_dataset_dir(step.out / "data" / "sft"), step.student(), step.rft_dir, config,
                               replace_other=True)
    return result.to_dict()


def _collect_policy(step: Step) -> dict[str, Any]:
    s = step.settings
    limit = s.policy_limit if s.policy_limit is not None else s.limit
    if step.server is None:
        return step.collect(f"local:{step.rft_dir}", "policy", s.policy_samples, limit)
    with step.server.serving("rft", step.rft_dir, step.out) as served:
        return step.collect(served.spec("rft"), "policy", s.policy_samples, limit, served=True)


def _data_kto(step: Step) -> dict[str, Any]:
    trajectories, schemas = load_sources([step.out / "collect" / "policy"], step.settings.method)
    built = kto_data(trajectories, schemas, step.student(), step.settings.max_length,
                     rendering(step.settings.run_preset()))
    dataset, stats, weights = built.dataset, built.build, built.weights
    if len(dataset) < 2:
        raise EmptyData(f"the policy's {len(trajectories)} scored attempts hold {len(dataset)} decisions: "
                        "KTO needs at least 2")
    save_dataset(dataset, step.out / "data" / "kto", built.info)
    for note in stats.notes:
        step.echo(f"note: {note}")
    found = {"examples": len(dataset), "trajectories": stats.trajectories, "weights": weights.to_dict(),
             "truncated": stats.truncated}
    if weights.single_class:
        kind = "succeeded" if weights.desirable else "failed"
        found["skip_kto"] = (f"every one of the policy's {stats.trajectories} attempts {kind}: with one label "
                             "KTO can only push the RFT model's own decisions one way, so the RFT model stands "
                             "as KTO's")
    return found


def _kto(step: Step) -> dict[str, Any]:
    from toolself.train.kto_config import CATKTOConfig  # imports trl: seconds

    skipped = step.kto_skipped()
    if skipped:  # OUT/kto still holds a model: the RFT one, as the docs promise a KTO model there
        step.echo(f"[kto] skipped: {skipped}")
        shutil.rmtree(step.kto_dir, ignore_errors=True)
        shutil.copytree(step.rft_dir, step.kto_dir, ignore=shutil.ignore_patterns("checkpoints"))
        return {"skipped": skipped, "copied_from": str(step.rft_dir)}
    s = step.settings
    config = CATKTOConfig(output_dir=str(step.kto_dir / "checkpoints"), max_length=s.max_length, seed=s.seed,
                          **s.kto.to_dict())
    result, _ = train_kto_step(load_dataset_dir(step.out / "data" / "kto"), step.rft_dir, step.kto_dir, config,
                               replace_other=True)
    return result.to_dict()


def _evaluate(step: Step) -> dict[str, Any]:
    s, out = step.settings, step.out
    results: dict[str, Any] = {}

    def run(names: list[str], models: dict[str, str], served: bool = False) -> None:
        for name in names:
            if name == "kto" and step.kto_skipped():
                if "rft" in results:  # the same model: its records stand for both rows
                    shutil.rmtree(out / "eval" / name, ignore_errors=True)
                    shutil.copytree(out / "eval" / "rft", out / "eval" / name)
                    results[name] = results["rft"]
                    continue
                models = {**models, name: models["rft"]}
            summary = evaluate(s, models[name], out / "eval" / name, step.backend, served)
            results[name] = summary.accuracy().get(s.method, {})

    if step.server is None:
        run(list(s.evaluate), {"student": student_spec(s), "rft": f"local:{step.rft_dir}",
                               "kto": f"local:{step.kto_dir}"})
        return results
    # served: the student (the base) and RFT by the RFT model's server (KTO too when it was
    # skipped: the RFT model stands as KTO's), then KTO by a server of its own
    by_rft = [n for n in s.evaluate if n != "kto" or step.kto_skipped()]
    if by_rft:
        with step.server.serving("rft", step.rft_dir, out, base_name="student") as served:
            run(by_rft, {"student": served.spec(served.base_name), "rft": served.spec("rft")}, served=True)
    if "kto" in s.evaluate and not step.kto_skipped():
        with step.server.serving("kto", step.kto_dir, out) as served:
            run(["kto"], {"kto": served.spec("kto")}, served=True)
    return {name: results[name] for name in s.evaluate}


STEP_FUNCTIONS: dict[str, Callable[[Step], dict[str, Any]]] = dict(zip(STEPS, (
    _collect_teacher, _data_sft, _rft, _collect_policy, _data_kto, _kto, _evaluate)))


class StepDied(RuntimeError):
    """A step's process ended without a result (killed, most often for lack of memory)."""


def isolated(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a fresh process, so that what it allocates goes back to the system
    when it ends: trainers, frozen-layer caches and inference engines run one after another
    would otherwise pile up in one process until the machine pages or kills it
    (docs/notes/2026-12-03-one-process-per-pipeline-step.md). `function` and `args` must
    pickle; the child prints its own progress, and its exception, if any, is raised here. A
    stop signal sent here (a container runtime signals its first process only) is passed on to
    the child, which stops as the command would (a trainer after checkpointing its step), and
    its exception is raised here."""
    import multiprocessing
    import os

    from toolself.interrupts import handling_stop_signals

    context = multiprocessing.get_context("spawn")  # a fork would inherit the parent's threads and heap
    receive, send = context.Pipe(duplex=False)
    name = getattr(function, "__name__", "step")
    child = context.Process(target=_call_in_child, args=(function, args, send), name=f"toolself-{name}")
    child.start()
    send.close()
    try:
        with handling_stop_signals(lambda signum, _frame: os.kill(child.pid, signum)):
            kind, payload = receive.recv()
    except EOFError:
        child.join()
        killed = " (killed: out of memory?)" if child.exitcode == -9 else ""
        raise StepDied(f"{name}'s process ended without a result, exit code {child.exitcode}{killed}; "
                       "rerun to redo the step") from None
    finally:
        receive.close()
    child.join()
    if kind == "error":
        raise payload
    return payload


def _call_in_child(function: Callable[..., Any], args: tuple[Any, ...], send: Any) -> None:
    from toolself.interrupts import stop_signal_interrupts

    try:
        with stop_signal_interrupts():
            result = function(*args)
        send.send(("result", result))
    except BaseException as exc:
        import pickle
        import traceback

        if not isinstance(exc, (EmptyData, PipelineMismatch)):
            exc.add_note("in the step's process:\n" + "".join(traceback.format_exception(exc)).rstrip())
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError("".join(traceback.format_exception(exc)).rstrip())
        send.send(("error", exc))
    finally:
        send.close()
