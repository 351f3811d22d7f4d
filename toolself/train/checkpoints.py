"""Checkpoints by the clock, so that a crash costs minutes of a long training run, not the run.

The trainers save nothing before the end unless asked to (`save_strategy`): on a CPU run of
minutes a checkpoint costs more than it protects. A GPU run of hours is the other way round,
and how many steps it will take is not known when it is configured. So, unless a run asks for
checkpoints by steps or epochs, one is taken every `checkpoint_minutes` of training, only the
latest is kept, and it is removed once the final model is saved. Rerunning the command resumes
from it (`--resume`, the default).

And one when the run is asked to stop (`asked_to_stop`): a scheduler preempting a job sends
SIGTERM and kills it some seconds later (Slurm after `KillWait`, 30 s by default; Kubernetes
after the pod's grace period, 30 s), or SIGUSR1 ahead of its time limit when asked, and a step
of an 8B LoRA run takes seconds, so the run checkpoints at the end of the step it is in, stops,
and the same command resumes it there. Not every step fits: the recipe's 8 sequences of up to 16k
tokens per GPU and step at the ~2,700 tokens/s measured on an H200 take up to ~50 s. So a run
whose step and checkpoint together take longer than the scheduler waits says so once, early
(`slower_than_grace`).
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME as STATE_FILE  # what the trainer writes last into a checkpoint
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from toolself.evals.records import atomic_write_lines
from toolself.interrupts import STOP_SIGNALS, handling_stop_signals, launched_rank
from toolself.train.collective import same_on_every_process

PREFIX = PREFIX_CHECKPOINT_DIR + "-"
# What Slurm (KillWait), Kubernetes (terminationGracePeriodSeconds) and torchrun
# (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) wait between SIGTERM and SIGKILL unless configured otherwise,
# and what each, in that order, sets in the environment of the processes it runs.
SCHEDULER_GRACE_SECONDS = 30.0
SCHEDULED = ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST", "TORCHELASTIC_RUN_ID")

logger = logging.getLogger(__name__)


class TimedCheckpoints(TrainerCallback):
    """Asks the trainer to save a resumable checkpoint (weights, optimizer, scheduler, data
    position, random states) once `minutes` have passed since training began or since the last
    save ended."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60
        self.last = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if same_on_every_process(time.monotonic() - self.last >= self.seconds, args.device):
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


@dataclass
class StopRequest:
    """A stop signal seen during training (`signal`, its name), and the step the run then
    checkpointed and ended at (`step`, on every process)."""

    signal: str | None = None
    step: int | None = None


@contextmanager
def asked_to_stop() -> Iterator[StopRequest]:
    """A block in which a stop signal (`interrupts.STOP_SIGNALS`) does not stop the process but
    is recorded in the request that `CheckpointWhenAskedToStop` reads at the end of each step."""
    request = StopRequest()

    def record(signum: int, _frame: Any) -> None:
        request.signal = signal.Signals(signum).name

    with handling_stop_signals(record):
        yield request


