"""`toolself demo`: what CAT training buys, shown on one held-out task.

The zero-shot embedded model and the same model with the shipped CAT adapter (`embedded:cat`)
attempt one held-out task of the built-in `data` suite one after the other, under the budgets
and greedy decoding the adapter's held-out evaluation used, and each attempt is scored by the
suite's own scorer. The terminal shows every stage's configuration as the policy wrote it,
what changed from the stage before and why, the tool calls and the verdict; the two
trajectories go to a JSONL file that `toolself view` opens.

The task is the first one of that suite the adapter's held-out evaluation (provenance.json)
recorded as solved by the trained model and failed by the zero-shot one, both greedy, so a
rebuilt adapter brings its own. The published suites (`TOOLSELF_SUITE_KEY=public`) are used
whatever the environment says, because that record was measured on them.
"""

from __future__ import annotations

import gc
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from toolself.agent import Observer
from toolself.config import Configuration
from toolself.evals.report import short_dataset
from toolself.progress import call_arguments, short
from toolself.trajectory import Stage, Step, Trajectory, write_jsonl

DEMO_SUITE = "builtin:data"
DEMO_SEED = 0
CONTENDERS = (("ToolSelf, zero-shot", "embedded"), ("ToolSelf + CAT", "embedded:cat"))
FALLBACK_TASK = "data-heldout-0-0000"  # shown zero-shot while no adapter record chooses one
FIELDS = (("sub-goal", "subgoal"), ("strategy", "strategy"), ("toolbox", "toolbox"), ("knowledge", "knowledge"),
          ("mode", "context_mode"))


@contextmanager
def published_suites() -> Iterator[None]:
    """The built-in suites as published, for as long as the task is generated."""
    from toolself.evals.suites.common import KEY_VARIABLE, PUBLIC_KEY

    held = os.environ.get(KEY_VARIABLE)
    os.environ[KEY_VARIABLE] = PUBLIC_KEY
    try:
        yield
    finally:
        if held is None:
            del os.environ[KEY_VARIABLE]
        else:
            os.environ[KEY_VARIABLE] = held


def chosen_task(record: dict[str, Any]) -> str:
    """The first held-out task of the demo's suite that the trained model solved and the
    zero-shot one failed in the adapter's recorded evaluation."""
    outcomes = record["heldout"]["tasks"]
    found = sorted(key for key, solved in outcomes["cat"].items()
                   if key.startswith(f"{DEMO_SUITE}/") and solved and not outcomes["zero-shot"].get(key, True))
    if not found:
        raise ValueError(f"the adapter's evaluation holds no {DEMO_SUITE} task that it solved and the zero-shot model "
                         "failed: nothing to show")
    return found[0].split("/", 1)[1]


def demo_task(task_id: str) -> Any:
    from toolself.evals.loaders import load_tasks

    with published_suites():
        tasks = load_tasks(DEMO_SUITE, split="heldout", limit=int(task_id.rsplit("-", 1)[1]) + 1, seed=DEMO_SEED)
    found = [t for t in tasks if t.id == task_id]
    if not found:
        raise ValueError(f"{DEMO_SUITE} has no held-out task {task_id!r}")
    return found[0]


@dataclass
class Attempt:
    """One contender's go at the task, scored."""

    label: str
    model: str
    trajectory: Trajectory
    correct: bool
    verdict: str
    load_seconds: float


