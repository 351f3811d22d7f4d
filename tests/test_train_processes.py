"""Training launched as several processes (torchrun, accelerate launch) is one run of several
processes, on a machine without a GPU too (gloo), whatever the precision, and trains and counts
what one process does with the same effective batch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from launchers import torchrun  # noqa: E402
from ports import free_port  # noqa: E402

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
    done = subprocess.run([*torchrun(2, tmp_path / "torchrun"), str(script), precision, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
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
    """(step, loss, tokens) per step, the tokens checked against TRL's own count (`num_tokens`,
    gathered from every process)."""
    records = [r for r in map(json.loads, (out / "train_log.jsonl").read_text().splitlines())
               if r.get("event") == "log" and "loss" in r]
    assert all(r["tokens"] == r["num_tokens"] for r in records)
    return [(r["step"], r["loss"], r["tokens"]) for r in records]


@pytest.mark.slow
def test_two_processes_train_and_count_what_one_process_does_with_the_same_effective_batch(tmp_path, tiny, tiny_sft):
    """Each process of two takes every other sequence, so two processes accumulating 2 sequences
    take each step's 4 sequences as one process accumulating 4 does. The tokens logged are those
    trained on (the data loader builds a batch ahead of the step that trains on it), by every
    process (whose shards of a step need not be the same length)."""
    from safetensors.torch import load_file

    from toolself.train.rft import train_rft
    from toolself.train.rft_config import RFTConfig

    train_rft(tiny_sft[0], tiny, tmp_path / "one", RFTConfig(**rft_settings(tmp_path / "one", 4)))
    script, two = tmp_path / "rft.py", tmp_path / "two"
    script.write_text(RFT_RUN)
    done = subprocess.run([*torchrun(2, tmp_path / "torchrun"), str(script), str(tiny_sft[1]), str(tiny), str(two),
                           json.dumps(rft_settings(two, 2))],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = logged_steps(tmp_path / "one"), logged_steps(tmp_path / "two")
    lengths = set(map(len, tiny_sft[0]["input_ids"]))
    assert lengths == {256}  # every sequence cut to 256 tokens: so a step's 4 are 1,024, in any order
    assert [(step, tokens) for step, _, tokens in one] == [(1, 1024), (2, 2048), (3, 3072)]
    assert [(step, tokens) for step, _, tokens in two] == [(step, tokens) for step, _, tokens in one]
    assert [loss for _, loss, _ in two] == pytest.approx([loss for _, loss, _ in one], rel=1e-5)
    results = {name: json.loads((tmp_path / name / "train_result.json").read_text()) for name in ("one", "two")}
    assert results["two"]["tokens"] == results["one"]["tokens"] == one[-1][2]
    assert results["two"]["extra"]["padding_efficiency"] == results["one"]["extra"]["padding_efficiency"]
    caches = {name: results[name]["extra"]["frozen_layer_cache"] for name in ("one", "two")}
    assert (caches["one"]["processes"], caches["two"]["processes"]) == (1, 2)
    # every micro-batch looked up once, whichever process trained on it
    assert caches["two"]["hits"] + caches["two"]["misses"] == caches["one"]["hits"] + caches["one"]["misses"] == 12
    trained, expected = load_file(str(tmp_path / "two" / "adapter_model.safetensors")), \
        load_file(str(tmp_path / "one" / "adapter_model.safetensors"))
    assert all(trained[name].allclose(expected[name], rtol=1e-4, atol=1e-6) for name in expected)


KTO_RUN = textwrap.dedent("""
    import json, os, sys
    from datasets import load_from_disk
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference
    from toolself.train.kto import train_kto
    from toolself.train.kto_config import CATKTOConfig

    data, policy, out, config = sys.argv[1:]
    collate = DataCollatorForUnpairedPreference.__call__

    def recording(self, examples):  # each micro-batch this process reads, in order
        with open(f"{out}.batches-{os.environ['RANK']}.jsonl", "a") as f:
            f.write(json.dumps({key: sorted(e[key] for e in examples)
                                for key in ("completion_ids", "KL_completion_ids")}) + "\\n")
        return collate(self, examples)

    DataCollatorForUnpairedPreference.__call__ = recording
    train_kto(load_from_disk(data), policy, out, CATKTOConfig(**json.loads(config)))