# What torchrun (and accelerate launch, which runs it) handles unless told otherwise.
LAUNCHER_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def signals_the_launcher_drops(environ: Mapping[str, str]) -> str | None:
    """Why a stop signal sent to this run's launcher would not reach the run, or None. torchrun
    passes on to its processes only the signals it handles (`--signals-to-handle`); any other,
    such as the SIGUSR1 that Slurm sends ahead of a time limit, kills the launcher at once, and
    the job ends without the checkpoint the signal asked for."""
    if launched_rank(environ) is None:  # not under torchrun
        return None
    handled = [name.strip() for name in environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", LAUNCHER_SIGNALS).split(",")]
    dropped = [stop.name for stop in STOP_SIGNALS if stop.name not in handled]
    if not dropped:
        return None
    wanted = ",".join(handled + dropped)
    return (f"the launcher does not pass {' or '.join(dropped)} on to this run: sent to it (as Slurm sends SIGUSR1 "
            f"ahead of a time limit, --signal=USR1@N), it would die at once and the run with it, without a "
            f"checkpoint. Launch with PET_SIGNALS_TO_HANDLE={wanted} in the environment (torchrun "
            f"--signals-to-handle {wanted}) to have the run save a checkpoint and stop")


class CheckpointWhenAskedToStop(TrainerCallback):
    """At the end of the step in which a stop signal came (to process 0: a launcher passes it to
    every process), saves a resumable checkpoint and ends training.

    A signal waits for the rest of its step and then the checkpoint, while the scheduler kills
    the job `grace_seconds` after it. So a run whose longest step and checkpoint together take
    longer says so once (`slower_than_grace`), while there is time to give the job more grace
    or take shorter steps, rather than being killed before the checkpoint it was asked for."""

    def __init__(self, request: StopRequest, grace_seconds: float = SCHEDULER_GRACE_SECONDS,
                 checkpoint_minutes: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.request, self.grace, self.clock = request, grace_seconds, clock
        self.checkpoint_minutes = checkpoint_minutes
        self.longest_step = self.saving = 0.0
        self.since = clock()  # the end of the last step or save: the trainer reads the next step's data from there
        self.steps = 0
        self.warned = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.since, self.steps = self.clock(), 0

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        self.steps += 1
        if self.steps > 1:  # a run's first step warms up: compiles, allocates, skips a resumed run's data
            self.longest_step = max(self.longest_step, now - self.since)
            self.warn_if_slower_than_grace(state)
        self.since = now
        if same_on_every_process(self.request.signal is not None, args.device):
            control.should_save = control.should_training_stop = True
            self.request.step = state.global_step

    def on_save(self, args, state, control, **kwargs):
        now = self.clock()  # the trainer saves right after the step's end
        self.saving, self.since = now - self.since, now
        self.warn_if_slower_than_grace(state)

    def warn_if_slower_than_grace(self, state) -> None:
        if self.warned or not state.is_world_process_zero:
            return
        why = slower_than_grace(self.longest_step, self.saving, self.grace, self.checkpoint_minutes)
        if why:
            self.warned = True
            logger.warning(why)


def stop_grace(asked: float | None, environ: Mapping[str, str]) -> float:
    """The seconds a stop signal leaves this run: the ones asked for; else 30 where a scheduler or
    launcher that kills after that runs it; else 0, no warning: a run in a terminal is stopped by
    its user, who waits."""
    if asked is not None:
        return asked
    return SCHEDULER_GRACE_SECONDS if any(name in environ for name in SCHEDULED) else 0.0


def slower_than_grace(step_seconds: float, saving_seconds: float, grace_seconds: float,
                      checkpoint_minutes: float = 0.0) -> str | None:
    """Why a stop signal would not get this run its checkpoint before the scheduler kills it, or
    None. `grace_seconds` 0 asks for no warning."""
    if not grace_seconds or step_seconds + saving_seconds <= grace_seconds:
        return None
    took = f"a training step takes up to {step_seconds:.1f} s" + (
        f" and saving a checkpoint {saving_seconds:.1f} s" if saving_seconds else "")
    back = (f"its last timed checkpoint (one every {checkpoint_minutes:g} minutes)" if checkpoint_minutes
            else "its last checkpoint")
    return (f"{took}, longer than the {grace_seconds:g} s a scheduler waits after SIGTERM before killing a job "
            f"(30 s unless set: Slurm's KillWait, a Kubernetes pod's grace period, torchrun's shutdown timeout): "
            f"preempted, this run would be killed before the checkpoint it was asked for and go back to {back}. "
            "Give the job more time to stop (Slurm: GraceTime, KillWait, or --signal=USR1@N ahead of a time limit; "
            "Kubernetes: terminationGracePeriodSeconds; under torchrun, TORCH_ELASTIC_SHUTDOWN_TIMEOUT too) and say "
            "so with --stop-grace (stop_grace_seconds), or take shorter steps (--grad-accum)")


def checkpoint_step(folder: Path) -> int | None:
    name = folder.name
    if folder.is_dir() and name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
        return int(name[len(PREFIX):])
    return None


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint the trainer finished writing. Its state file comes last, so a
    process killed while saving leaves a newer folder without one; transformers'
    `get_last_checkpoint` would pick that folder and resume from half a checkpoint."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    complete = [(step, p) for p in folder.iterdir()
                if (step := checkpoint_step(p)) is not None and (p / STATE_FILE).is_file()]
    return max(complete)[1] if complete else None


def remove_checkpoints(output_dir: str | Path) -> None:
    """Every checkpoint folder in `output_dir`: once the final model is saved they only hold
    disk (an 8B full fine-tune's optimizer state alone is ~64 GB). Then `output_dir` itself, if
    all it holds is the model card the trainer writes beside its checkpoints."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if checkpoint_step(path) is not None:
            shutil.rmtree(path, ignore_errors=True)
    card = folder / "README.md"
    if [p.name for p in folder.iterdir()] == [card.name] and "generated_from_trainer" in card.read_text(
            errors="replace"):
        shutil.rmtree(folder, ignore_errors=True)


def trim_log(path: Path, step: int) -> None:
    """Drop the training log's records of steps after `step`, where a resumed run starts again,
    and a line torn by the crash, so that each step is logged once."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("step") is None or record["step"] <= step:
            kept.append(line)
    atomic_write_lines(path, kept)


def trainer_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))


