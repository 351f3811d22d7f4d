"""Training launched as several processes (torchrun, accelerate launch) is one run of several
processes, on a machine without a GPU too (gloo), whatever the precision, and trains and counts
what one process does with the same effective batch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]

WORLD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft_config import RFTConfig

    bf16, out = sys.argv[1] == "bf16", Path(sys.argv[2])
    configs = {"rft": RFTConfig(output_dir="unused", bf16=bf16), "kto": CATKTOConfig(output_dir="unused", bf16=bf16)}
    seen = {stage: [config.process_index, config.world_size] for stage, config in configs.items()}
    (out / f"{configs['rft'].process_index}.json").write_text(json.dumps(seen))
""")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_processes_under_torchrun_form_one_group_of_two(tmp_path, precision):
    script = tmp_path / "world.py"
    script.write_text(WORLD)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), precision, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert seen == {f"{rank}.json": {"rft": [rank, 2], "kto": [rank, 2]} for rank in (0, 1)}


RFT_RUN = textwrap.dedent("""
    import json, sys
    from datasets import load_from_disk
    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    data, model, out, config = sys.argv[1:]
    train_rft(load_from_disk(data), model, out, RFTConfig(**json.loads(config)))
""")


def rft_settings(out: Path, accumulation: int) -> dict:
    """The frozen-layer cache on, no dropout: nothing random that would differ between a run's
    processes and a lone process."""
    return dict(output_dir=str(out / "checkpoints"), max_steps=3, num_train_epochs=100, per_device_train_batch_size=1,
                gradient_accumulation_steps=accumulation, learning_rate=1e-2, warmup_steps=0,
                lr_scheduler_type="constant", compile_layers=False, bf16=False, disable_tqdm=True, lora_layers=2,
                lora_dropout=0.0)


def logged_steps(out: Path) -> list[tuple[int, float, int]]:
    records = map(json.loads, (out / "train_log.jsonl").read_text().splitlines())
    return [(r["step"], r["loss"], r["tokens"]) for r in records if r.get("event") == "log" and "loss" in r]


@pytest.mark.slow
def test_two_processes_train_and_count_what_one_process_does_with_the_same_effective_batch(tmp_path, tiny, tiny_sft):
    """Each process of two takes every other sequence, so two processes accumulating 2 sequences
    take each step's 4 sequences as one process accumulating 4 does. The tokens logged are those
    trained on, by both processes (before, those of the batches built, one ahead of training,
    by process 0, times two)."""
    from safetensors.torch import load_file

    script, data = tmp_path / "rft.py", str(tiny_sft[1])
    script.write_text(RFT_RUN)
    runs = {"one": ([sys.executable, str(script)], 4),
            "two": ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     str(script)], 2)}
    for name, (launch, accumulation) in runs.items():
        out = tmp_path / name
        done = subprocess.run([*launch, data, str(tiny), str(out), json.dumps(rft_settings(out, accumulation))],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = logged_steps(tmp_path / "one"), logged_steps(tmp_path / "two")
    lengths = set(map(len, tiny_sft[0]["input_ids"]))
    assert lengths == {256}  # every sequence cut to 256 tokens: so a step's 4 are 1,024, in any order
    assert [(step, tokens) for step, _, tokens in one] == [(1, 1024), (2, 2048), (3, 3072)]
    assert [(step, tokens) for step, _, tokens in two] == [(step, tokens) for step, _, tokens in one]
    assert [loss for _, loss, _ in two] == pytest.approx([loss for _, loss, _ in one], rel=1e-5)
    results = {name: json.loads((tmp_path / name / "train_result.json").read_text()) for name in runs}
    assert results["two"]["tokens"] == results["one"]["tokens"] == one[-1][2]
    assert results["two"]["extra"]["padding_efficiency"] == results["one"]["extra"]["padding_efficiency"]
    trained, expected = load_file(str(tmp_path / "two" / "adapter_model.safetensors")), \
        load_file(str(tmp_path / "one" / "adapter_model.safetensors"))
    assert all(trained[name].allclose(expected[name], rtol=1e-4, atol=1e-6) for name in expected)
