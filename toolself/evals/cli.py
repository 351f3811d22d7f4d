"""`toolself tasks`: look at the tasks a spec names before spending a run on them."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

tasks_app = typer.Typer(help="Inspect benchmark and built-in tasks.", no_args_is_help=True)


@tasks_app.callback()
def _group() -> None:
    """Inspect benchmark and built-in tasks."""


@tasks_app.command("show")
def show(
    spec: str = typer.Argument(..., help="builtin:research|data|code|mixed[?knobs], gaia:PATH, frames:PATH, "
                                         "xbench:PATH, swebench:PATH[?repo=CLONE], hotpotqa:PATH, gsm8k:PATH, jsonl:PATH"),
    split: Optional[str] = typer.Option(None, help="train | heldout for built-in suites; a label for files."),
    limit: Optional[int] = typer.Option(3, help="How many tasks to show."),
    seed: int = typer.Option(0, help="Seed of the built-in generators (and of ?shuffle=1)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON record per task instead of a listing."),
) -> None:
    """Print the first tasks of SPEC: question, reference, and what the environment holds."""
    from toolself.evals.loaders import load_tasks

    console = Console()
    try:
        tasks = load_tasks(spec, split=split, limit=limit, seed=seed)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        console.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2) from None
    for task in tasks:
        record = task.summary()
        if as_json:
            typer.echo(json.dumps(record, ensure_ascii=False, default=str))
            continue
        console.rule(f"{escape(task.id)}  [dim]{task.family} / {task.split} / level {task.level}[/dim]")
        console.print(escape(task.question))
        if task.answer is not None:
            console.print(f"[green]answer:[/green] {escape(task.answer)}")
        if task.check_command:
            console.print(f"[green]check:[/green] {escape(task.check_command[:300])}")
        if record["files"]:
            console.print(f"[cyan]files:[/cyan] {escape(', '.join(record['files']))}")
        if record["documents"] is not None:
            console.print(f"[cyan]collection:[/cyan] {record['documents']} documents")
        elif record["collection_path"]:
            console.print(f"[cyan]collection:[/cyan] {escape(record['collection_path'])}")
    if not as_json:
        skipped = len(getattr(tasks, "skipped", []))
        console.print(f"[dim]{len(tasks)} task(s) shown" + (f", {skipped} malformed row(s) skipped" if skipped else "")
                      + "[/dim]")
