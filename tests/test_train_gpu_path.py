"""The training path a GPU takes, exercised on a CPU: the kernels chosen for the device,
padding-free batches, the study's recipe under gradient checkpointing, the adapter vLLM
serves, the GPU benchmark and the Qwen3-8B recipe's script, both in miniature.

Models are random-initialised (`toolself.train.shapes`), with the default model's tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from launchers import torchrun  # noqa: E402
from ports import free_port  # noqa: E402
from vllm_standin import standin_executable  # noqa: E402
from toolself.train import kernels as K  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sft(tiny_sft):
    dataset = tiny_sft[0]
    lengths = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"]))
    return dataset.select([lengths[0], lengths[-1]])  # two sequences of different lengths: padding matters


def rft_config(out, **overrides):
    """Overrides name gradient checkpointing as transformers before 5.24 does, as recipes may."""
    import dataclasses

    from toolself.train.rft_config import RFTConfig
    from toolself.train.settings import installed_spelling

    settings = dict(output_dir=str(out), max_steps=2, num_train_epochs=2, per_device_train_batch_size=2,
                    gradient_accumulation_steps=1, learning_rate=1e-2, warmup_steps=0, lr_scheduler_type="constant",
                    compile_layers=False, bf16=False, disable_tqdm=True, lora_layers=2)
    return RFTConfig(**installed_spelling({**settings, **overrides}, {f.name for f in dataclasses.fields(RFTConfig)}))


def logged_losses(log_path) -> list[float]:
    return [r["loss"] for r in map(json.loads, open(log_path)) if r.get("event") == "log" and "loss" in r]


def test_flash_attention_is_chosen_where_it_runs_and_sdpa_elsewhere():
    assert K.choose_attention(None, on_cuda=True, half=True, flash=True)[0] == K.FLASH
    assert K.choose_attention(None, on_cuda=True, half=True, flash=False) == (K.SDPA, "auto: flash-attn not installed")
    assert K.choose_attention(None, on_cuda=True, half=False, flash=True)[0] == K.SDPA
    assert K.choose_attention(None, on_cuda=False, half=True, flash=True) == (K.SDPA, "auto: no CUDA GPU")
    assert K.choose_attention("eager", on_cuda=True, half=True, flash=True) == ("eager", "asked for")


def test_flash_attention_is_passed_over_on_a_gpu_older_than_ampere_where_it_is_installed():
    for capability in ((8, 0), (8, 9), (9, 0)):
        assert K.choose_attention(None, on_cuda=True, half=True, flash=True, capability=capability)[0] == K.FLASH
    for capability, name in (((7, 0), "sm_70"), ((7, 5), "sm_75")):  # V100, T4
        attention, why = K.choose_attention(None, on_cuda=True, half=True, flash=True, capability=capability)
        assert attention == K.SDPA and name in why


def test_padding_free_follows_the_attention_kernel_unless_asked():
    assert K.choose_padding_free(None, K.FLASH)[0] is True
    assert K.choose_padding_free(None, K.FLEX)[0] is True
    assert K.choose_padding_free(None, K.SDPA)[0] is False
    assert K.choose_padding_free(True, K.SDPA) == (True, "asked for")


def test_length_grouping_is_on_for_padded_micro_batches_of_several_sequences_only():
    assert K.choose_length_grouping(None, padding_free=False, batch=8)[0] is True
    assert K.choose_length_grouping(None, padding_free=True, batch=8) == (
        False, "auto: padding-free batches hold no padding")
    assert K.choose_length_grouping(None, padding_free=False, batch=1)[0] is False  # the CPU study's recipe
    assert K.choose_length_grouping(None, padding_free=False, batch=8, strategy="sequential")[0] is False
    assert K.choose_length_grouping(True, padding_free=True, batch=1) == (True, "asked for")


def test_length_grouped_rft_pads_a_mix_of_short_and_long_sequences_far_less(tmp_path, tiny):
    from datasets import Dataset

    from toolself.train.rft import train_rft

    # Half short, half long: a random pair is mixed half the time (72-79% sequence over twelve
    # seeds); pairs of neighbours in length are nearly all alike (93-98%: a group sorted within,
    # of min(50, n / (4 x batch)) micro-batches, 8 here, has a mixed pair where it holds an odd
    # number of short sequences).
    lengths = [n for i in range(32) for n in (20 + i, 100 + i)]
    dataset = Dataset.from_list([{"input_ids": [5 + i % 50] * n, "labels": [5 + i % 50] * n}
                                 for i, n in enumerate(lengths)])
    runs = {grouped: train_rft(dataset, tiny, tmp_path / f"rft-{grouped}",
                               rft_config(tmp_path / f"ck-{grouped}", max_steps=32, num_train_epochs=1,
                                          length_grouped=grouped, gradient_checkpointing=False))
            for grouped in (True, False)}
    assert runs[True].extra["kernels"]["length_grouped"] and not runs[False].extra["kernels"]["length_grouped"]
    assert runs[True].tokens == runs[False].tokens == sum(lengths)  # one epoch each
    assert runs[True].extra["padding_efficiency"] > 0.9 > 0.85 > runs[False].extra["padding_efficiency"]


def test_flex_attention_is_refused_for_training_on_a_cpu_before_any_step(tmp_path):
    args = SimpleNamespace(attn_implementation=K.FLEX, bf16=False, fp16=False, use_liger_kernel=None, use_cpu=True,
                           per_device_train_batch_size=2, gradient_accumulation_steps=1)
    shape = SimpleNamespace(hidden_size=64, intermediate_size=128, num_hidden_layers=4)
    with pytest.raises(ValueError, match="flex_attention trains on a CUDA GPU only"):
        K.choose_kernels(args, shape, longest=128, padding_free=None)


@pytest.mark.slow
def test_a_packed_row_under_flex_attention_gives_the_padded_batchs_loss(tiny, sft):
    """Forward only: flex attention's backward runs on CUDA alone (benchmarks/gpu_session.py checks it there)."""
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    examples = [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in sft]
    losses = {}
    for attention, padding_free in ((K.SDPA, False), (K.FLEX, True)):
        model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32, attn_implementation=attention)
        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples)
        with torch.no_grad():
            losses[attention] = model(**batch, use_cache=False).loss
    torch.testing.assert_close(losses[K.FLEX], losses[K.SDPA], rtol=1e-5, atol=1e-6)