class StageObserver(Observer):
    """Each stage as a panel: the configuration the policy wrote, with the fields that differ
    from the previous stage's marked and their old values, and the reason it reconfigured;
    then its tool calls, one line each."""

    def __init__(self, console: Console):
        self.console = console
        self.previous: Configuration | None = None

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None:
        from toolself.viewer.digest import config_change

        c = stage.configuration
        change = config_change(self.previous, c)
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        if stage.request:
            table.add_row("reason", Text(short(stage.request.get("reason", ""), 240), style="magenta"))
        for label, name in FIELDS:
            value = (", ".join(c.toolbox) or "(none)") if name == "toolbox" else short(getattr(c, name), 240)
            if name == "knowledge" and c.knowledge == "summary":
                value += f": {short(c.knowledge_summary, 160)}"
            cell = Text(value)
            if name in change.changed or (name == "knowledge" and "knowledge_summary" in change.changed):
                cell.append(f"\n◀ changed ({_was(name, change)})", style="bold yellow")
            table.add_row(label, cell)
        if stage.config_source != "policy":
            table.add_row("written by", short(f"{stage.config_source}: {'; '.join(stage.config_problems)}", 200))
        if self.previous is not None and not change.changed:
            table.add_row("", Text("nothing changed from the previous stage", style="dim"))
        self.previous = c
        self.console.print(Panel(table, title=f"stage {stage.index + 1}", title_align="left", border_style="cyan"))

    def step(self, trajectory: Trajectory, stage: Stage, step: Step) -> None:
        args = call_arguments(step)
        style = "red" if step.is_error else "green"
        self.console.print(f"  {len(stage.steps)}. [bold]{escape(step.tool or '?')}[/bold] {escape(short(args, 100))}")
        self.console.print(f"     [{style}]→ {escape(short(step.observation, 100))}[/{style}]")


def _was(name: str, change: Any) -> str:
    if name == "toolbox":
        return " ".join([f"+{t}" for t in change.added] + [f"-{t}" for t in change.removed])
    if name not in change.previous:  # only the knowledge summary differs
        return "a new summary"
    return f"was: {short(change.previous[name], 80)}"


def load_contender(spec: str, task: Any) -> Any:
    """The model a contender's spec names, decoding greedily as the held-out evaluation did."""
    from toolself.models import load_model

    return load_model(spec, temperature=0.0, seed=DEMO_SEED, dtype=demo_preset_cat().dtype)


def demo_preset_cat() -> Any:
    """The CAT settings the shipped adapter was trained and evaluated with."""
    from toolself.train.study import demo_preset

    return demo_preset().pipeline("toolself", DEMO_SEED)


def attempt(label: str, spec: str, task: Any, console: Console,
            load: Callable[[str, Any], Any] = load_contender) -> Attempt:
    """One scored attempt at `task`, with the budgets of the adapter's held-out evaluation."""
    from toolself.agent import Agent
    from toolself.evals.scorers import score
    from toolself.tools.registry import default_pool
    from toolself.train.pipeline import agent_overrides
    from toolself.variants import settings_for

    recipe = demo_preset_cat()
    settings = settings_for("toolself", time_limit=recipe.timeout, **agent_overrides(recipe))
    console.print(Rule(f"[bold]{label}[/bold]  (--model {spec})"))
    started = time.monotonic()
    model = load(spec, task)
    loaded = time.monotonic() - started
    pool = default_pool()
    try:
        with task.environment(model=model) as environment:
            agent = Agent(model, pool, settings, observer=StageObserver(console))
            metadata = {"attempt": {"dataset": DEMO_SUITE, "task_id": task.id, "method": label, "repeat": 0},
                        "family": task.family, "split": task.split, "reference": task.answer, "model": spec}
            trajectory = agent.run(task.question, ctx=environment.context, task_id=task.id, metadata=metadata)
            verdict = score(task, trajectory.answer, environment)
    finally:
        pool.close()
        if hasattr(model, "close"):
            model.close()
    trajectory.metadata["correct"] = bool(verdict.correct)
    result = Attempt(label, spec, trajectory, bool(verdict.correct), verdict.reason, loaded)
    console.print(verdict_line(result, task.answer))
    return result


def verdict_line(a: Attempt, reference: Any) -> Text:
    t = a.trajectory
    mark = Text(" SOLVED ", style="bold white on green") if a.correct else Text(" FAILED ", style="bold white on red")
    return Text.assemble(mark, f" answer {short(repr(t.answer), 60)} (expected {reference!r}); ended by "
                               f"{t.end_reason} after {len(t.stages)} stage(s), {t.num_reconfigurations} "
                               f"reconfiguration(s), {t.num_steps} action(s), {t.duration:.0f} s. "
                               f"Scorer: {short(a.verdict, 100)}\n")


def summary_table(attempts: list[Attempt]) -> Table:
    table = Table(title="The same held-out task, greedy decoding", title_justify="left")
    for column in ("model", "verdict", "answer", "stages", "reconfig.", "actions", "seconds"):
        table.add_column(column, justify="left" if column in ("model", "verdict", "answer") else "right")
    for a in attempts:
        t = a.trajectory
        table.add_row(a.label, "[green]solved[/green]" if a.correct else "[red]failed[/red]",
                      escape(short(repr(t.answer), 30)), str(len(t.stages)), str(t.num_reconfigurations),
                      str(t.num_steps), f"{t.duration:.0f}")
    return table


