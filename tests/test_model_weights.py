"""How `local:DIR` reads an adapter: merged into its base in the dtype it runs in, on its device,
with no float32 copy of the base on the way (on a GPU: read straight onto the GPU)."""

import subprocess
import sys
from pathlib import Path

import pytest

# Grown: the peak resident size (reset once the libraries are imported) less the size then, in KiB.
GROWTH_PROBE = """
import sys
import peft, torch, transformers
from toolself.models.weights import load_weights
before = int(open("/proc/self/statm").read().split()[1]) * 4
open("/proc/self/clear_refs", "w").write("5")
load_weights(sys.argv[1], "bfloat16")
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) - before)
"""


def adapter_on(base: Path, folder: Path) -> Path:
    """A random, non-zero LoRA adapter on every linear layer of `base`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(folder))
    return folder


def float32_merge(adapter: Path, base: Path):
    """The merge in float32, as `local:` made it before."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def stored_as(dtype, tiny: Path, folder: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(str(tiny), dtype=getattr(torch, dtype)).save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(tiny)).save_pretrained(str(folder))
    return folder


def test_an_adapter_on_a_bfloat16_checkpoint_merges_in_bfloat16_to_the_float32_merge_rounded(tiny, tmp_path):
    import torch

    from toolself.models.weights import load_weights

    base = stored_as("bfloat16", tiny, tmp_path / "base")
    adapter = adapter_on(base, tmp_path / "adapter")
    merged, _, _ = load_weights(adapter, "bfloat16")
    expected = dict(float32_merge(adapter, base).to(torch.bfloat16).named_parameters())
    assert all(p.dtype == expected[n].dtype for n, p in merged.named_parameters())
    assert all(bool((p == expected[n]).all()) for n, p in merged.named_parameters())


def test_an_adapter_on_a_float32_checkpoint_merges_in_bfloat16_off_by_the_bases_own_rounding_at_most(tiny, tmp_path):
    """The base is rounded to bfloat16 before the update is added: against the float32 merge
    rounded once, a weight is off by at most half a bfloat16 step of the base weight plus a
    step of the result (relative steps of 2^-8 and 2^-7)."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolself.models.weights import load_weights

    adapter = adapter_on(tiny, tmp_path / "adapter")
    merged, _, _ = load_weights(adapter, "bfloat16")
    expected = dict(float32_merge(adapter, tiny).named_parameters())
    base = dict(AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).named_parameters())
    moved = 0
    for name, weight in merged.named_parameters():
        error = (weight.float() - expected[name].to(torch.bfloat16).float()).abs()
        assert bool((error <= 2**-8 * base[name].abs() + 2**-7 * expected[name].abs()).all()), name
        moved += int((error > 0).sum())
    assert moved > 0  # ... which does move some weights


def test_a_bfloat16_load_of_an_adapter_holds_no_float32_copy_of_its_base(tmp_path):
    """The default model (135M parameters, stored in float32: 540 MB) with an adapter, read in
    bfloat16: the process grows by the bfloat16 model (270 MB) and one float32 tensor at a time,
    not by the float32 base and its bfloat16 copy (~700 MB before)."""
    from toolself.models.weights import MissingWeightsError, default_model_dir

    try:
        base = default_model_dir()
    except MissingWeightsError as exc:
        pytest.skip(str(exc))
    adapter = adapter_on(base, tmp_path / "adapter")
    float32_bytes = sum(f.stat().st_size for f in base.glob("*.safetensors"))
    run = subprocess.run([sys.executable, "-c", GROWTH_PROBE, str(adapter)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    grown = int(run.stdout.split()[-1]) * 1024
    assert grown < float32_bytes, f"reading in bfloat16 grew the process by {grown / 2**20:.0f} MiB"


def test_a_models_weight_bytes_come_from_its_files_headers_in_the_dtype_it_is_read_in(tiny):
    import torch
    from transformers import AutoModelForCausalLM

    from toolself.models.weights import weights_bytes

    parameters = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(tiny)).parameters())
    assert weights_bytes(tiny, torch.bfloat16) == 2 * parameters
    assert weights_bytes(tiny, torch.float32) == 4 * parameters


def test_a_model_larger_than_the_gpus_free_memory_is_refused_before_it_is_read(tiny, monkeypatch):
    import torch

    from toolself.models.base import ModelError
    from toolself.models.weights import load_weights, require_gpu_room, weights_bytes

    needed = weights_bytes(tiny, torch.bfloat16)
    monkeypatch.setattr("toolself.models.weights.default_device", lambda: "cuda")
    monkeypatch.setattr("toolself.models.weights.gpu_has_bfloat16", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (needed - 1, 24 << 30))
    with pytest.raises(ModelError, match=r"for its weights in bfloat16, .*CUDA_VISIBLE_DEVICES="):
        load_weights(str(tiny))  # on a CUDA-less torch, reading onto the GPU would fail otherwise
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (needed, 24 << 30))
    require_gpu_room(tiny, torch.bfloat16, "cuda")
    with pytest.raises(ModelError, match=r"in float32 \(--dtype bfloat16 takes half"):
        require_gpu_room(tiny, torch.float32, "cuda")  # a GPU older than Ampere loads float32 by default


def test_reading_and_merging_an_adapter_warn_of_nothing_only_the_libraries_could_fix(tiny, tmp_path):
    """peft reads an attribute transformers deprecated as it wraps a model: a FutureWarning the
    user can do nothing about, at every `local:ADAPTER` load and every merge."""
    import warnings

    from toolself.models.weights import load_weights
    from toolself.train.merge import merged_model

    adapter = adapter_on(tiny, tmp_path / "adapter")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_weights(adapter, "float32")
        merged_model(adapter)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]


def test_only_the_libraries_own_calls_of_the_old_checkpointing_names_are_silenced():
    """TRL's KTO trainer toggles checkpointing by the old method names; a recipe that sets the
    old TrainingArguments field is the user's to update, and keeps its warning."""
    import warnings

    from toolself.models.weights import ignore_library_deprecations

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ignore_library_deprecations()
        for old in ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable",
                    "gradient_checkpointing"):  # as transformers words them
            new = old.replace("gradient", "activation")
            warnings.warn(f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead.", FutureWarning)
    assert [str(w.message).split("`")[1] for w in caught] == ["gradient_checkpointing"]