def test_liger_is_used_on_cuda_when_installed_and_refused_when_asked_for_but_missing():
    assert K.choose_liger(None, on_cuda=True, installed=True)[0] is True
    assert K.choose_liger(None, on_cuda=False, installed=True)[0] is False
    assert K.choose_liger(None, on_cuda=True, installed=False) == (False, "auto: liger-kernel not installed")
    with pytest.raises(RuntimeError, match="not installed"):
        K.choose_liger(True, on_cuda=True, installed=False)


def test_the_micro_batch_grows_into_free_memory_and_the_effective_batch_stays():
    per_token = K.activation_bytes_per_token(SimpleNamespace(hidden_size=4096, intermediate_size=12288,
                                                             num_hidden_layers=36), checkpointing=True)
    batch, steps, why = K.choose_batch(2, 4, longest=4096, free_bytes=100 * 2**30, per_token=per_token)
    assert (batch, steps) == (8, 1) and "effective batch 8 kept as 8 x 1" in why
    assert K.choose_batch(2, 4, longest=16384, free_bytes=2 * 2**30, per_token=per_token)[:2] == (1, 8)
    assert K.choose_batch(2, 4, longest=16384, free_bytes=2 * 2**30, per_token=per_token, minimum=2)[:2] == (2, 4)
    assert K.choose_batch(2, 4, longest=4096, free_bytes=None, per_token=per_token)[:2] == (2, 4)
    assert K.choose_batch(2, 3, longest=4096, free_bytes=100 * 2**30, per_token=per_token)[:2] == (6, 1)
    assert K.choose_batch(3, 4, longest=4096, free_bytes=25 * 2**30, per_token=per_token)[:2] == (6, 2)  # 6 fit