def resumed_step(checkpoint: Path) -> int:
    return int(trainer_state(checkpoint)["global_step"])


def resumed_micro_batch(checkpoint: Path | None) -> int | None:
    """The micro-batch (sequences per process and micro-step) the checkpoint's run trained with."""
    size = trainer_state(checkpoint).get("train_batch_size") if checkpoint is not None else None
    return int(size) if size else None


def unrestorable_resume(processes: int, device_type: str, transformers_version: str) -> str | None:
    """Why this installation cannot resume a checkpoint, or None. transformers before 5.18 reads
    a resumed run's optimizer state onto the training device when the run has several processes,
    and on CPUs that device is an indexed "cpu:0", which torch cannot restore: the run would
    fail after loading its model, with "don't know how to restore data location"."""
    from packaging.version import Version

    if processes > 1 and device_type == "cpu" and Version(transformers_version) < Version("5.18"):
        return (f"resuming a run of {processes} processes on CPUs needs transformers 5.18 or later: "
                f"{transformers_version} cannot read the checkpoint's optimizer state back "
                "(pip install -U 'transformers>=5.18'; the checkpoint is kept)")
    return None


@dataclass(frozen=True)
class Launch:
    """A kind of launch, as a checkpoint's optimizer state shows it: the trainer saves that state
    in `files` under it and reads it back from there only."""

    name: str
    files: str
    again: str  # how to launch a run so again


LAUNCHES = {
    "deepspeed": Launch("DeepSpeed", "global_step{step}/", "the DeepSpeed config it ran under (accelerate launch "
                        "--config_file zero2.yaml or zero3.yaml, of toolself/train/accelerate/)"),
    "fsdp-full": Launch("FSDP with full state dicts", "optimizer.bin", "the FSDP config it ran under (accelerate "
                        "launch --config_file fsdp.yaml, of toolself/train/accelerate/)"),
    "fsdp-sharded": Launch("FSDP with sharded state dicts", "optimizer_0/",
                           "the FSDP config it ran under (fsdp_state_dict_type: SHARDED_STATE_DICT)"),
    "whole": Launch("neither DeepSpeed nor FSDP", "optimizer.pt", "neither DeepSpeed nor FSDP (python, torchrun, or "
                    "accelerate launch --config_file ddp.yaml, of toolself/train/accelerate/)"),
}


def optimizer_layout(checkpoint: Path) -> str | None:
    """Which kind of launch saved `checkpoint`'s optimizer state (a key of LAUNCHES), by the
    files it left; None where it saved none (`save_only_model`)."""
    if any(p.is_dir() for p in checkpoint.glob("global_step*")):
        return "deepspeed"
    if (checkpoint / "optimizer.bin").is_file():
        return "fsdp-full"
    if (checkpoint / "optimizer_0").is_dir() or any(checkpoint.glob("optimizer_0_rank*.bin")):
        return "fsdp-sharded"
    return "whole" if (checkpoint / "optimizer.pt").is_file() else None


def launch_layout(trainer: Any) -> str:
    """Where `trainer`, as launched, reads a checkpoint's optimizer state from."""
    if trainer.is_deepspeed_enabled:
        return "deepspeed"
    if trainer.is_fsdp_enabled:
        kind = trainer.accelerator.state.fsdp_plugin.state_dict_type
        return "fsdp-full" if "FULL_STATE_DICT" in str(getattr(kind, "name", kind)) else "fsdp-sharded"
    return "whole"


def unreadable_optimizer_state(checkpoint: Path, reads: str) -> str | None:
    """Why a launch that reads optimizer state as `reads` cannot resume `checkpoint`, or None.
    Without DeepSpeed, transformers finds no optimizer.pt in a DeepSpeed checkpoint and goes on
    with a new optimizer state and learning-rate schedule, without a word; the other mismatches
    fail as they load, after the model has."""
    saved = optimizer_layout(checkpoint)
    if saved is None or saved == reads:
        return None
    step = checkpoint.name.removeprefix(PREFIX)
    was, now = LAUNCHES[saved], LAUNCHES[reads]
    silently = (" (transformers would go on without it, with a new optimizer state and learning-rate schedule)"
                if saved == "deepspeed" else "")
    return (f"{checkpoint.name}'s optimizer state is in {was.files.format(step=step)}, saved by a launch with "
            f"{was.name}; this launch, with {now.name}, reads {now.files.format(step=step)} only{silently}. Launch it "
            f"with {was.again} to go on from it, or train afresh with --no-resume")