def provenance() -> dict[str, Any] | None:
    """The shipped adapter's record (how it was trained, what it scored), or None when this
    install has no adapter yet."""
    from toolself.models import shipped_adapter

    path = shipped_adapter("embedded:cat") / "provenance.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def without_adapter(task: Any) -> Panel:
    """What the demo can show before the adapter is built: the zero-shot attempt alone, and
    the one command that makes the comparison possible."""
    lines = [
        "[bold]The CAT-trained adapter (embedded:cat) is not in this install yet[/bold], so this demo shows the "
        "zero-shot embedded model alone. `make embedded-cat` builds the adapter with the project's CAT recipe "
        "(teacher trajectories, then RFT; tens of minutes on 2 CPU cores); run `make demo` again afterwards to "
        "see the two side by side.",
        "This is SmolLM2-135M-Instruct (135M parameters) on toolself's built-in offline suites: read it for the "
        "method, not for what a large model would score.",
        "",
        f"[bold]Task[/bold] {task.id} (held-out): {escape(task.question)}",
        f"Files in the workspace: {', '.join(sorted(task.inline_files))}.",
    ]
    return Panel("\n".join(lines), border_style="yellow")


def introduction(task: Any, record: dict[str, Any]) -> Panel:
    rates = record["heldout"]["success_rate"]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    measured = "; ".join(f"{short_dataset(suite)} {rates['zero-shot'][suite]:.0%} → {rates['cat'][suite]:.0%}"
                         for suite in record["heldout"]["suites"])
    lines = [
        "[bold]What CAT training buys a small model[/bold], on one held-out task.",
        f"This is SmolLM2-135M-Instruct (135M parameters) on toolself's built-in offline suites, on "
        f"{os.cpu_count()} CPU core(s) (load average {load}): read it for the method, not for what a large model "
        "would score.",
        f"[bold]{CONTENDERS[0][0]}[/bold]: the model as shipped. [bold]{CONTENDERS[1][0]}[/bold]: the same model "
        f"with the LoRA adapter CAT trained on {record['training_data']['sft']['trajectories']} successful teacher "
        f"trajectories (`{escape(record['command'])}`; toolself/data/adapters/embedded-cat/provenance.json).",
        f"Its held-out evaluation, zero-shot → CAT, first {record['heldout']['tasks_per_suite']} tasks per suite: "
        f"{measured}.",
        "",
        f"[bold]Task[/bold] {task.id} (held-out, never trained on): {escape(task.question)}",
        f"Files in the workspace: {', '.join(sorted(task.inline_files))}.",
    ]
    return Panel("\n".join(lines), border_style="blue")


def run_demo(out: Path, console: Console | None = None, task_id: str | None = None,
             contenders: Sequence[tuple[str, str]] = CONTENDERS,
             load: Callable[[str, Any], Any] = load_contender, record: dict[str, Any] | None = None) -> list[Attempt]:
    """Both attempts, shown as they run; the trajectories are written to `out` (replaced).
    `load(spec, task)` builds a contender's model and `record` stands for the adapter's
    provenance (tests give scripted policies and their own record)."""
    console = console or Console()
    record = record if record is not None else provenance()
    if record is None:
        task = demo_task(task_id or FALLBACK_TASK)
        console.print(without_adapter(task))
        contenders = contenders[:1]
    else:
        task = demo_task(task_id or chosen_task(record))
        console.print(introduction(task, record))
    attempts = []
    for label, spec in contenders:
        attempts.append(attempt(label, spec, task, console, load))
        gc.collect()  # the first model's weights go before the second's load
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    write_jsonl(out, [a.trajectory for a in attempts])
    console.print(summary_table(attempts))
    report = out.with_suffix(".html")
    console.print(f"Both trajectories: {out}. Stage by stage, with every message, in the viewer:", highlight=False)
    console.print(f"  [bold]toolself view {escape(str(out))} --out {escape(str(report))} --open[/bold]", soft_wrap=True,
                  highlight=False)
    return attempts