def test_a_resumed_run_keeps_the_micro_batch_it_was_checkpointed_with_whatever_memory_is_free():
    # the trainer skips the micro-batches already trained by count, and KTO pairs its KL
    # completions within a micro-batch: another split would resume onto other sequences
    args = SimpleNamespace(attn_implementation=None, bf16=False, fp16=False, use_liger_kernel=None, use_cpu=True,
                           per_device_train_batch_size=2, gradient_accumulation_steps=4)
    shape = SimpleNamespace(hidden_size=64, intermediate_size=128, num_hidden_layers=4)
    choice = K.choose_kernels(args, shape, longest=128, padding_free=None, resumed_batch=8)
    assert (choice.batch_size, choice.accumulation) == (8, 1)
    assert choice.why["batch_size"] == "as the run being resumed had it: 8 x 1"
    assert (K.choose_kernels(args, shape, longest=128, padding_free=None, resumed_batch=3).batch_size,
            K.choose_kernels(args, shape, longest=128, padding_free=None).batch_size) == (2, 2)  # 3 cannot keep 8


def test_a_float32_run_on_a_gpu_takes_half_the_micro_batch_a_bfloat16_run_fits_in_the_same_free_memory(monkeypatch):
    from toolself.models import memory

    a_gpu_of(monkeypatch, (7, 5))
    monkeypatch.setattr(memory, "gpu_memory", lambda device: (16 * 2**30, 24 * 2**30))
    shape = SimpleNamespace(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28)
    batches = {}
    for half in (True, False):
        args = SimpleNamespace(attn_implementation=None, bf16=half, fp16=False, use_liger_kernel=None, use_cpu=False,
                               device="cuda:0", auto_batch_size=True, gradient_checkpointing=True,
                               per_device_train_batch_size=4, gradient_accumulation_steps=8)
        batches[half] = K.choose_kernels(args, shape, longest=8192, padding_free=None).batch_size
    assert batches == {True: 8, False: 4}


def test_checkpointing_needs_far_less_activation_memory_per_token():
    shape = SimpleNamespace(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36)
    assert K.activation_bytes_per_token(shape, True) * 10 < K.activation_bytes_per_token(shape, False)


def test_padding_free_batches_give_the_padded_batches_loss_and_gradients(tiny, sft):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from toolself.train.lora import LoraArguments

    examples = [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in sft]
    results = []
    for padding_free in (False, True):
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32, attn_implementation="sdpa")
        model = get_peft_model(base, LoraArguments(lora_layers=2).peft_config(base))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples)
        assert ("attention_mask" in batch) is not padding_free
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (padded, padded_grads), (flat, flat_grads) = results
    torch.testing.assert_close(flat, padded, rtol=1e-4, atol=1e-5)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(flat_grads[name], grad, rtol=1e-3, atol=1e-6, msg=name)


def test_the_studys_recipe_trains_under_gradient_checkpointing_and_its_cache_changes_no_loss(tmp_path, tiny, sft):
    from toolself.train.rft import train_rft

    runs = {}
    for cache in (True, False):
        # in order, so that the second epoch's batch is the first's: the cache keys whole batches
        config = rft_config(tmp_path / f"ck-{cache}", gradient_checkpointing=True, cache_frozen_layers=cache,
                            train_sampling_strategy="sequential")
        runs[cache] = train_rft(sft, tiny, tmp_path / f"rft-{cache}", config)
    assert runs[True].extra["frozen_layer_cache"]["hits"] >= 1  # the second epoch replayed the frozen layers
    assert "frozen_layer_cache" not in runs[False].extra
    assert logged_losses(runs[True].log) == pytest.approx(logged_losses(runs[False].log), rel=1e-5)


def test_padding_free_rft_logs_the_losses_padded_rft_logs(tmp_path, tiny, sft):
    from toolself.train.rft import train_rft

    runs = {packed: train_rft(sft, tiny, tmp_path / f"rft-{packed}",
                              rft_config(tmp_path / f"ck-{packed}", padding_free=packed, gradient_checkpointing=False))
            for packed in (False, True)}
    assert runs[True].extra["kernels"]["padding_free"] and not runs[False].extra["kernels"]["padding_free"]
    assert runs[True].tokens == runs[False].tokens == sum(len(ids) for ids in sft["input_ids"]) * 2
    assert logged_losses(runs[True].log) == pytest.approx(logged_losses(runs[False].log), rel=1e-4)


