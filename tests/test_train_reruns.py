"""Rerunning a training command: the same run is resumed or, once finished, not trained again;
another run in the same folder is refused with what differs, or replaced when asked.

The runs are real: RFT of a random-initialised tiny model on the expert teacher's trajectories,
through `train_rft` and through the command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from lora_adapters import random_lora_adapter  # noqa: E402
from toolself.train import reruns as R  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def settings(out: Path, **changed) -> dict:
    return {"output_dir": str(out / "checkpoints"), "max_steps": 2, "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 1, "learning_rate": 1e-2, "compile_layers": False, "bf16": False,
            "disable_tqdm": True, "lora_layers": 2, **changed}


@pytest.fixture(scope="module")
def finished(tiny, tiny_sft, tmp_path_factory):
    """A finished RFT run's folder."""
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    out = tmp_path_factory.mktemp("finished")
    train_rft(tiny_sft[0], tiny, out, RFTConfig(**settings(out)))
    return out


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def test_a_rerun_of_a_finished_run_returns_its_result_and_trains_nothing(finished, tiny, tiny_sft):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    before = snapshot(finished)
    again = train_rft(tiny_sft[0], tiny, finished, RFTConfig(**settings(finished)), resume=True)
    assert again.extra["finished_earlier"]
    assert {k: v for k, v in again.to_dict().items() if k != "extra"} == \
        {k: v for k, v in json.loads(before[R.RESULT_FILE]).items() if k != "extra"}
    assert snapshot(finished) == before  # adapter, log and result untouched


def test_a_rerun_from_data_read_back_from_disk_is_the_same_run(finished, tiny, tiny_sft):
    from datasets import load_from_disk

    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    again = train_rft(load_from_disk(str(tiny_sft[1])), tiny, finished, RFTConfig(**settings(finished)), resume=True)
    assert again.extra["finished_earlier"]


def test_a_rerun_with_other_settings_is_refused_with_what_differs(finished, tiny, tiny_sft):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    before = snapshot(finished)
    with pytest.raises(R.TrainingMismatch, match=r"(?s)a model trained.*learning_rate: was 0.01, now 0.02"):
        train_rft(tiny_sft[0], tiny, finished, RFTConfig(**settings(finished, learning_rate=2e-2)), resume=True)
    assert snapshot(finished) == before


def test_a_rerun_on_other_data_is_refused(finished, tiny, tiny_sft):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    dataset = tiny_sft[0]
    fewer = dataset.select(range(len(dataset) - 1))
    with pytest.raises(R.TrainingMismatch, match=f"data: was {len(dataset)} examples, now {len(dataset) - 1}"):
        train_rft(fewer, tiny, finished, RFTConfig(**settings(finished)), resume=True)


def test_where_a_run_writes_logs_and_saves_is_not_part_of_what_it_trains(tiny_sft):
    from toolself.train.rft_config import RFTConfig

    one = RFTConfig(**settings(Path("a")))
    other = RFTConfig(**settings(Path("b"), checkpoint_minutes=5, stop_grace_seconds=120, logging_steps=10,
                                 save_strategy="steps", dataloader_num_workers=2, report_to="tensorboard"))
    dataset = tiny_sft[0]
    assert R.run_definition(one, "m", dataset, ["input_ids"]) == R.run_definition(other, "m", dataset, ["input_ids"])


def test_the_data_digest_sees_one_changed_token():
    from datasets import Dataset

    rows = {"input_ids": [[1, 2, 3], [4, 5]], "labels": [[-100, 2, 3], [4, 5]]}
    changed = {"input_ids": [[1, 2, 3], [4, 6]], "labels": rows["labels"]}
    moved = {"input_ids": [[1, 2], [3, 4, 5]], "labels": [[-100, 2], [3, 4, 5]]}  # same tokens, other split
    digest = R.data_digest(Dataset.from_dict(rows), ["input_ids", "labels"])
    assert digest == R.data_digest(Dataset.from_dict(rows), ["input_ids", "labels"])
    assert digest != R.data_digest(Dataset.from_dict(changed), ["input_ids", "labels"])
    assert digest != R.data_digest(Dataset.from_dict(moved), ["input_ids", "labels"])


