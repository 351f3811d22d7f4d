"""`toolself tasks`: look at the tasks a spec names before spending a run on them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

tasks_app = typer.Typer(help="Inspect benchmark and built-in tasks.", no_args_is_help=True)


@tasks_app.callback()
def _group() -> None:
    """Inspect benchmark and built-in tasks."""


def check_spec(spec: str) -> None:
    """A spec whose prefix names no loader (`nope:/x`) is a typo, not a file called `nope:/x`
    (a file whose name holds a colon can still be named `jsonl:nope:/x`)."""
    from toolself.evals.loaders import KINDS, parse_spec

    prefix, sep, _ = spec.partition("?")[0].partition(":")
    if sep and parse_spec(spec).kind == "" and re.fullmatch(r"[A-Za-z][\w-]+", prefix) \
            and not Path(spec.partition("?")[0]).exists():
        raise ValueError(f"{spec}: unknown prefix {prefix!r}; known: {', '.join(sorted(KINDS))}")


@tasks_app.command("show")
def show(
    spec: str = typer.Argument(..., help="builtin:research|data|code|mixed[?knobs], gaia:PATH, frames:PATH, "
                                         "xbench:PATH, swebench:PATH[?repo=CLONE], hotpotqa:PATH, gsm8k:PATH, jsonl:PATH"),
    split: Optional[str] = typer.Option(None, help="train | heldout for built-in suites; a label for files."),
    limit: int = typer.Option(3, min=1, help="How many tasks to show."),
    seed: int = typer.Option(0, help="Seed of the built-in generators (and of ?shuffle=1)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON record per task instead of a listing."),
) -> None:
    """Print the first tasks of SPEC: question, reference, and what the environment holds."""
    from toolself.evals.loaders import load_tasks

    console = Console()
    try:
        check_spec(spec)
        tasks = load_tasks(spec, split=split, limit=limit, seed=seed)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
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
