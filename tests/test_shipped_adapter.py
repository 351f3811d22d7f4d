"""The CAT-trained adapter shipped in the package (`--model embedded:cat`) is the one its
provenance.json describes."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from rich.console import Console

from toolself.models import load_model, runs_in_process, shipped_adapter

ADAPTER = shipped_adapter("embedded:cat")
if not (ADAPTER / "provenance.json").is_file():
    pytest.skip("the CAT adapter is not built into this checkout yet: make embedded-cat", allow_module_level=True)
RECORD = json.loads((ADAPTER / "provenance.json").read_text(encoding="utf-8"))
CONFIG = json.loads((ADAPTER / "adapter_config.json").read_text(encoding="utf-8"))


def test_the_shipped_files_are_the_ones_the_provenance_hashed():
    for name, digest in RECORD["files"].items():
        assert hashlib.sha256((ADAPTER / name).read_bytes()).hexdigest() == digest, name


def test_the_adapter_config_is_the_recorded_base_model_rank_and_target_modules():
    assert CONFIG["base_model_name_or_path"] == RECORD["base_model"]
    assert (CONFIG["r"], CONFIG["lora_alpha"]) == (RECORD["lora"]["r"], RECORD["lora"]["lora_alpha"])
    assert sorted(CONFIG["target_modules"]) == RECORD["lora"]["target_modules"]
    assert CONFIG.get("layers_to_transform") == RECORD["lora"]["layers_to_transform"]


def test_the_provenance_records_a_rebuildable_run_on_the_published_tasks():
    assert RECORD["suite_key"] == "public" and RECORD["command"].endswith("make embedded-cat")
    assert RECORD["recipe"]["rft"]["lora_layers"] == len(RECORD["lora"]["layers_to_transform"])
    assert RECORD["training_data"]["sft"]["trajectories"] > 0 and len(RECORD["commit"]) == 40
    assert set(RECORD["heldout"]["tasks"]["cat"]) == set(RECORD["heldout"]["tasks"]["zero-shot"])


def test_the_adapter_is_small_enough_to_ship_in_the_package():
    assert (ADAPTER / "adapter_model.safetensors").stat().st_size < 20_000_000


def test_embedded_cat_is_a_model_this_process_loads_with_the_small_models_budgets():
    from toolself.models.spec import model_defaults

    assert runs_in_process("embedded:cat") and not runs_in_process("embedded:nope")
    assert model_defaults("embedded:cat") == model_defaults("embedded")


def test_every_weight_of_the_adapter_lands_on_a_layer_of_the_base_model():
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from toolself.models.weights import adapter_base

    base = AutoModelForCausalLM.from_pretrained(str(adapter_base(ADAPTER)), dtype="float32")
    model = PeftModel.from_pretrained(base, str(ADAPTER))
    lora = {n for n, _ in model.named_parameters() if "lora_" in n}
    layers = {int(n.split(".layers.")[1].split(".")[0]) for n in lora}
    assert lora and layers == set(RECORD["lora"]["layers_to_transform"])
    assert any(float(p.abs().sum()) > 0 for n, p in model.named_parameters() if "lora_B" in n)  # trained, not fresh


def test_the_adapter_solved_a_data_task_the_zero_shot_model_failed_so_the_demo_has_one():
    from toolself.demo import chosen_task

    assert chosen_task(RECORD).startswith("data-heldout-")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_on_the_demo_task_the_adapter_reproduces_its_recorded_greedy_success(tmp_path):
    """The demo's zero-shot attempt is left out: the record holds its failure, and it runs to the
    demo's budgets, which on a CPU without bfloat16 kernels means its 300-second limit."""
    from toolself.demo import CONTENDERS, run_demo

    [cat] = run_demo(tmp_path / "trajectories.jsonl", Console(file=io.StringIO()), contenders=CONTENDERS[1:])
    assert cat.model == "embedded:cat" and cat.correct  # as the adapter's evaluation recorded
    assert cat.trajectory.end_reason == "terminate"


def test_an_unknown_shipped_adapter_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown shipped adapter"):
        load_model("embedded:nope")