def test_a_retrained_adapter_in_the_same_folder_is_another_base(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"one")
    first = R.base_identity(tmp_path)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"two")
    assert R.base_identity(tmp_path)["path"] == first["path"]
    assert R.base_identity(tmp_path) != first


# Where each kind of launch saves a checkpoint's optimizer state: transformers' optimizer.pt,
# accelerate's FSDP files, DeepSpeed's folder.
SAVED_AS = {"whole": "optimizer.pt", "fsdp-full": "optimizer.bin", "fsdp-sharded": "optimizer_0/",
            "deepspeed": "global_step{step}/"}


def checkpoint(folder: Path, step: int, optimizer: str | None = None) -> Path:
    """A checkpoint, with its optimizer state's files as the `optimizer` kind of launch saves them."""
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if optimizer and SAVED_AS[optimizer].endswith("/"):
        (path / SAVED_AS[optimizer].format(step=step)).mkdir()
    elif optimizer:
        (path / SAVED_AS[optimizer]).write_bytes(b"")
    return path


DEFINITION = {"base": {"path": "/m"}, "data": {"examples": 3, "digest": "d"},
              "settings": {"learning_rate": 0.01, R.ORDER_SETTING: R.DATA_ORDER}}
OTHER = {**DEFINITION, "settings": {**DEFINITION["settings"], "learning_rate": 0.02}}


def test_a_fresh_start_clears_the_old_runs_checkpoints_which_the_trainers_rotation_would_keep(tmp_path):
    # the trainer keeps the highest-numbered checkpoints: a stale checkpoint-500 would outlive
    # the new run's checkpoint-45, and a crash would then resume from it
    checkpoint(tmp_path / "checkpoints", 500)
    (tmp_path / R.RESULT_FILE).write_text("{}")
    point = R.start_point(tmp_path, tmp_path / "checkpoints", DEFINITION, resume=False)
    assert point == R.StartPoint()
    assert not list((tmp_path / "checkpoints").iterdir()) and not (tmp_path / R.RESULT_FILE).exists()
    assert json.loads((tmp_path / R.SETTINGS_FILE).read_text()) == DEFINITION


def test_the_same_run_resumes_from_its_checkpoint(tmp_path):
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(DEFINITION))
    latest = checkpoint(tmp_path / "checkpoints", 9)
    assert R.start_point(tmp_path, tmp_path / "checkpoints", DEFINITION, resume=True) == R.StartPoint(checkpoint=latest)


def test_a_checkpoint_of_another_run_is_refused_or_replaced_when_asked(tmp_path):
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(OTHER))
    checkpoint(tmp_path / "checkpoints", 9)
    with pytest.raises(R.TrainingMismatch, match=r"(?s)checkpoint-9.*learning_rate: was 0.02, now 0.01"):
        R.start_point(tmp_path, tmp_path / "checkpoints", DEFINITION, resume=True)
    assert R.start_point(tmp_path, tmp_path / "checkpoints", DEFINITION, resume=True,
                         replace_other=True) == R.StartPoint()
    assert not list((tmp_path / "checkpoints").iterdir())
    assert json.loads((tmp_path / R.SETTINGS_FILE).read_text()) == DEFINITION


def test_a_checkpoint_recorded_before_a_setting_existed_is_refused_naming_it(tmp_path):
    # a KTO run checkpointed before its decisions were put in a seeded order: another order now
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(DEFINITION))
    checkpoint(tmp_path / "checkpoints", 9)
    now = {**DEFINITION, "settings": {**DEFINITION["settings"], "length_grouped": None}}
    with pytest.raises(R.TrainingMismatch, match="length_grouped: was not recorded, now None"):
        R.start_point(tmp_path, tmp_path / "checkpoints", now, resume=True)


@pytest.mark.parametrize("state_dict_type, reads", [("FULL_STATE_DICT", "fsdp-full"),
                                                     ("SHARDED_STATE_DICT", "fsdp-sharded")])
