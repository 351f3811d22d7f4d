"""`toolself view`: write the HTML report of a run (and open it)."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated, Optional

import typer

from toolself.viewer.build import build_report


def view_command(
    paths: Annotated[list[Path], typer.Argument(help="Run folders (RUN/<method>/...) or trajectories / results JSONL files.",
                                                exists=True)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the report.")] = Path("report.html"),
    open_report: Annotated[bool, typer.Option("--open", help="Open the report in a browser when written.")] = False,
    title: Annotated[Optional[str], typer.Option("--title", help="Title shown on the report.")] = None,
    data_file: Annotated[Optional[bool], typer.Option(
        "--data-file/--inline",
        help="Put the data in REPORT.data.js beside the page, or inline in it (default: beside it when over 8 MB).",
        show_default=False)] = None,
) -> None:
    """Write one self-contained HTML report of trajectories: overview, task list, stage timelines."""
    try:
        report = build_report(paths, out, title=title, split_data=data_file)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    where = f"{report.path} (+ {report.data_path.name})" if report.data_path else str(report.path)
    typer.echo(f"{report.tasks} tasks, {report.attempts} attempts -> {where} ({report.bytes / 1e6:.1f} MB)")
    if open_report:
        webbrowser.open(report.path.resolve().as_uri())

