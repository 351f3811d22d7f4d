"""`toolself demo`, the command: its options only, so that mounting it (every `toolself`
invocation does) loads neither the agent nor the demo; `toolself.demo` does the work."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from toolself.cli_errors import fail


def demo_command(
    out: Path = typer.Option(Path("runs/demo/trajectories.jsonl"), "--out", "-o",
                             help="Write the two trajectories to this JSONL file (replaced)."),
    task: Optional[str] = typer.Option(None, help="A held-out task of builtin:data (published suites); default: "
                                                  "the first the adapter solved and the zero-shot model failed."),
) -> None:
    """The zero-shot embedded model and the CAT-trained one (embedded:cat) on the same held-out
    task: each stage's configuration, what changed and why, the tool calls and the verdict."""
    from toolself.demo import run_demo

    try:
        run_demo(out, task_id=task)
    except ValueError as exc:
        fail(str(exc))