def test_the_rft_adapter_has_the_files_and_fields_vllm_enable_lora_loads(tmp_path, tiny, sft):
    from safetensors import safe_open

    from toolself.train.rft import train_rft

    result = train_rft(sft, tiny, tmp_path / "rft", rft_config(tmp_path / "ck", max_steps=1))
    adapter = Path(result.output_dir)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 16 and config["lora_alpha"] == 32
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"}
    assert Path(config["base_model_name_or_path"]).resolve() == Path(tiny).resolve()
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    # vLLM maps `base_model.model.<module>.lora_A.weight` / `lora_B.weight` onto the served model's modules
    assert names and all(n.startswith("base_model.model.model.layers.") and n.endswith((".lora_A.weight",
                                                                                      ".lora_B.weight"))
                         for n in names)
    assert {int(n.split(".layers.")[1].split(".")[0]) for n in names} == {2, 3}  # lora_layers=2 of 4


def test_the_gpu_session_runs_in_miniature_on_a_cpu_from_a_carried_kit(tmp_path, tiny):
    kit, out = tmp_path / "kit", tmp_path / "out"
    made = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_kit.py"), "--out", str(kit), "--no-wheels",
                           "--tasks", "builtin:research?hops=2", "--limit", "2"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert made.returncode == 0, made.stderr[-3000:]
    assert (kit / "tools.json").is_file() and (kit / "tokenizer" / "tokenizer.json").is_file()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--kit", str(kit), "--out",
                           str(out), "--work", str(tmp_path / "work"), "--miniature",
                           "--only", "checks,smollm2-135m,qwen3-8b-flex"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert runs["checks"]["exit"] == 0 and runs["smollm2-135m"]["exit"] == 0
    assert runs["qwen3-8b-flex"] == {"exit": "skipped", "seconds": 0, "reason": "needs a CUDA GPU"}
    checks = json.loads((out / "checks.json").read_text())
    assert checks["ok"] and set(checks["variants"]) == {"padded", "padding_free_sdpa"}
    assert checks["adapter_load"]["weights_differing_from_float32_merge"] == 0  # a student as `local:` loads it
    report = json.loads((out / "smollm2-135m.json").read_text())
    for stage in ("rft", "kto"):
        assert report[stage]["tokens_per_second"] > 0 and 0 < report[stage]["mfu"] < 1
        assert report[stage]["kernels"]["attention"] == "sdpa"
    assert report["kto"]["kl_tokens"] > 0  # counted while training, not before it
    assert report["decoding"]["concurrent_8"]["generated_tokens"] == 8 * 8 and report["decoding"]["engine_rows"] == 8
    assert report["device"]["device"] == "cpu" and "torch" in report["versions"]
    assert "smollm2-135m     rft" in done.stdout  # the table of results against the bars
    assert "checks           local:ADAPTER on cpu" in done.stdout
    padding = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "padding.py"), "--trajectories",
                              str(kit / "trajectories.jsonl"), "--batches", "2", "--seeds", "2"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert padding.returncode == 0, padding.stderr[-3000:]
    fractions = json.loads(padding.stdout[padding.stdout.index("{\n"):])["batches"]["2"]
    assert 0 < fractions["random"] <= 1 and 0 < fractions["length_grouped"] <= 1  # a few sequences: no ordering


def recipe_environment(env_overrides: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "TOOLSELF": f"{sys.executable} -m toolself", "PYTHON": sys.executable, **env_overrides}


def run_recipe(env_overrides: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "cat-qwen3.sh")], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=recipe_environment(env_overrides))


