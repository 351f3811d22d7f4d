"""The shipped multi-GPU configurations are valid accelerate configurations for what they claim.

They are checked with accelerate's own config classes and launch validation (the code
`accelerate launch --config_file` runs before it starts any process); the GPU runs themselves
are documented in docs/training.md, not faked here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from accelerate.commands.config.config_args import ClusterConfig  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

CONFIGS = Path(str(resources.files("toolself") / "train" / "accelerate"))


def validated(name: str):
    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / name), "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    return args, defaults


def test_the_four_configs_ship_with_the_package():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == ["ddp.yaml", "fsdp.yaml", "zero2.yaml", "zero3.yaml"]


@pytest.mark.parametrize("name", ["ddp.yaml", "fsdp.yaml", "zero2.yaml", "zero3.yaml"])
def test_every_key_is_one_accelerate_knows(name):
    config = ClusterConfig.from_yaml_file(str(CONFIGS / name))  # raises on unknown keys
    assert config.mixed_precision == "bf16" and config.num_processes == 8 and config.use_cpu is False


def test_ddp_launches_one_replica_per_gpu():
    args, defaults = validated("ddp.yaml")
    assert defaults.distributed_type == DistributedType.MULTI_GPU and args.multi_gpu and not args.use_deepspeed


@pytest.mark.parametrize("name,stage", [("zero2.yaml", 2), ("zero3.yaml", 3)])
def test_deepspeed_configs_select_their_zero_stage(name, stage):
    args, defaults = validated(name)
    assert defaults.distributed_type == DistributedType.DEEPSPEED and args.use_deepspeed
    assert args.zero_stage == stage
    assert defaults.deepspeed_config["offload_param_device"] == "none"


def test_zero3_gathers_a_16bit_model_when_saving():
    _, defaults = validated("zero3.yaml")
    assert defaults.deepspeed_config["zero3_save_16bit_model"] is True
    assert defaults.deepspeed_config["zero3_init_flag"] is True


def test_fsdp_shards_per_decoder_layer_with_fsdp2():
    args, defaults = validated("fsdp.yaml")
    assert defaults.distributed_type == DistributedType.FSDP and args.use_fsdp
    assert str(args.fsdp_version) == "2"
    assert defaults.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
