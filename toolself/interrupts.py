"""What a command does on Ctrl-C: keep what was done, say how to go on, exit with 130 (the
shell's status for a process ended by SIGINT), so that a script can tell an interrupt from a
failure. The stop signals (`STOP_SIGNALS`) are taken as Ctrl-C by these commands: SIGTERM,
which a scheduler preempting a job, a container runtime stopping one or a plain `kill` sends,
and SIGUSR1, which Slurm sends ahead of a job's time limit when asked (`--signal=USR1@90`) and
which would otherwise end the process at once. A trainer running when one arrives saves a
checkpoint at the end of its step instead (`train.checkpoints.asked_to_stop`).

`toolself run` appends the attempt so far, marked `interrupted`, to its output file. The
commands whose work can be resumed (`eval`, `train rft | kto | cat | study`) print one line,
the exact command that resumes it: the same command line, with the command's `--resume` flag
where it has one that was off. They do the same, with status 1, when their work stopped on its
own for a cause that a rerun can get past once it is mended (`StoppedEarly`: a model server
that went down).
"""

from __future__ import annotations

import functools
import os
import shlex
import signal
import sys
import threading
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

EXIT_INTERRUPTED = 130
EXIT_STOPPED = 1


class StoppedEarly(RuntimeError):
    """Work that stopped before its end and keeps what it did: once the cause in the message
    is mended, the same command resumes it."""

F = TypeVar("F", bound=Callable)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextmanager
def handling_stop_signals(handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """`handler` for the stop signals inside the block, the handlers before it afterwards. Signal
    handlers belong to the main thread: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_signal_interrupts() -> AbstractContextManager[None]:
    """A block in which a stop signal raises KeyboardInterrupt, as Ctrl-C does."""
    return handling_stop_signals(_interrupt)


def resume_command(argv: list[str], resume_off: bool) -> str:
    """The command line that resumes a command run as `argv`: the same one, with `--resume`
    (in place of `--no-resume`) when the command's resume flag is off."""
    program = ["python", "-m", "toolself"] if Path(argv[0]).name == "__main__.py" else ["toolself"]
    args = argv[1:]
    if resume_off:
        args = [a for a in args if a != "--no-resume"] + ["--resume"]
    return shlex.join(program + args)


def launched_rank(environ: Mapping[str, str]) -> int | None:
    """This process's rank among those a launcher (torchrun, accelerate launch) started, or None
    without one."""
    return int(environ["RANK"]) if "TORCHELASTIC_RUN_ID" in environ and "RANK" in environ else None


def say_how_to_resume(command: F) -> F:
    """Decorates a resumable command: Ctrl-C (or a stop signal) ends it with status 130 and the
    resume line, a `StoppedEarly` with status 1, its message and the resume line. Under a
    launcher, every process runs the command and is stopped, and the first one says so, for all."""

    def ended(code: int, said: str, resume_off: bool) -> None:
        rank = launched_rank(os.environ)
        if not rank:
            again = resume_command(sys.argv, resume_off)
            if rank == 0:
                again += " (its processes started as before: torchrun or accelerate launch, with the same options)"
            _say(f"{said}{again}")
        raise SystemExit(code) from None

    @functools.wraps(command)
    def resumable(*args, **kwargs):
        try:
            with stop_signal_interrupts():
                return command(*args, **kwargs)
        except KeyboardInterrupt:
            ended(EXIT_INTERRUPTED, "interrupted; to resume: ", kwargs.get("resume") is False)
        except StoppedEarly as exc:
            ended(EXIT_STOPPED, f"error: {exc}\nto resume: ", kwargs.get("resume") is False)

    return resumable  # type: ignore[return-value]


@contextmanager
def keeping_the_attempt(out: Path) -> Iterator[None]:
    """Around `Agent.run`: on Ctrl-C, append the attempt so far to `out`, say so, exit 130."""
    from toolself.agent import interrupted_attempt
    from toolself.trajectory import write_jsonl

    try:
        with stop_signal_interrupts():
            yield
    except KeyboardInterrupt as exc:
        trajectory = interrupted_attempt(exc)
        if trajectory is None:
            _say("interrupted")
        else:
            write_jsonl(out, [trajectory])
            _say(f"interrupted; the attempt so far is written to {out}")
        raise SystemExit(EXIT_INTERRUPTED) from None
