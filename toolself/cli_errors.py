"""How every command reports a failure: one line on stderr, and an exit status a script can
trust (2: the command was asked for something invalid, 1: its work failed). `toolself --debug`
sets TOOLSELF_DEBUG=1, which lets the traceback through instead, here and in the processes a
command starts."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

DEBUG_ENV = "TOOLSELF_DEBUG"

err_console = Console(stderr=True)


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV) == "1"


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` and exit with `code`; under --debug, called while handling an
    exception, re-raise that exception instead so its traceback shows."""
    if debugging() and sys.exc_info()[1] is not None:
        raise  # noqa: PLE0704 - the exception being handled by the caller
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def json_object_option(option: str, text: str, example: str = '{"max_steps": 2}') -> dict[str, Any]:
    """An option given as a JSON object of fields, parsed; anything else is the command's one
    error line."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not JSON: {exc}")
    if not isinstance(value, dict):
        fail(f"{option} takes a JSON object of fields, e.g. '{example}'")
    return value


def describe(exc: BaseException) -> str:
    """One line for an exception that escaped a command: what the user can act on, with the
    type only where the message alone would be cryptic."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (ValueError, OSError, ImportError, RuntimeError)):
        return text
    return f"{type(exc).__name__}: {text} (toolself --debug ... shows where)"