def test_an_fsdp_launch_reads_the_optimizer_files_its_state_dict_type_saves(state_dict_type, reads):
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin

    from toolself.train.checkpoints import launch_layout

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=state_dict_type)
    trainer = SimpleNamespace(is_deepspeed_enabled=False, is_fsdp_enabled=True,  # the trainer's flags under FSDP
                              accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
    assert launch_layout(trainer) == reads


def in_processes(count: int, accumulation: int = 1, learning_rate: float = 0.01) -> dict:
    return {**DEFINITION, "settings": {"learning_rate": learning_rate, "world_size": count,
                                       "gradient_accumulation_steps": accumulation}}


def test_a_checkpoint_made_in_another_number_of_processes_resumes_with_the_accumulation_that_keeps_its_batch(
        tmp_path):
    # a preempted job of 8 GPUs rescheduled onto 2, then onto 4: the effective batch counts every process
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(in_processes(8)))
    latest = checkpoint(tmp_path / "checkpoints", 9, optimizer="whole")
    point = R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(2), resume=True)
    assert point.checkpoint == latest and (point.moved.was, point.moved.now, point.moved.accumulation) == (8, 2, 4)
    assert json.loads((tmp_path / R.SETTINGS_FILE).read_text()) == in_processes(8)  # the run as it started
    again = R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(4), resume=True)
    assert (again.moved.was, again.moved.now, again.moved.accumulation) == (8, 4, 2)
    assert R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(8), resume=True).moved is None


def test_a_checkpoint_whose_batch_another_number_of_processes_cannot_share_evenly_is_refused_naming_those_that_can(
        tmp_path):
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(in_processes(2, accumulation=2)))
    checkpoint(tmp_path / "checkpoints", 9, optimizer="whole")
    with pytest.raises(R.TrainingMismatch, match=r"(?s)world_size: was 2, now 3\n"
                                                 r"It ran in 2 processes of 2 accumulation steps each: .*"
                                                 r"torchrun --nproc_per_node 2.*or resume it in one process or 4 "
                                                 r"processes"):
        R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(3, accumulation=2), resume=True)


def test_a_checkpoint_of_optimizer_state_split_between_its_processes_resumes_only_in_as_many(tmp_path):
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(in_processes(8)))
    checkpoint(tmp_path / "checkpoints", 9, optimizer="deepspeed")
    with pytest.raises(R.TrainingMismatch, match=r"(?s)world_size: was 8, now 1\n"
                                                 r"It ran in 8 processes, and checkpoint-9's optimizer state was saved "
                                                 r"by DeepSpeed, which .*torchrun --nproc_per_node 8"):
        R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(1), resume=True)
    with pytest.raises(R.TrainingMismatch) as refused:  # relaunching would not resume it: no such advice
        R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(1, learning_rate=0.02), resume=True)
    assert "It ran in" not in str(refused.value)


@pytest.mark.parametrize("saved", [*SAVED_AS, None])
def test_a_checkpoint_resumes_only_under_the_kind_of_launch_that_saved_its_optimizer_state(tmp_path, saved):
    from toolself.train.checkpoints import LAUNCHES, unreadable_optimizer_state

    latest = checkpoint(tmp_path, 9, optimizer=saved)
    for reads in LAUNCHES:
        refusal = unreadable_optimizer_state(latest, reads)
        assert (refusal is None) == (saved in (reads, None)), (saved, reads)
        if refusal:
            assert f"saved by a launch with {LAUNCHES[saved].name}" in refusal and "--no-resume" in refusal


def test_a_run_finished_in_other_processes_is_not_trained_again(tmp_path):
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(in_processes(8)))
    (tmp_path / R.RESULT_FILE).write_text(json.dumps({"steps": 3}))
    assert R.start_point(tmp_path, tmp_path / "checkpoints", in_processes(1), resume=True) == \
        R.StartPoint(finished={"steps": 3})


def test_a_checkpoint_from_before_definitions_were_recorded_resumes_and_adopts_this_one_but_its_order(tmp_path):
    latest = checkpoint(tmp_path / "checkpoints", 4)
    assert R.start_point(tmp_path, tmp_path / "checkpoints", DEFINITION, resume=True) == \
        R.StartPoint(checkpoint=latest, order_unrecorded=True)
    recorded = json.loads((tmp_path / R.SETTINGS_FILE).read_text())
    assert recorded == {**DEFINITION, "settings": {"learning_rate": 0.01}}


