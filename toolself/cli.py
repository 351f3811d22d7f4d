"""The `toolself` command line."""

from __future__ import annotations

import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from toolself.cli_errors import DEBUG_ENV, debugging, describe, err_console, fail, warn
from toolself.cli_options import (ToolOptions, default_web_cache, preset_option, preset_pool, request_options,
                                  request_options_option, tool_options)
from toolself.evals.preflight import check_free_task
from toolself.models.weights import DTYPE_HELP
from toolself.models.spec import MODEL_SPECS, ModelSpec, model_defaults


class _Commands(TyperGroup):
    """Every command's unexpected failure becomes one line on stderr and exit status 1, so a
    script can trust the status and a person reads a sentence rather than a traceback;
    `toolself --debug COMMAND` lets the traceback through."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):  # typer's own: usage errors, exit codes
            raise
        except Exception as exc:
            if debugging():
                raise
            fail(describe(exc), code=1)


app = typer.Typer(help="Agents that reconfigure themselves at run time (ToolSelf), and CAT training.",
                  cls=_Commands, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()


def _print_version(value: bool) -> None:
    if value:
        from toolself import __version__

        typer.echo(f"toolself {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of a failure instead of one line."),
) -> None:
    """Agents that reconfigure themselves at run time (ToolSelf), and CAT training."""
    if debug:
        os.environ[DEBUG_ENV] = "1"

DEMO_QUESTION = "In which town was the founder of the company that makes the Lumen kettle born?"
DEMO_ANSWER = "Harrowgate"


def demo_docs() -> Path:
    return Path(str(resources.files("toolself") / "data" / "demo"))


_fail = fail


def _agent_settings(spec: ModelSpec, method: str, freeze: tuple[str, ...], run_preset, *,
                    context_budget: Optional[int], **budgets):
    """The agent's settings as `run` and `serve` build them: the model's defaults, the budgets
    given, then the preset's (a usage error is the command's one error line)."""
    from toolself.variants import settings_for

    overrides = {**model_defaults(spec).settings(), **({"context_budget": context_budget} if context_budget else {}),
                 **budgets}
    try:
        if run_preset is not None:
            overrides.update(run_preset.settings(), time_limit=run_preset.timeout)
        return settings_for(method, freeze, **overrides)
    except ValueError as exc:
        _fail(str(exc))


def _policy_options(model: str, spec: ModelSpec, run_preset, temperature: float, seed: int, dtype: str,
                    request: str | None = None) -> dict:
    """The policy's load options as `run` and `serve` give them: the spec's, then the preset's,
    then the `--request-options` fields (ones it cannot take are the command's one error line)."""
    return request_options(spec, {**spec.options(temperature, seed, dtype),
                                  **(run_preset.model_options(model) if run_preset else {})}, request)


def _load_policy(model: str, spec: ModelSpec, options: dict):
    """The policy `spec` names (a model that cannot load is the command's one error line)."""
    from toolself.models import ModelError

    try:
        return spec.load(**options)
    except (ValueError, OSError, ImportError, ModelError) as exc:
        _fail(f"loading the model {model}: {exc}", code=1)


def _load_writer(writer: ModelSpec | None):
    """The model that writes configurations for `decoupled` (`--config-model`), or None."""
    from toolself.models import ModelError

    if writer is None:
        return None
    try:
        return writer.load()
    except (ValueError, OSError, ImportError, ModelError) as exc:
        _fail(f"loading the --config-model {writer.text}: {exc}", code=1)


FREEZE = typer.Option([], help="Ablation: hold a dimension fixed (subgoal, strategy, toolbox, knowledge, mode).")
CONFIG_MODEL = typer.Option(None, help="For `decoupled`: the model that writes configurations.")


def _checked_pool(tool_options: ToolOptions, run_preset):
    """The tool pool, its needs checked as for a task in words (`check_free_task`): warnings
    printed, a missing need the command's one error line."""
    pool = preset_pool(tool_options, run_preset)
    try:
        for warning in check_free_task(tool_options, pool):
            err_console.print(f"warning: {warning}", highlight=False)
    except ValueError as exc:
        pool.close()
        _fail(str(exc))
    return pool


@app.command()
@tool_options
def run(
    task: str = typer.Argument(..., help="The task, in words."),
    model: str = typer.Option("embedded", "--model", "-m", help=MODEL_SPECS),
    method: str = typer.Option("toolself", help="toolself | vanilla | static:NAME | decoupled (see `toolself methods`)."),
    freeze: list[str] = FREEZE,
    config_model: Optional[str] = CONFIG_MODEL,
    workspace: Optional[Path] = typer.Option(None, help="Working folder for file tools (default: a temporary one)."),
    out: Path = typer.Option(Path("runs/trajectories.jsonl"), help="Append the trajectory to this JSONL file."),
    max_stages: int = typer.Option(6, min=1, help="Most stages in the attempt."),
    max_steps: int = typer.Option(12, min=1, help="Most actions in one stage."),
    max_tokens: int = typer.Option(200_000, min=1, help="Most prompt + completion tokens in the attempt."),
    timeout: Optional[float] = typer.Option(None, min=1,
                                            help="Wall-clock limit of the attempt in seconds (default: none)."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", hidden=True, min=1,
                                               help="Deprecated name of --timeout."),
    context_budget: Optional[int] = typer.Option(None, min=1, help="Visible-context budget in the model's tokens "
                                                 "(default: 3000 for the embedded model and local ones under 1B "
                                                 "parameters, else 16000)."),
    temperature: float = typer.Option(0.0, min=0, help="0 for greedy decoding."),
    seed: int = typer.Option(0, help="Sampling seed."),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    request: Optional[str] = request_options_option(),
    preset: Optional[str] = preset_option(),
    tool_options: ToolOptions = ToolOptions(),
) -> None:
    """Run one attempt at TASK, showing each stage as it happens."""
    from toolself.agent import Agent
    from toolself.interrupts import keeping_the_attempt
    from toolself.progress import RichObserver
    from toolself.tools.base import ToolContext
    from toolself.trajectory import write_jsonl
    from toolself.variants import load_run_preset

    try:
        run_preset = load_run_preset(preset) if preset else None
    except ValueError as exc:
        _fail(str(exc))
    if time_limit is not None:
        warn("--time-limit is deprecated; it is --timeout, as in `toolself eval`")
        timeout = timeout if timeout is not None else time_limit
    try:
        spec = ModelSpec.parse(model)
        writer_spec = ModelSpec.parse(config_model) if config_model else None
    except ValueError as exc:
        _fail(str(exc))
    settings = _agent_settings(spec, method, tuple(freeze), run_preset, max_stages=max_stages,
                               max_steps_per_stage=max_steps, max_total_tokens=max_tokens, time_limit=timeout,
                               context_budget=context_budget)
    options = _policy_options(model, spec, run_preset, temperature, seed, dtype, request)
    tool_options = tool_options.with_cache(default_web_cache())
    pool = _checked_pool(tool_options, run_preset)
    console.print(f"loading the model {model} ...", highlight=False)
    started = time.monotonic()
    policy = _load_policy(model, spec, options)
    writer = _load_writer(writer_spec)
    collection = tool_options.collection()
    console.print(f"loaded in {time.monotonic() - started:.1f} s", highlight=False)
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
        ctx = ToolContext(workspace=workspace.resolve(), collection=collection, model=policy)
    else:
        ctx = ToolContext.temporary(collection=collection, model=policy)
    console.print(f"[bold]task:[/bold] {task}\n[bold]method:[/bold] {settings.method}   [bold]model:[/bold] {model}")
    try:
        agent = Agent(policy, pool, settings, config_model=writer, observer=RichObserver(console))
        with keeping_the_attempt(out):
            trajectory = agent.run(task, ctx)
    finally:
        ctx.close()
        pool.close()
    write_jsonl(out, [trajectory])
    console.print(f"[bold]answer:[/bold] {escape(repr(trajectory.answer))}")
    console.print(f"trajectory written to {out}", highlight=False)
    if trajectory.error:
        _fail(f"the attempt failed: {trajectory.error.strip().splitlines()[-1]}", code=1)


@app.command()
@tool_options
def serve(
    model: str = typer.Option("embedded", "--model", "-m", help=MODEL_SPECS),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    method: str = typer.Option("toolself", help="The served agent's method, listed as toolself:METHOD "
                                                "(see `toolself methods`)."),
    freeze: list[str] = FREEZE,
    config_model: Optional[str] = CONFIG_MODEL,
    preset: Optional[str] = preset_option(),
    out: Path = typer.Option(Path("runs/serve"), help="Folder whose trajectories.jsonl receives every agent "
                                                      "attempt (`toolself view` opens it)."),
    agent_concurrency: int = typer.Option(2, min=1, help="Most agent attempts running at once; later "
                                                         "requests wait their turn."),
    max_stages: int = typer.Option(6, min=1, help="Most stages in an agent attempt."),
    max_steps: int = typer.Option(12, min=1, help="Most actions in one stage."),
    max_tokens: int = typer.Option(200_000, min=1, help="Most prompt + completion tokens in an agent attempt."),
    timeout: Optional[float] = typer.Option(None, min=1, help="Wall-clock limit of an agent attempt in seconds "
                                                              "(default: none)."),
    context_budget: Optional[int] = typer.Option(None, min=1, help="Visible-context budget in the model's tokens "
                                                 "(default: 3000 for the embedded model and local ones under 1B "
                                                 "parameters, else 16000)."),
    tool_options: ToolOptions = ToolOptions(),
) -> None:
    """Serve a model, and the ToolSelf agent over it, behind an OpenAI-compatible API
    (/v1/chat/completions, /v1/models, /health).

    A request naming the model gets the model's reply. A request naming the agent
    (toolself:METHOD) runs one whole attempt on its last user message, with the tools these
    options give, and answers with the final answer; the trajectory is appended to
    OUT/trajectories.jsonl, its id in the X-Toolself-Trajectory header and the body's
    `toolself` field. For example:

        curl localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
          -d '{"model": "toolself:toolself", "messages": [{"role": "user", "content": "Who founded Brightwater?"}]}'
    """
    from toolself.serve import serve as serve_model
    from toolself.serve_agent import ServedAgent
    from toolself.variants import load_run_preset

    try:
        spec = ModelSpec.parse(model)
        writer_spec = ModelSpec.parse(config_model) if config_model else None
        run_preset = load_run_preset(preset) if preset else None
    except ValueError as exc:
        _fail(str(exc))
    settings = _agent_settings(spec, method, tuple(freeze), run_preset, max_stages=max_stages,
                               max_steps_per_stage=max_steps, max_total_tokens=max_tokens, time_limit=timeout,
                               context_budget=context_budget)
    tool_options = tool_options.with_cache(default_web_cache())
    pool = _checked_pool(tool_options, run_preset)
    try:
        policy = _load_policy(model, spec, _policy_options(model, spec, run_preset, 0.0, 0, dtype))
        agent = ServedAgent(policy, pool, settings, out, concurrency=agent_concurrency,
                            collection=tool_options.collection(), preset=preset,
                            config_model=_load_writer(writer_spec))
        try:
            serve_model(policy, host=host, port=port, agent=agent)
        finally:
            agent.close()
    finally:
        pool.close()


@app.command()
def methods() -> None:
    """List the methods (the paper's variants and ablations)."""
    from toolself.variants import methods as all_methods

    from toolself.variants import presets

    for m in all_methods() + presets():
        console.print(f"[bold]{m.name:28}[/bold] {m.summary}")


def _mount() -> None:
    """Sub-commands live beside what they drive; they import their heavy parts lazily."""
    from toolself.demo_cli import demo_command
    from toolself.evals.cli import tasks_app
    from toolself.evals.eval_cli import eval_command, report_command
    from toolself.tools.cli import tools_app
    from toolself.train.cli import train_app
    from toolself.viewer.cli import view_command

    app.command("demo")(demo_command)
    app.command("eval")(eval_command)
    app.command("report")(report_command)
    app.command("view")(view_command)
    app.add_typer(tools_app, name="tools")
    app.add_typer(tasks_app, name="tasks")
    app.add_typer(train_app, name="train")


_mount()


def main() -> None:  # pragma: no cover
    sys.exit(app())