def recipe_started_until(ready: Path, env_overrides: dict[str, str]) -> subprocess.Popen:
    """The recipe script, in a session of its own, once `ready` exists."""
    script = subprocess.Popen(["bash", str(ROOT / "scripts" / "cat-qwen3.sh")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
                              env=recipe_environment(env_overrides))
    deadline = time.monotonic() + 60
    while not ready.is_file():
        assert script.poll() is None and time.monotonic() < deadline, script.communicate()
        time.sleep(0.05)
    return script


@pytest.mark.slow
def test_the_qwen3_recipe_script_runs_end_to_end_in_miniature_and_redoes_a_step_cut_short_on_another_node(
        tmp_path, tiny):
    out, node_a = tmp_path / "run", shutil.copytree(tiny, tmp_path / "node-a" / "student")
    done = run_recipe({"CAT_MINIATURE": "1", "MODEL": str(node_a), "OUT": str(out)}, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    for adapter in ("rft", "kto"):
        assert (out / adapter / "adapter_model.safetensors").is_file()
    for model in ("student", "rft", "kto"):
        assert json.loads((out / "eval" / model / "summary.json").read_text())
    policy = json.loads((out / "policy" / "run.json").read_text())
    assert policy["identity"]["model_options"]["temperature"] > 0  # the K attempts at a task are samples, not one greedy reply
    assert (out / "report" / "report.md").is_file()

    # KTO killed while saving: its adapter written in part, train_result.json (written last) not at all;
    # the job rescheduled onto a node where the student is mounted elsewhere, before KTO had merged
    # its base and the RFT model had been evaluated
    (out / "kto" / "train_result.json").unlink()
    (out / "kto" / "adapter_model.safetensors").write_bytes(b"")
    shutil.rmtree(out / "kto" / "base")
    shutil.rmtree(out / "eval" / "rft")
    node_b = shutil.move(node_a, tmp_path / "node-b-mount")
    again = run_recipe({"CAT_MINIATURE": "1", "MODEL": str(node_b), "OUT": str(out)}, timeout=600)
    assert again.returncode == 0, (again.stdout[-2000:], again.stderr[-3000:])
    assert "already holds this run's trained model" in " ".join(again.stdout.split())  # RFT: not redone
    assert "KTO done" in again.stdout
    assert (out / "kto" / "train_result.json").is_file() and (out / "kto" / "adapter_model.safetensors").stat().st_size
    assert json.loads((out / "eval" / "rft" / "summary.json").read_text())["ran"]


@pytest.mark.slow
def test_the_recipe_trains_under_a_launcher_and_serves_with_vllm_one_server_at_a_time_never_while_training(
        tmp_path, tiny):
    """The script's GPU-node path in miniature. Training runs in two processes under torchrun
    (LAUNCH), as under accelerate launch. A vLLM server holds ~90% of its GPU's memory while it
    runs: a server left up through KTO would leave KTO without memory, and two at once would not
    start. The stand-in serves as `vllm serve` does (tests/vllm_standin.py) and notes when each
    server ran."""
    out, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    vllm = standin_executable(tmp_path)
    launch = " ".join(torchrun(2, tmp_path / "torchrun"))
    done = run_recipe({"CAT_MINIATURE": "1", "MODEL": str(tiny), "OUT": str(out), "VLLM": str(vllm),
                       "VLLM_PORT": str(free_port()), "STANDIN_LEDGER": str(ledger), "LAUNCH": launch}, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    for stage in ("rft", "kto"):
        assert json.loads((out / stage / "train_settings.json").read_text())["settings"]["world_size"] == 2
    assert "does not pass SIGUSR1" not in done.stderr  # the script has torchrun pass it on, as Slurm sends it
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(e["event"], e["names"][-1]) for e in events] == [("start", "rft"), ("stop", "rft"), ("start", "rft"),
                                                             ("stop", "rft"), ("start", "kto"), ("stop", "kto")]
    kto_began = json.loads((out / "kto" / "train_log.jsonl").read_text().splitlines()[0])["time"]
    assert events[1]["time"] < kto_began < events[2]["time"]  # no server held the GPU while KTO trained
    models = {name: json.loads((out / folder / "run.json").read_text())["last_command"]["served_at"]["model"]
              for name, folder in (("policy", "policy"), ("student", "eval/student"), ("rft", "eval/rft"),
                                   ("kto", "eval/kto"))}
    assert models["policy"].startswith("openai:rft@") and models["rft"].startswith("openai:rft@")
    assert models["student"].startswith("openai:student@") and models["kto"].startswith("openai:kto@")
    for name in ("student", "rft", "kto"):
        summary = json.loads((out / "eval" / name / "summary.json").read_text())
        assert summary["ran"] and not summary["status"].get("error")  # each ran through its server
    for folder in ("policy", "eval/student", "eval/rft", "eval/kto"):  # decoded as their data renders a reply
        options = json.loads((out / folder / "run.json").read_text())["identity"]["model_options"]
        assert options["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
    assert "enable_thinking" not in (out / "teacher" / "run.json").read_text()
    assert not list(out.glob("vllm-*.pid"))


# A command that runs until a stop signal comes, then says which and exits as toolself does on one.
UNTIL_STOPPED = """
import pathlib, signal, sys, time

def stop(signum, frame):
    print(f"got {signal.Signals(signum).name}; to resume: the same command", file=sys.stderr, flush=True)
    sys.exit(130)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, stop)
pathlib.Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]))
time.sleep(120)
"""


@pytest.mark.parametrize("sent, received", [("SIGTERM", "SIGTERM"), ("SIGUSR1", "SIGUSR1"), ("SIGINT", "SIGTERM")])
def test_a_stop_signal_to_the_recipe_script_alone_reaches_the_command_it_runs_and_leaves_nothing_running(
        tmp_path, tiny, sent, received):
    """As a container's first process, or a batch script, is signalled: the script passes the
    signal on to the command it is running (Ctrl-C as SIGTERM, since a command the script runs in
    the background ignores SIGINT), and exits with that command's status once it has stopped."""
    command, running = tmp_path / "until_stopped.py", tmp_path / "running"
    command.write_text(UNTIL_STOPPED)
    # started until the command is running, as the teacher's collection
    script = recipe_started_until(running, {"CAT_MINIATURE": "1", "MODEL": str(tiny), "OUT": str(tmp_path / "run"),
                                            "TOOLSELF": f"{sys.executable} {command} {running}"})
    script.send_signal(signal.Signals[sent])  # to the script's process alone
    _, stderr = script.communicate(timeout=60)
    assert script.returncode == 130 and f"got {received}; to resume" in stderr, (script.returncode, stderr[-2000:])
    assert running.read_text().startswith("eval --model expert")
    with pytest.raises(ProcessLookupError):
        os.killpg(script.pid, 0)  # no process of the run is left running


def test_a_stop_signal_while_vllm_starts_ends_the_script_and_stops_the_server_at_once(tmp_path, tiny):
    # vLLM takes minutes to start; the script polls it, and a preempted job must not wait that out
    out, started, vllm = tmp_path / "run", tmp_path / "vllm-started", tmp_path / "vllm"
    (out / "rft").mkdir(parents=True)
    (out / "rft" / "adapter_config.json").write_text(json.dumps({"r": 16}))  # as RFT left it
    vllm.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 120\n")  # starts, and never answers
    vllm.chmod(0o755)
    script = recipe_started_until(started, {"CAT_MINIATURE": "1", "MODEL": str(tiny), "OUT": str(out),
                                            "TOOLSELF": "true", "VLLM": str(vllm), "VLLM_PORT": str(free_port())})
    server = int((out / "vllm-rft.pid").read_text())
    signalled = time.monotonic()
    script.send_signal(signal.SIGTERM)
    try:
        script.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # still waiting for the server: leave nothing behind
        for group in (script.pid, server):
            os.killpg(group, signal.SIGKILL)
        raise
    assert script.returncode == 143 and time.monotonic() - signalled < 15
    assert not (out / "vllm-rft.pid").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(server, 0)  # stopped as the script ended


FRAMES_ROWS = [("", "Prompt", "Answer", "wiki_links", "reasoning_types")] + [
    (str(i), f"Question {i}?", f"Answer {i}", "['https://en.wikipedia.org/wiki/X']", "Numerical reasoning")
    for i in range(10)]


def frames_file(folder: Path) -> Path:
    path = folder / "test.tsv"
    path.write_text("".join("\t".join(row) + "\n" for row in FRAMES_ROWS), encoding="utf-8")
    return path


@pytest.mark.parametrize("missing, message", [("JUDGE", "set JUDGE=openai:NAME@URL"),
                                              ("SEARCH", "set SEARCH=searxng|serper|tavily|brave|jina")])
def test_the_qwen3_recipe_refuses_frames_without_a_judge_or_a_search_backend(tmp_path, tiny, missing, message):
    env = {"MODEL": str(tiny), "OUT": str(tmp_path / "run"), "TEACHER": "openai:t@http://127.0.0.1:9/v1",
           "FRAMES": str(frames_file(tmp_path)), "JUDGE": "openai:j@http://127.0.0.1:9/v1", "SEARCH": "searxng"}
    env[missing] = ""
    done = run_recipe(env, timeout=60)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "run" / "teacher").exists()


def test_a_carved_frames_split_is_seeded_disjoint_and_keeps_each_questions_id(tmp_path):
    from toolself.evals.loaders import load_tasks
    from toolself.train.splits import carve

    source = frames_file(tmp_path)
    train, test = carve(source, tmp_path / "a", train=3, seed=7, name="frames")
    again = carve(source, tmp_path / "b", train=3, seed=7, name="frames")
    assert [p.read_text() for p in (train, test)] == [p.read_text() for p in again]
    assert carve(source, tmp_path / "c", train=3, seed=8)[0].read_text() != train.read_text()
    train_tasks, test_tasks = load_tasks(f"frames:{train}"), load_tasks(f"frames:{test}")
    assert {t.split for t in train_tasks} == {"train"} and {t.split for t in test_tasks} == {"test"}
    ids = [t.id for t in train_tasks] + [t.id for t in test_tasks]
    assert len(train_tasks) == 3 and sorted(ids) == sorted(f"frames-{i}" for i in range(10))
    assert all(t.question == f"Question {t.id.split('-')[1]}?" for t in train_tasks)


def a_gpu_of(monkeypatch, capability: tuple[int, int]) -> None:
    """Has torch answer as it does on a CUDA GPU of this compute capability, where
    `is_bf16_supported()` says yes even before Ampere (it counts emulation)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: (
        including_emulation or capability >= (8, 0)))


def dtypes_chosen() -> tuple[str, str, Any, bool]:
    """(device and dtype of local models, dtype of a merge, bf16 of a training run)."""
    from toolself.models import weights
    from toolself.train import merge
    from toolself.train.lora import accelerator_defaults

    config = SimpleNamespace(fp16=None, bf16=None, ddp_find_unused_parameters=None, gradient_checkpointing=True,
                             per_device_train_batch_size=2)
    accelerator_defaults(config)
    return weights.default_device(), weights.default_dtype(), merge.default_dtype(), config.bf16


@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])  # A100, H100
def test_a_gpu_of_the_ampere_generation_or_later_runs_local_models_and_trains_in_bfloat16(monkeypatch, capability):
    a_gpu_of(monkeypatch, capability)
    assert dtypes_chosen() == ("cuda", "bfloat16", torch.bfloat16, True)


@pytest.mark.parametrize("capability", [(7, 0), (7, 5)])  # V100, T4
def test_a_gpu_that_emulates_bfloat16_runs_local_models_and_trains_in_float32(monkeypatch, capability):
    a_gpu_of(monkeypatch, capability)
    assert dtypes_chosen() == ("cuda", "float32", torch.float32, False)


def test_the_mixed_dtype_is_refused_on_a_gpu_with_the_dtypes_that_run_there(monkeypatch):
    from toolself.models import weights

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="use bfloat16 .* or float32"):
        weights.load_weights(None, "mixed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a CUDA GPU does")
@pytest.mark.parametrize("stage", ["rft", "kto"])
def test_fp16_is_refused_on_a_cpu_where_accelerate_would_train_in_float32(tmp_path, stage):
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft_config import RFTConfig

    config_class = RFTConfig if stage == "rft" else CATKTOConfig
    with pytest.raises(ValueError, match="fp16 mixed precision trains on a CUDA GPU only"):
        config_class(output_dir=str(tmp_path), fp16=True)