def test_a_checkpoint_made_under_other_compute_settings_is_the_same_run_and_says_what_changed(tmp_path):
    # bf16 on the node the run started on; the node it resumes on computes in fp32
    made = {**DEFINITION, "compute": {"bf16": True, "attn_implementation": None}}
    now = {**DEFINITION, "compute": {"bf16": False, "attn_implementation": None}}
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(made))
    latest = checkpoint(tmp_path / "checkpoints", 9)
    point = R.start_point(tmp_path, tmp_path / "checkpoints", now, resume=True)
    assert point == R.StartPoint(checkpoint=latest, compute_changes=["bf16: was True, now False"])
    assert json.loads((tmp_path / R.SETTINGS_FILE).read_text()) == now


def test_a_definition_recorded_with_its_compute_among_its_settings_is_read_as_one_kept_apart(tmp_path):
    recorded = {**DEFINITION, "settings": {**DEFINITION["settings"], "bf16": True, "use_cpu": True}}
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(recorded))
    (tmp_path / R.RESULT_FILE).write_text(json.dumps({"steps": 3}))
    now = {**DEFINITION, "compute": {"bf16": False, "use_cpu": True}}
    assert R.start_point(tmp_path, tmp_path / "checkpoints", now, resume=True) == R.StartPoint(finished={"steps": 3})


def test_precision_and_kernels_are_kept_apart_from_what_a_run_trains(tiny_sft):
    from toolself.train.rft_config import RFTConfig

    plain = R.run_definition(RFTConfig(**settings(Path("a"))), "m", tiny_sft[0], ["input_ids"])
    other = R.run_definition(RFTConfig(**settings(Path("a"), bf16=True, attn_implementation="eager",
                                                  cache_frozen_layers=False)), "m", tiny_sft[0], ["input_ids"])
    assert R.defining(plain) == R.defining(other)
    assert R.changed_settings(plain["compute"], other["compute"]) == [
        "attn_implementation: was None, now 'eager'", "bf16: was False, now True",
        "cache_frozen_layers: was True, now False"]


@pytest.mark.slow
def test_a_run_checkpointed_in_bf16_resumes_in_fp32_from_its_checkpoint(tmp_path, tiny, tiny_sft):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    steps = {"max_steps": 3, "save_strategy": "steps", "save_steps": 1}
    first = train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**settings(tmp_path, bf16=True, **steps)))
    assert first.steps == 3
    # as a run killed while saving its last step leaves it
    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint-3")
    (tmp_path / R.RESULT_FILE).unlink()
    resumed = train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**settings(tmp_path, bf16=False, **steps)),
                        resume=True)
    assert resumed.extra["resumed_from_step"] == 2 and resumed.steps == 3
    assert resumed.extra["resumed_with_other_compute"] == ["bf16: was True, now False"]
    assert json.loads((tmp_path / R.SETTINGS_FILE).read_text())["compute"]["bf16"] is False


def as_deepspeed_saved_it(checkpoint: Path) -> None:
    """`checkpoint`'s files laid out as a ZeRO launch through the trainer leaves them (DeepSpeed
    cannot run on a CPU): the optimizer state in DeepSpeed's global_stepN folder, no optimizer.pt."""
    step = checkpoint.name.rsplit("-", 1)[1]
    shards = checkpoint / f"global_step{step}"
    shards.mkdir()
    (checkpoint / "optimizer.pt").rename(shards / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (checkpoint / "latest").write_text(f"global_step{step}")


def test_a_checkpoint_deepspeed_saved_is_refused_by_a_launch_without_it_which_would_reset_its_optimizer(
        tmp_path, tiny, tiny_sft):
    # transformers reads only optimizer.pt without DeepSpeed, and on finding none goes on with a
    # new optimizer state and learning-rate schedule, without a word
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    steps = {"max_steps": 2, "save_strategy": "steps", "save_steps": 1}
    train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**settings(tmp_path, **steps)))
    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint-2")
    (tmp_path / R.RESULT_FILE).unlink()
    as_deepspeed_saved_it(tmp_path / "checkpoints" / "checkpoint-1")
    with pytest.raises(R.TrainingMismatch, match=r"checkpoint-1's optimizer state is in global_step1/, saved by a "
                                                 r"launch with DeepSpeed; this launch, with neither DeepSpeed nor "
                                                 r"FSDP, reads optimizer.pt only .*--config_file zero2.yaml"):
        train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**settings(tmp_path, **steps)), resume=True)
    assert (tmp_path / "checkpoints" / "checkpoint-1" / "global_step1").is_dir()  # kept for the launch that reads it