""")


@pytest.mark.slow
def test_kto_in_two_processes_uses_every_adapter_weight_and_reads_each_epoch_in_a_new_order(tmp_path, tiny,
                                                                                            tiny_attempts):
    """DDP told to find unused parameters walks the autograd graph after every forward pass,
    and warns in each process when it finds none. Every adapter weight is used at every step, so
    it is not asked to; were one unused, DDP would refuse the next step, so the run trains eight.
    Eight steps are two epochs: the second shares the first's micro-batches out between the
    processes in another order, each micro-batch still with its own KL completions."""
    from transformers import AutoTokenizer

    from toolself.train import data as D

    attempts, schemas, _ = tiny_attempts
    decisions, _, _ = D.build_kto_dataset(attempts, D.Renderer(AutoTokenizer.from_pretrained(str(tiny)), schemas),
                                          max_length=256)
    decisions = decisions.map(lambda row, i: {"label": i % 2 == 0}, with_indices=True)  # both kinds
    decisions.save_to_disk(str(tmp_path / "data"))
    script, out = tmp_path / "kto.py", tmp_path / "kto"
    script.write_text(KTO_RUN)
    settings = dict(output_dir=str(out / "checkpoints"), max_steps=8, num_train_epochs=100,
                    per_device_train_batch_size=2, gradient_accumulation_steps=1, warmup_steps=0, bf16=False,
                    disable_tqdm=True, lora_layers=2, max_length=256)
    done = subprocess.run([*torchrun(2, tmp_path / "torchrun"), str(script), str(tmp_path / "data"), str(tiny),
                           str(out), json.dumps(settings)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["steps"] == 8
    assert "find_unused_parameters=True" not in done.stderr
    read = {rank: [json.loads(line) for line in Path(f"{out}.batches-{rank}.jsonl").read_text().splitlines()]
            for rank in (0, 1)}
    assert all(batch["KL_completion_ids"] == batch["completion_ids"] for rank in read for batch in read[rank])
    # 16 decisions, micro-batches of 2 on each of two processes: four steps an epoch
    epochs = [[json.dumps(batch) for rank in (0, 1) for batch in read[rank][e * 4:(e + 1) * 4]] for e in (0, 1)]
    assert sorted(epochs[0]) == sorted(epochs[1]) and len(set(epochs[0])) == 8
    assert epochs[0] != epochs[1]


# One process of a launched run on a GPU node, its GPU faked: CUDA there, with `free` GiB free.
CHOOSER = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    import torch
    import torch.distributed as dist
    import toolself.models.memory as memory
    from toolself.train import kernels as K

    rank, free, address = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    memory.gpu_memory = lambda device: (int(free * 2**30), 80 * 2**30)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    args = SimpleNamespace(attn_implementation=None, bf16=True, fp16=False, use_liger_kernel=None, use_cpu=False,
                           device=torch.device("cpu"), auto_batch_size=True, gradient_checkpointing=True,
                           per_device_train_batch_size=1, gradient_accumulation_steps=8,
                           train_sampling_strategy="random")
    shape = SimpleNamespace(**json.loads(sys.argv[4]))
    choice = K.choose_kernels(args, shape, longest=4096, padding_free=None)
    print(json.dumps([choice.batch_size, choice.accumulation, choice.why["batch_size"]]))
    dist.destroy_process_group()
""")
QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36}


def test_every_process_splits_the_effective_batch_as_the_fullest_gpu_allows():
    """GPU 0 of a node often holds more than the others (a stray CUDA context, a server's
    leftovers). Processes that split the effective batch differently accumulate over different
    counts of micro-batches, and their collectives, which pair up by count, no longer meet: such
    a run (1 x 4 beside 4 x 1, on gloo) hangs in its first step."""
    from toolself.train import kernels as K

    per_token = K.activation_bytes_per_token(SimpleNamespace(**QWEN3_8B), checkpointing=True)
    alone = {free: K.choose_batch(1, 8, 4096, int(free * 2**30), per_token)[:2] for free in (8, 70)}
    assert alone[8] != alone[70]  # the two GPUs alone would split the batch differently
    address = f"tcp://127.0.0.1:{free_port()}"
    processes = [subprocess.Popen([sys.executable, "-c", CHOOSER, str(rank), str(free), address,
                                   json.dumps(QWEN3_8B)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for rank, free in enumerate((8, 70))]
    answers = [p.communicate(timeout=120) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err[-2000:] for _, err in answers]
    chosen = [json.loads(out) for out, _ in answers]
    assert [(batch, steps) for batch, steps, _ in chosen] == [alone[8]] * 2
    assert all("8.0 GiB free on the fullest of 2 GPUs" in why for _, _, why in chosen)


# FSDP2 over two processes on gloo, adapters on the top two layers, without and then with the
# frozen-layer cache; process 0's second batch is its first again (a hit), process 1's is new (a miss).
SHARDED = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    from toolself.train.frozen_layers import cache_frozen_layers

    dist.init_process_group("gloo")
    rank, mesh = dist.get_rank(), init_device_mesh("cpu", (2,))
    generator = torch.Generator().manual_seed(1)
    a, b, c = (torch.randint(0, 1000, (1, 32), generator=generator) for _ in range(3))
    seen = {}
    for mode in ("plain", "cache"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], layers_to_transform=[2, 3]))
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.train()
        cache = cache_frozen_layers(model) if mode == "cache" else None
        losses = []
        for ids in ([a, a] if rank == 0 else [b, c]):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            losses.append(loss.item())
        seen[mode] = {"losses": losses, **({"hits": cache.hits, "misses": cache.misses} if cache else {})}
    with open(f"{sys.argv[2]}/{rank}.json", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_the_frozen_layer_cache_under_fsdp2_keeps_the_losses_while_one_process_hits_and_the_other_misses(
        tmp_path, tiny):
    """Sharded weights are gathered as each layer is called, together by every process. A layer
    the cache replays is still called (only its body is skipped), so a process that finds its
    batch cached still joins the others' gathers instead of leaving them waiting."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    done = subprocess.run([*torchrun(2, tmp_path / "torchrun"), str(script), str(tiny), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [(s["cache"]["hits"], s["cache"]["misses"]) for s in seen] == [(1, 1), (0, 2)]
    for s in seen:
        assert s["cache"]["losses"] == pytest.approx(s["plain"]["losses"], rel=1e-6)
