"""Checkpoints by the clock: a training run killed part-way resumes where its last complete
checkpoint left it and ends as an uninterrupted run ends.

The runs are real: RFT of a random-initialised tiny model on the expert teacher's trajectories,
and the killed run is a process of its own, killed with SIGKILL in the middle of a step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from launchers import torchrun  # noqa: E402
from ports import free_port  # noqa: E402
from toolself.train import checkpoints as C  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8
KILLED_AT = 5  # killed after logging this step, before saving it


def settings(out: Path) -> dict:
    """Every step checkpointed; a decaying learning rate and the frozen-layer cache, so that a
    resume that lost the scheduler's or the data's position would show in the losses."""
    return dict(output_dir=str(out / "checkpoints"), max_steps=STEPS, num_train_epochs=100,
                per_device_train_batch_size=1, gradient_accumulation_steps=1, learning_rate=1e-2, warmup_steps=0,
                lr_scheduler_type="linear", compile_layers=False, bf16=False, disable_tqdm=True, lora_layers=2,
                checkpoint_minutes=1e-9)


# Prepended to a run's script: with KILL set, process 0 is SIGKILLed after it logs step
# KILLED_AT, before it saves that step's checkpoint.
KILLER = textwrap.dedent(f"""
    import os, signal
    from transformers import TrainerCallback
    import toolself.train.rft as R

    class Killed(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            if state.global_step == {KILLED_AT} and os.environ.get("KILL") and os.environ.get("RANK", "0") == "0":
                os.kill(os.getpid(), signal.SIGKILL)

    run_trainer = R.run_trainer
    R.run_trainer = lambda trainer, *a, **k: (trainer.add_callback(Killed()), run_trainer(trainer, *a, **k))[1]
""")

KILLED_RUN = KILLER + textwrap.dedent("""
    import json, sys
    from datasets import load_from_disk
    from toolself.train.rft_config import RFTConfig

    data, model, out, config = sys.argv[1:]
    R.train_rft(load_from_disk(data), model, out, RFTConfig(**json.loads(config)))
""")


def logged(log: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, log.read_text().splitlines())
            if r.get("event") == "log" and "loss" in r]


def steps_logged(log: Path) -> int:
    """The steps a running training has logged, a line it is writing not among them."""
    return sum('"loss"' in line for line in log.read_text().splitlines(keepends=True) if line.endswith("\n"))


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_from_its_last_complete_checkpoint_and_ends_as_if_never_stopped(
        tmp_path, tiny, tiny_sft):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    dataset, data_path = tiny_sft
    whole = train_rft(dataset, tiny, tmp_path / "whole", RFTConfig(**settings(tmp_path / "whole")))
    assert not (tmp_path / "whole" / "checkpoints").exists()  # removed once saved, with the trainer's model card

    out = tmp_path / "killed"
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, str(data_path), str(tiny), str(out),
                             json.dumps(settings(out))], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "KILL": "1"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    checkpoints = out / "checkpoints"
    assert [p.name for p in checkpoints.glob("checkpoint-*")] == [f"checkpoint-{KILLED_AT - 1}"]
    assert [step for step, _ in logged(out / "train_log.jsonl")] == list(range(1, KILLED_AT + 1))
    # a kill while saving leaves a newer checkpoint without the state the trainer writes last
    shutil.copytree(checkpoints / f"checkpoint-{KILLED_AT - 1}", checkpoints / f"checkpoint-{KILLED_AT}")
    (checkpoints / f"checkpoint-{KILLED_AT}" / C.STATE_FILE).unlink()

    resumed = train_rft(dataset, tiny, out, RFTConfig(**settings(out)), resume=True)
    assert resumed.extra["resumed_from_step"] == KILLED_AT - 1
    assert resumed.extra["kernels"]["why"]["batch_size"] == "as the run being resumed had it: 1 x 1"
    assert resumed.steps == whole.steps == STEPS
    steps, losses = zip(*logged(out / "train_log.jsonl"))
    assert list(steps) == list(range(1, STEPS + 1))  # each step once: the killed run's step 5 was dropped
    assert list(losses) == pytest.approx([loss for _, loss in logged(Path(whole.log))], rel=1e-5)
    final, expected = adapter(out), adapter(tmp_path / "whole")
    assert all(final[name].allclose(expected[name], rtol=1e-4, atol=1e-6) for name in expected)
    assert not checkpoints.exists()


def unclocked(out: Path) -> dict:
    """`settings` without checkpoints by the clock: the one a SIGTERM asks for is the only one."""
    return {**settings(out), "checkpoint_minutes": 60}


# A run sent a stop signal, as a scheduler preempting it would, once it has logged step TERMINATED_AT.
TERMINATED_AT = 3
TERMINATED_RUN = textwrap.dedent(f"""
    import json, os, signal, sys
    from datasets import load_from_disk
    from transformers import TrainerCallback
    import toolself.train.rft as R
    from toolself.interrupts import StoppedEarly
    from toolself.train.rft_config import RFTConfig

    class Preempted(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            if state.global_step == {TERMINATED_AT}:
                os.kill(os.getpid(), signal.Signals[os.environ["STOP_SIGNAL"]])

    run_trainer = R.run_trainer
    R.run_trainer = lambda trainer, *a, **k: (trainer.add_callback(Preempted()), run_trainer(trainer, *a, **k))[1]
    data, model, out, config = sys.argv[1:]
    try:
        R.train_rft(load_from_disk(data), model, out, RFTConfig(**json.loads(config)))
    except StoppedEarly as exc:
        print(exc)
        sys.exit(3)
""")


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGUSR1"])
def test_a_run_sent_a_stop_signal_checkpoints_the_step_it_is_in_stops_and_resumes_to_the_uninterrupted_end(
        tmp_path, tiny, tiny_sft, stop):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    dataset, data_path = tiny_sft
    whole = train_rft(dataset, tiny, tmp_path / "whole", RFTConfig(**unclocked(tmp_path / "whole")))

    out = tmp_path / "preempted"
    stopped = subprocess.run([sys.executable, "-c", TERMINATED_RUN, str(data_path), str(tiny), str(out),
                              json.dumps(unclocked(out))], cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "STOP_SIGNAL": stop})
    assert stopped.returncode == 3, stopped.stderr[-2000:]
    step = TERMINATED_AT + 1  # the signal came after step 3 ended: step 4 is the one it was in
    assert f"training stopped by {stop} at step {step}" in stopped.stdout
    assert [p.name for p in (out / "checkpoints").glob("checkpoint-*")] == [f"checkpoint-{step}"]
    assert not (out / "adapter_model.safetensors").exists()  # not a finished run

    resumed = train_rft(dataset, tiny, out, RFTConfig(**unclocked(out)), resume=True)
    assert resumed.extra["resumed_from_step"] == step and resumed.steps == STEPS
    losses = [loss for _, loss in logged(out / "train_log.jsonl")]
    assert losses == pytest.approx([loss for _, loss in logged(Path(whole.log))], rel=1e-5)
    final, expected = adapter(out), adapter(tmp_path / "whole")
    assert all(final[name].allclose(expected[name], rtol=1e-4, atol=1e-6) for name in expected)


def test_the_newest_checkpoint_without_its_state_file_is_not_resumed_from(tmp_path):
    for step, complete in ((3, True), (7, True), (12, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:
            (folder / C.STATE_FILE).write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-latest").mkdir()
    assert C.last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-7"
    assert C.resumed_step(tmp_path / "checkpoint-7") == 7
    assert C.last_complete_checkpoint(tmp_path / "absent") is None


def test_a_resumed_log_keeps_what_came_before_its_checkpoint_and_drops_a_torn_line(tmp_path):
    log = tmp_path / "train_log.jsonl"
    records = [{"event": "begin"}] + [{"event": "log", "step": s, "loss": 1.0 / s} for s in (1, 2, 3, 4)]
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"event": "log", "st')
    C.trim_log(log, 2)
    assert [json.loads(line) for line in log.read_text().splitlines()] == records[:3]


def test_runs_that_ask_for_step_or_epoch_checkpoints_keep_them_and_get_no_clock(tmp_path, tiny, tiny_sft):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    assert RFTConfig(output_dir="unused").checkpoint_minutes == 30
    config = RFTConfig(**{**settings(tmp_path), "max_steps": 4, "save_strategy": "steps", "save_steps": 2})
    train_rft(tiny_sft[0], tiny, tmp_path, config)
    # the run's own checkpoints stay, and the clock (due at every step here) added none at steps 1 and 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_a_run_whose_steps_and_checkpoints_outlast_the_stop_grace_warns_once_with_how_to_get_more(
        tmp_path, tiny, tiny_sft, caplog):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    assert RFTConfig(output_dir="unused").stop_grace_seconds is None  # chosen from where the run runs
    config = RFTConfig(**{**settings(tmp_path), "max_steps": 4, "stop_grace_seconds": 1e-6})
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        train_rft(tiny_sft[0], tiny, tmp_path, config)
    warnings = [r.getMessage() for r in caplog.records if r.name == C.__name__]
    assert len(warnings) == 1, warnings
    assert "saving a checkpoint" in warnings[0] and "longer than the 1e-06 s" in warnings[0]
    assert "--stop-grace" in warnings[0] and "timed checkpoint (one every 1e-09 minutes)" in warnings[0]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(callback: C.CheckpointWhenAskedToStop, clock: Clock, steps: list[float], save_after: dict[int, float]):
    """Drive `callback` as the trainer does through steps of the given seconds, each listed step
    followed by a checkpoint of the given seconds."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    args, state, control = SimpleNamespace(device="cpu"), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    for number, seconds in enumerate(steps, 1):
        clock.now += seconds
        state.global_step = number
        callback.on_step_end(args, state, control)
        if number in save_after:
            clock.now += save_after[number]
            callback.on_save(args, state, control)


@pytest.mark.parametrize("steps, saves, warned", [
    ([100, 20, 20], {}, None),  # the first step warms up; 20 s fits in 30
    ([1, 20, 20], {3: 15}, "a training step takes up to 20.0 s and saving a checkpoint 15.0 s"),
    ([1, 5, 31], {}, "a training step takes up to 31.0 s,"),
    ([1, 5, 5], {1: 24}, None),  # a step (the save not counted in it) and the save fit in the grace
])
def test_the_stop_grace_warning_counts_the_longest_step_but_the_first_and_the_last_checkpoint(
        caplog, steps, saves, warned):
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        run_steps(C.CheckpointWhenAskedToStop(C.StopRequest(), 30.0, clock=clock), clock, steps, saves)
    warnings = [r.getMessage() for r in caplog.records if r.name == C.__name__]
    assert warnings == [] if warned is None else (len(warnings) == 1 and warnings[0].startswith(warned)), warnings


@pytest.mark.parametrize("environ", [{"SLURM_JOB_ID": "7"}, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"},
                                     {"TORCHELASTIC_RUN_ID": "none", "RANK": "0"}])
def test_the_stop_grace_is_30_s_under_a_scheduler_or_launcher_unless_asked_otherwise(environ):
    assert C.stop_grace(None, environ) == 30
    assert C.stop_grace(120.0, environ) == 120 and C.stop_grace(0.0, environ) == 0


def test_a_run_in_a_terminal_gets_no_stop_grace_warning_unless_it_asks_for_one():
    assert C.stop_grace(None, {"HOME": "/home/me"}) == 0 and C.stop_grace(30.0, {}) == 30
    assert C.slower_than_grace(3600.0, 600.0, 0.0) is None
    assert C.slower_than_grace(3600.0, 600.0, 30.0).startswith("a training step takes up to 3600.0 s")


AGREEMENT = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    from toolself.train.collective import same_on_every_process

    rank, world, due = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "due"
    dist.init_process_group("gloo", init_method=sys.argv[4], rank=rank, world_size=world)
    print(same_on_every_process(due, "cpu"))
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("first_is_due", [True, False])
def test_every_process_saves_when_the_first_one_is_due_and_none_when_it_is_not(first_is_due):
    address = f"tcp://127.0.0.1:{free_port()}"
    clocks = ["due" if first_is_due else "not", "not" if first_is_due else "due"]
    processes = [subprocess.Popen([sys.executable, "-c", AGREEMENT, str(rank), "2", clock, address], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank, clock in enumerate(clocks)]
    answers = [p.communicate(timeout=120) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err[-1000:] for _, err in answers]
    assert [out.strip() for out, _ in answers] == [str(first_is_due)] * 2


LAUNCHED = KILLER + textwrap.dedent("""
    import runpy, sys

    sys.argv = ["toolself"] + sys.argv[1:]
    runpy.run_module("toolself", run_name="__main__")
""")


def rft_in_processes(tmp_path: Path, tiny: Path, attempts: Path, out: Path, processes: int = 2,
                     checkpoint_minutes: str = "1e-9") -> list[str]:
    """The command line of `train rft`, with a micro-batch of one and two accumulation steps,
    under torchrun in `processes` processes, or without a launcher in one."""
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED)
    launcher = torchrun(processes, tmp_path / "torchrun") if processes > 1 else [sys.executable]
    return [*launcher, str(script),
            "train", "rft", "--trajectories", str(attempts), "--student", str(tiny), "--out", str(out),
            "--max-length", "256", "--max-steps", str(STEPS), "--batch-size", "1", "--grad-accum", "2",
            "--eager-layers", "--checkpoint-minutes", checkpoint_minutes]


def train_rft_in_processes(tmp_path: Path, tiny: Path, attempts: Path, out: Path, processes: int = 2,
                           kill: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", **({"KILL": "1"} if kill else {})}
    return subprocess.run(rft_in_processes(tmp_path, tiny, attempts, out, processes), capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)


def ends_as(out: Path, whole: Path) -> None:
    """`out` logged every step once, with `whole`'s losses, and saved `whole`'s adapter."""
    steps, losses = zip(*logged(out / "train_log.jsonl"))
    assert list(steps) == list(range(1, STEPS + 1))
    assert list(losses) == pytest.approx([loss for _, loss in logged(whole / "train_log.jsonl")], rel=1e-5)
    final, expected = adapter(out), adapter(whole)
    assert all(final[name].allclose(expected[name], rtol=1e-4, atol=1e-6) for name in expected)


@pytest.mark.slow
def test_two_processes_killed_mid_way_resume_together_or_in_one_and_end_as_if_never_stopped(tmp_path, tiny,
                                                                                            tiny_attempts):
    """The multi-GPU path (`accelerate launch` / torchrun, one process per GPU) on gloo: the
    processes agree on when to save, resume from the same checkpoint and log each step once. A
    job rescheduled onto one GPU resumes the same checkpoint there, accumulating over twice the
    micro-batches, and ends as the two processes do."""
    attempts = tiny_attempts[2]
    whole = train_rft_in_processes(tmp_path, tiny, attempts, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "the launcher does not pass SIGUSR1 on to this run" in " ".join(whole.stderr.split())  # torchrun's default
    out, moved = tmp_path / "killed", tmp_path / "moved"
    killed = train_rft_in_processes(tmp_path, tiny, attempts, out, kill=True)
    assert killed.returncode != 0 and not (out / "train_result.json").exists()
    assert C.last_complete_checkpoint(out / "checkpoints") == out / "checkpoints" / f"checkpoint-{KILLED_AT - 1}"
    shutil.copytree(out, moved)

    in_one = train_rft_in_processes(tmp_path, tiny, attempts, moved, processes=1)
    assert in_one.returncode == 0, in_one.stderr[-3000:]
    result = json.loads((moved / "train_result.json").read_text())
    assert result["extra"]["resumed_in_other_processes"] == {"processes_was": 2, "processes_now": 1,
                                                             "gradient_accumulation_steps": 4}
    assert result["extra"]["resumed_from_step"] == KILLED_AT - 1 and result["steps"] == STEPS
    ends_as(moved, tmp_path / "whole")

    resumed = train_rft_in_processes(tmp_path, tiny, attempts, out)
    import transformers

    if C.unrestorable_resume(2, "cpu", transformers.__version__):  # before 5.18: refused, saying so
        assert resumed.returncode != 0 and "needs transformers 5.18 or later" in resumed.stderr
        assert C.last_complete_checkpoint(out / "checkpoints") == out / "checkpoints" / f"checkpoint-{KILLED_AT - 1}"
        return
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["extra"]["resumed_from_step"] == KILLED_AT - 1 and result["steps"] == STEPS
    ends_as(out, tmp_path / "whole")

    again = train_rft_in_processes(tmp_path, tiny, attempts, out)
    assert again.returncode == 0 and "already holds this run's trained model" in again.stdout


@pytest.mark.slow
def test_sigusr1_to_a_launcher_told_to_pass_it_on_checkpoints_the_step_the_processes_are_in(tmp_path, tiny,
                                                                                            tiny_attempts):
    """As Slurm sends it ahead of a time limit (--signal=USR1@N) to a job launched with torchrun
    or accelerate launch: torchrun dies of a signal it does not handle, unless told to pass it on
    (PET_SIGNALS_TO_HANDLE, as scripts/cat-qwen3.sh sets it)."""
    out = tmp_path / "run"
    command = rft_in_processes(tmp_path, tiny, tiny_attempts[2], out, checkpoint_minutes="60")
    env = {**os.environ, "COLUMNS": "200", "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"}
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    log, deadline = out / "train_log.jsonl", time.monotonic() + 300
    while not (log.is_file() and steps_logged(log) >= TERMINATED_AT) and launcher.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    launcher.send_signal(signal.SIGUSR1)
    stdout, stderr = launcher.communicate(timeout=300)
    said = " ".join((stdout + stderr).split())
    assert said.count("training stopped by SIGUSR1 at step") == 1 and "does not pass" not in said  # one says it
    assert "(its processes started as before: torchrun or accelerate launch" in said
    stopped_at = max(step for step, _ in logged(log))
    assert TERMINATED_AT <= stopped_at < STEPS and not (out / "train_result.json").exists()
    assert C.last_complete_checkpoint(out / "checkpoints") == out / "checkpoints" / f"checkpoint-{stopped_at}"


def test_a_launcher_that_would_die_of_a_stop_signal_is_named_with_the_setting_that_passes_it_on():
    assert C.signals_the_launcher_drops({}) is None  # no launcher: the run gets its signals itself
    launched = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0"}  # what torchrun sets in each process
    torchrun = {**launched, "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}
    dropped = C.signals_the_launcher_drops(torchrun)
    assert "does not pass SIGUSR1 on" in dropped
    assert "PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in dropped
    assert C.signals_the_launcher_drops({**torchrun, "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM, SIGUSR1"}) is None
    assert "SIGUSR1" in C.signals_the_launcher_drops(launched)  # torchrun's default


def test_a_resume_transformers_cannot_read_back_is_refused_only_for_several_cpu_processes_before_5_18():
    assert "needs transformers 5.18 or later" in C.unrestorable_resume(2, "cpu", "5.17.0")
    assert C.unrestorable_resume(2, "cpu", "5.18.0") is None
    assert C.unrestorable_resume(2, "cuda", "5.17.0") is None  # a GPU's device restores
    assert C.unrestorable_resume(1, "cpu", "5.17.0") is None  # one process reads it onto "cpu"