def train_rft_command(tiny: Path, attempts: Path, out: Path, steps: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolself", "train", "rft", "--trajectories", str(attempts),
                           "--student", str(tiny), "--max-length", "256", "--out", str(out), "--max-steps", str(steps),
                           "--batch-size", "1", "--grad-accum", "1", "--eager-layers"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.slow
def test_train_rft_rerun_says_it_has_nothing_to_train_and_refuses_other_settings(tmp_path, tiny, tiny_attempts):
    out, attempts = tmp_path / "rft", tiny_attempts[2]
    first = train_rft_command(tiny, attempts, out)
    assert first.returncode == 0, first.stderr[-3000:]
    again = train_rft_command(tiny, attempts, out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already holds this run's trained model" in again.stdout and "RFT done: 1 steps" in again.stdout
    other = train_rft_command(tiny, attempts, out, steps=2)
    assert other.returncode == 2
    assert "max_steps: was 1, now 2" in other.stderr and "--no-resume" in other.stderr


def merged_q_proj(base: Path):
    from safetensors.torch import load_file

    weights = {}
    for shard in base.glob("*.safetensors"):
        weights.update(load_file(str(shard)))
    return next(w for name, w in weights.items() if name.endswith("layers.0.self_attn.q_proj.weight"))


def test_kto_starts_from_a_merge_of_the_rft_adapter_now_in_its_folder_not_of_the_one_merged_before(tmp_path, tiny):
    from toolself.train.merge import prepare_base

    rft, out = tmp_path / "rft", tmp_path / "kto"
    random_lora_adapter(tiny, rft, seed=1)
    base = prepare_base(rft, out)
    first, made = merged_q_proj(base), (base / "config.json").stat().st_mtime_ns
    assert prepare_base(rft, out) == base and (base / "config.json").stat().st_mtime_ns == made  # reused

    random_lora_adapter(tiny, rft, seed=2)  # RFT trained again into the same folder
    assert prepare_base(rft, out) == base
    assert not merged_q_proj(base).equal(first)
    random_lora_adapter(tiny, tmp_path / "fresh", seed=2)
    assert merged_q_proj(base).equal(merged_q_proj(prepare_base(tmp_path / "fresh", tmp_path / "other")))


def test_a_base_model_mounted_at_another_path_is_the_same_base_and_the_adapter_finds_it_there(
        finished, tiny, tiny_sft, tmp_path):
    from toolself.models.weights import adapter_base
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    resumed = shutil.copytree(finished, tmp_path / "run")
    node_a = str(tmp_path / "node-a" / "models" / "tiny")  # not mounted here
    recorded = json.loads((resumed / "train_settings.json").read_text())
    recorded["base"]["path"] = node_a
    (resumed / "train_settings.json").write_text(json.dumps(recorded))
    adapter = json.loads((resumed / "adapter_config.json").read_text())
    (resumed / "adapter_config.json").write_text(json.dumps({**adapter, "base_model_name_or_path": node_a}))
    again = train_rft(tiny_sft[0], tiny, resumed, RFTConfig(**settings(resumed)), resume=True)
    assert again.extra["finished_earlier"]
    assert adapter_base(resumed) == Path(tiny).resolve()  # so the next step (KTO's merge, a served model) loads


def test_a_copy_of_the_base_beside_the_original_is_another_base(finished, tiny, tmp_path):
    copy = shutil.copytree(tiny, tmp_path / "copy")  # the same config and file sizes: not proof of one model
    recorded = json.loads((finished / "train_settings.json").read_text())["base"]
    assert not R.same_base(recorded, R.base_identity(copy))
    assert R.same_base(recorded, R.base_identity(tiny))


def test_another_model_at_the_same_path_is_another_base(tmp_path, tiny):
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    before = R.base_identity(model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rope_theta": 1234.0}))
    assert not R.same_base(before, R.base_identity(model))
    assert R.differences({"base": before}, {"base": R.base_identity(model)}) == [
        f"base model: the model in {model.resolve()} has changed"]


def test_a_full_model_recorded_by_its_path_alone_is_still_known_by_it(tmp_path, tiny):
    now = R.base_identity(Path(tiny))
    assert R.same_base({"path": now["path"]}, now)
    assert not R.same_base({"path": str(tmp_path)}, now)


def test_an_adapter_finds_its_base_where_it_was_relocated_only_while_the_path_it_names_is_gone(tmp_path):
    from toolself.models.digests import BASE_LOCATION, relocate_base
    from toolself.models.weights import adapter_base

    named, mounted, adapter = tmp_path / "node-a", tmp_path / "node-b", tmp_path / "rft"
    for folder in (named, mounted, adapter):
        folder.mkdir()
    (named / "config.json").write_text("{}")
    (mounted / "config.json").write_text("{}")
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(named)}))
    relocate_base(adapter, named)
    assert not (adapter / BASE_LOCATION).exists()  # where it was trained: nothing to record
    relocate_base(adapter, mounted)
    assert adapter_base(adapter) == named  # still there: the path it names wins
    shutil.rmtree(named)
    assert adapter_base(adapter) == mounted.resolve()
    assert json.loads((adapter / "adapter_config.json").read_text()) == {"base_model_name_or_path": str(named)}


