"""Live progress of an attempt in the terminal, through the agent's observer hooks."""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from toolself.agent import Observer
from toolself.trajectory import Stage, Step, Trajectory


def short(text: object, limit: int = 160) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_arguments(step: Step) -> str:
    """A step's arguments as the model wrote them, in JSON, for a progress line."""
    return json.dumps(step.arguments, ensure_ascii=False) if step.arguments is not None else "(unreadable)"


class RichObserver(Observer):
    """Shows each stage's configuration as the policy wrote it, each action, and the end.
    Stages and steps are numbered from 1, as the viewer numbers them, and each step says how
    long its tool took and when in the attempt it ended, so a slow model and a slow tool can
    be told apart while watching."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console()

    def stage_started(self, trajectory: Trajectory, stage: Stage) -> None:
        c = stage.configuration
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        if stage.request:
            table.add_row("reason", short(stage.request.get("reason", "")))
        table.add_row("sub-goal", short(c.subgoal, 300))
        table.add_row("strategy", short(c.strategy, 300))
        table.add_row("toolbox", ", ".join(c.toolbox) or "(none)")
        knowledge = c.knowledge + (f": {short(c.knowledge_summary)}" if c.knowledge == "summary" else "")
        table.add_row("knowledge", knowledge)
        table.add_row("context", c.context_mode)
        source = stage.config_source + (f" (after: {'; '.join(stage.config_problems)})" if stage.config_problems else "")
        table.add_row("written by", short(source, 300))
        if stage.frozen:
            table.add_row("frozen", ", ".join(stage.frozen))
        self.console.print(Panel(table, title=f"stage {stage.index + 1}", title_align="left", border_style="cyan"))

    def step(self, trajectory: Trajectory, stage: Stage, step: Step) -> None:
        args = call_arguments(step)
        style = "red" if step.is_error else "green"
        at = time.time() - trajectory.started_at
        self.console.print(f"  {len(stage.steps)}. [bold]{step.tool or '?'}[/bold] {escape(short(args, 120))}  "
                           f"[dim]({step.duration:.1f} s, at {at:.1f} s)[/dim]")
        self.console.print(f"    [{style}]→ {escape(short(step.observation))}[/{style}]")

    def configuration_rejected(self, trajectory: Trajectory, problems: list[str]) -> None:
        self.console.print(f"  [yellow]configuration rejected: {short('; '.join(problems), 300)}[/yellow]")

    def finished(self, trajectory: Trajectory) -> None:
        u = trajectory.usage
        self.console.print(
            f"[bold]ended[/bold] by {trajectory.end_reason} after {len(trajectory.stages)} stage(s), "
            f"{trajectory.num_steps} step(s), {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens, "
            f"{trajectory.duration:.1f} s")
        if trajectory.error:
            self.console.print(f"[red]{short(trajectory.error.splitlines()[-1], 400)}[/red]")