def test_an_adapter_cut_short_while_saving_is_not_relocated_and_does_not_stop_the_step_that_redoes_it(tmp_path):
    from toolself.models.digests import BASE_LOCATION, relocate_base

    (tmp_path / "adapter_config.json").write_text("")  # killed between opening the file and writing it
    relocate_base(tmp_path, tmp_path)
    assert not (tmp_path / BASE_LOCATION).exists()


def test_an_adapter_trained_on_an_adapter_is_not_relocated_to_it(tmp_path):
    from toolself.models.digests import BASE_LOCATION, relocate_base

    student, rft = tmp_path / "student-adapter", tmp_path / "rft"
    for folder in (student, rft):
        folder.mkdir()
    (student / "adapter_config.json").write_text("{}")
    (rft / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(rft / "base")}))
    relocate_base(rft, student)  # its base is the merge in rft/base, not the student adapter
    assert not (rft / BASE_LOCATION).exists()


def test_an_adapter_whose_base_is_nowhere_here_says_how_to_find_it(tmp_path):
    from toolself.models.base import ModelError
    from toolself.models.weights import adapter_base

    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/node-a/models/qwen3"}))
    with pytest.raises(ModelError, match="trained on '/node-a/models/qwen3'.*rerun the `train rft` or `train cat`"):
        adapter_base(tmp_path)


def test_a_moved_run_folder_keeps_its_merged_base_and_its_kto_adapter_finds_it(tmp_path, tiny):
    from toolself.models.weights import adapter_base, load_weights
    from toolself.train.merge import MERGED_FROM, prepare_base

    run = tmp_path / "run"
    random_lora_adapter(tiny, run / "rft", seed=1)
    random_lora_adapter(prepare_base(run / "rft", run / "kto"), run / "kto", seed=2)  # names run/kto/base
    shutil.move(run, tmp_path / "moved")  # copied off the cluster, or mounted elsewhere
    moved = tmp_path / "moved"
    merged = (moved / "kto" / "base" / "model.safetensors").stat().st_mtime_ns
    assert prepare_base(moved / "rft", moved / "kto") == (moved / "kto" / "base").resolve()
    assert (moved / "kto" / "base" / "model.safetensors").stat().st_mtime_ns == merged  # not merged again
    assert json.loads((moved / "kto" / "base" / MERGED_FROM).read_text())["path"] == str(run / "rft")
    assert adapter_base(moved / "kto") == moved / "kto" / "base"
    model, _, _ = load_weights(moved / "kto", dtype="float32")  # how `--model local:moved/kto` loads it
    assert model.config.num_hidden_layers > 0


def checkpointed_rft(out: Path, tiny: Path, sft, micro_batch: int, **recorded_settings) -> dict:
    """A finished RFT run of two steps, a checkpoint a step, made to look unfinished and recorded
    with `recorded_settings` changed (None: left out); returns its settings."""
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    config = settings(out, per_device_train_batch_size=micro_batch, save_strategy="steps", save_steps=1)
    train_rft(sft, tiny, out, RFTConfig(**config))
    (out / R.RESULT_FILE).unlink()
    recorded = json.loads((out / R.SETTINGS_FILE).read_text())
    for name, value in recorded_settings.items():
        if value is None:
            del recorded["settings"][name]
        else:
            recorded["settings"][name] = value
    (out / R.SETTINGS_FILE).write_text(json.dumps(recorded))
    return config


@pytest.mark.parametrize("micro_batch", [1, 2])  # 2: grouped by length, in micro-batches of 2 kept
def test_rft_resumes_in_another_number_of_processes_with_its_batches_grouped_or_not(tmp_path, tiny, tiny_sft,
                                                                                     micro_batch):
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    config = checkpointed_rft(tmp_path, tiny, tiny_sft[0], micro_batch, world_size=2)
    result = train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**config), resume=True)
    assert result.extra["resumed_in_other_processes"] == {"processes_was": 2, "processes_now": 1,
                                                          "gradient_accumulation_steps": 2}
    assert result.extra["kernels"]["batch_size"] == micro_batch and result.extra["kernels"]["accumulation"] == 2
    assert result.extra["kernels"]["length_grouped"] == (micro_batch > 1)


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_an_rft_checkpoint_from_before_its_order_was_recorded_is_refused_only_when_grouped_by_length(
        tmp_path, tiny, tiny_sft, micro_batch):
    # transformers' length-grouped sampler drew each epoch's order from the random state
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    config = checkpointed_rft(tmp_path, tiny, tiny_sft[0], micro_batch, **{R.ORDER_SETTING: None})
    if micro_batch > 1:
        for _ in range(2):  # and again: refusing it did not record the order it refused
            with pytest.raises(R.TrainingMismatch, match="drawn from its random state"):
                train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**config), resume=True)
        return
    assert train_rft(tiny_sft[0], tiny, tmp_path, RFTConfig(**config), resume=True).extra["resumed_from_step"] == 2


def test_rft_grouped_by_length_and_resumed_in_its_second_epoch_reads_the_batches_it_would_have(tmp_path, tiny,
                                                                                              tiny_sft, monkeypatch):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    read = []
    collate = DataCollatorForLanguageModeling.__call__

    def recording(self, examples):
        read.append(sorted(tuple(e["input_ids"]) for e in examples))
        return collate(self, examples)

    monkeypatch.setattr(DataCollatorForLanguageModeling, "__call__", recording)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    config = settings(whole, per_device_train_batch_size=2, max_steps=-1, num_train_epochs=2, save_strategy="steps",
                      save_steps=1, save_total_limit=None)
    result = train_rft(tiny_sft[0], tiny, whole, RFTConfig(**config))
    assert result.extra["kernels"]["length_grouped"]
    uninterrupted, per_epoch = list(read), len(read) // 2
    assert uninterrupted[:per_epoch] != uninterrupted[per_epoch:]  # a new order each epoch
    shutil.copytree(whole, resumed)
    (resumed / R.RESULT_FILE).unlink()
    for folder in (resumed / "checkpoints").glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > per_epoch + 1:
            shutil.rmtree(folder)
    read.clear()
    train_rft(tiny_sft[0], tiny, resumed, RFTConfig(**{**config, "output_dir": str(resumed / "checkpoints")}),
              resume=True)
    assert read == uninterrupted[per_epoch + 1:]
