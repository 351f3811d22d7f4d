"""RFT and KTO on the embedded model, a few steps each, on trajectories from the real loop.

The trajectories are the expert teacher's attempts at built-in research tasks, run through the
agent with the real tools and scored by the real scorer (with noise, so that some fail). On
two CPU cores the 135M model trains at a few tens of tokens per second, so the examples are
cut to their last 64 tokens (the end of the prompt and the whole reply) and each run is a few
steps: enough to see the loss fall and the adapter move the model the right way.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from toolself.train import data as D  # noqa: E402

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def student():
    from toolself.models.weights import MissingWeightsError, default_model_dir

    try:
        return default_model_dir()
    except MissingWeightsError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def trajectories():
    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool

    pool = default_pool()
    out = scored_attempts("builtin:research?hops=2", limit=6, noises=(0.0, 1.0), pool=pool)
    assert {D.outcome(t) for t in out} == {True, False}
    return out, D.tool_schemas(pool)


@pytest.fixture(scope="module")
def renderer(student, trajectories):
    from transformers import AutoTokenizer

    return D.Renderer(AutoTokenizer.from_pretrained(str(student)), trajectories[1])


def completion_logps(model, prompt_ids, completion_ids) -> float:
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1]
    return float(torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion_ids)[:, None]).sum())


def logged_losses(log_path) -> list[float]:
    return [r["loss"] for r in map(json.loads, open(log_path)) if r.get("event") == "log" and "loss" in r]


def split_example(example) -> tuple[list[int], list[int]]:
    first = next(i for i, label in enumerate(example["labels"]) if label != D.IGNORE)
    return example["input_ids"][:first], example["input_ids"][first:]


@pytest.fixture(scope="module")
def rft_run(tmp_path_factory, student, trajectories, renderer):
    from toolself.train.rft import train_rft

    out = tmp_path_factory.mktemp("rft")
    dataset, build = D.build_sft_dataset(trajectories[0], renderer, max_length=MAX_LENGTH)
    assert build.skipped_trajectories >= 1  # the failed attempts were rejected
    actions = [i for i, tags in enumerate(dataset["decisions"]) if ":action" in tags][:2]
    train = dataset.select(actions)
    return train, train_rft(train, student, out / "adapter", rft_test_config(out / "ck")), out


def rft_test_config(output_dir, **overrides):
    """In float32 on every CPU: the default, bf16 autocast where the CPU has bf16 kernels, rounds
    differently in compiled and eager layers, and by a different amount on each CPU."""
    from toolself.train.lora import checkpointing_field
    from toolself.train.rft_config import RFTConfig

    return RFTConfig(output_dir=str(output_dir), max_steps=3, per_device_train_batch_size=2,
                     gradient_accumulation_steps=1, learning_rate=3e-3, warmup_steps=0, lr_scheduler_type="constant",
                     disable_tqdm=True, bf16=False, **{checkpointing_field(RFTConfig): False, **overrides})


@pytest.mark.slow
def test_rft_lowers_the_loss_and_the_adapter_makes_the_teachers_replies_likelier(rft_run):
    from toolself.models.weights import load_weights
    from toolself.train.merge import merge_adapter
    from toolself.train.plots import plot_log

    train, result, out = rft_run
    losses = logged_losses(result.log)
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert result.tokens > 0 and result.tokens_per_second > 0
    assert plot_log(result.log, out / "curves.png").stat().st_size > 1000

    base, _, _ = load_weights(None, dtype="float32")
    tuned, _, _ = load_weights(result.output_dir, dtype="float32")  # how `--model local:DIR` loads it
    for example in train:
        prompt, completion = split_example(example)
        assert completion_logps(tuned, prompt, completion) > completion_logps(base, prompt, completion) + 1.0

    merged = merge_adapter(result.output_dir, out / "merged")
    again, _, _ = load_weights(merged, dtype="float32")
    prompt, completion = split_example(train[0])
    assert completion_logps(again, prompt, completion) == pytest.approx(completion_logps(tuned, prompt, completion),
                                                                        abs=1e-3)


@pytest.mark.slow
def test_kto_on_top_of_rft_lowers_the_loss_and_separates_good_from_bad_decisions(tmp_path, rft_run, trajectories,
                                                                                 renderer):
    from toolself.models.weights import load_weights
    from toolself.train.kto import train_kto
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.lora import checkpointing_field

    decisions, _, weights = D.build_kto_dataset(trajectories[0], renderer, max_length=MAX_LENGTH)
    assert weights.undesirable_weight > 1.0  # failures are the minority here and are weighted up
    actions = [i for i, kind in enumerate(decisions["kind"]) if kind == "action"]
    good = next(i for i in actions if decisions[i]["label"])
    # a failed attempt's action that differs from the good one (noise leaves some actions as the expert's)
    bad = next(i for i in actions if not decisions[i]["label"]
               and decisions[i]["completion_ids"] != decisions[good]["completion_ids"])
    train = decisions.select([good, bad])  # one micro-batch, seen at every step
    config = CATKTOConfig(output_dir=str(tmp_path / "ck"), max_steps=2, per_device_train_batch_size=2,
                       gradient_accumulation_steps=1, learning_rate=1e-3, warmup_steps=0,
                       lr_scheduler_type="constant", max_length=MAX_LENGTH, disable_tqdm=True,
                       **{checkpointing_field(CATKTOConfig): False})
    result = train_kto(train, rft_run[1].output_dir, tmp_path / "kto", config)

    records = [r for r in map(json.loads, open(result.log)) if r.get("event") == "log" and "loss" in r]
    assert records[-1]["loss"] < records[0]["loss"]
    assert {"rewards/chosen", "rewards/rejected", "kl", "learning_rate", "tokens_per_second"} <= set(records[0])
    assert result.extra["weights"]["ratio"] == pytest.approx(1.15, abs=0.01)

    reference, _, _ = load_weights(tmp_path / "kto" / "base", dtype="float32")  # the merged RFT model
    policy, _, _ = load_weights(tmp_path / "kto", dtype="float32")
    shift = {True: [], False: []}
    for example in train:
        args = (example["prompt_ids"], example["completion_ids"])
        shift[example["label"]].append(completion_logps(policy, *args) - completion_logps(reference, *args))
    assert shift[True][0] > shift[False][0]


@pytest.mark.slow
def test_rft_with_compiled_layers_logs_the_losses_eager_layers_give(tmp_path, student, rft_run):
    from toolself.train.compiled_layers import compiler_missing
    from toolself.train.rft import train_rft

    if compiler_missing():
        pytest.skip(compiler_missing())
    train, compiled, _ = rft_run  # trained with the default, which compiles on a CPU with a compiler
    assert compiled.extra["compiled_layers"] == "auto: on (CPU with a C++ compiler)"
    eager = train_rft(train, student, tmp_path / "eager", rft_test_config(tmp_path / "ck", compile_layers=False))
    assert eager.extra["compiled_layers"] == "off"
    compiled_losses, eager_losses = logged_losses(compiled.log), logged_losses(eager.log)
    # In float32 only the order of fused sums differs: 3e-5 apart after three steps on an AMD
    # EPYC, while the loss falls ~10x. In bf16 the two were 0.3% to 2.3% apart, by CPU.
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-3)


def test_without_a_cpp_compiler_training_stays_eager_unless_compiling_was_asked_for():
    import torch._inductor.config as inductor
    from toolself.train.compiled_layers import should_compile

    with inductor.patch({"cpp.cxx": ("toolself-test-no-such-compiler",)}):
        compiled, why = should_compile(None, on_gpu=False)
        assert not compiled and "no C++ compiler" in why
        with pytest.raises(RuntimeError, match="compile_layers=True, but no C\\+\\+ compiler"):
            should_compile(True, on_gpu=False)


def test_layers_compile_by_default_for_rft_on_a_cpu_and_never_for_kto(tmp_path):
    from toolself.train.compiled_layers import should_compile
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft_config import RFTConfig

    assert RFTConfig(output_dir=str(tmp_path)).compile_layers is None
    assert CATKTOConfig(output_dir=str(tmp_path)).compile_layers is False
    assert should_compile(None, on_gpu=True) == (False, "auto: off on a GPU (not measured there; pass True to try)")
    assert should_compile(False, on_gpu=False) == (False, "off")


def test_kto_refuses_a_batch_too_small_for_its_kl_estimate():
    from toolself.train.kto_config import CATKTOConfig

    with pytest.raises(ValueError, match="at least 2|>= 2"):
        CATKTOConfig(output_dir="unused", per_device_train_batch_size=1)


@pytest.mark.parametrize("stage", ["rft", "kto"])
def test_a_config_with_trls_defaults_warns_of_no_deprecated_name_and_keeps_checkpointing_on(tmp_path, stage):
    import warnings

    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.lora import checkpointing_field
    from toolself.train.rft_config import RFTConfig

    config_class = RFTConfig if stage == "rft" else CATKTOConfig
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.*deprecated")
        config = config_class(output_dir=str(tmp_path), per_device_train_batch_size=2)
    assert getattr(config, checkpointing_field(config)) is True


def test_single_sequence_steps_on_a_cpu_do_not_recompute_the_forward_pass_and_do_not_warn(tmp_path):
    import warnings

    import torch
    from toolself.train.rft_config import RFTConfig

    if torch.cuda.is_available():
        pytest.skip("the rule is for CPUs")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.*deprecated")
        single = RFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=1)
    padded = RFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=2)
    assert not single.gradient_checkpointing and not getattr(single, "activation_checkpointing", False)
    assert padded.gradient_checkpointing


def test_the_cat_pipeline_resumes_after_its_last_finished_step_and_refuses_other_settings(tmp_path, student):
    from toolself.train.pipeline import CATSettings, PipelineMismatch, run_cat

    settings = CATSettings(tasks=["builtin:research?hops=2"], teacher="expert", teacher_samples=2, limit=2,
                           concurrency=2)
    lines: list[str] = []
    first = run_cat(settings, tmp_path, stop_after="collect_teacher", echo=lines.append)
    assert list(first) == ["collect_teacher"] and first["collect_teacher"]["attempts"] == 4
    lines.clear()
    second = run_cat(settings, tmp_path, stop_after="data_sft", echo=lines.append)
    assert lines[0] == "[collect_teacher] done earlier, skipped" and lines[1] == "[data_sft] running"
    assert second["data_sft"]["examples"] > 0
    assert (tmp_path / "data" / "sft" / "stats.json").is_file()
    state = json.loads((tmp_path / "state.json").read_text())
    assert [s for s, v in state["steps"].items() if v["done"]] == ["collect_teacher", "data_sft"]
    with pytest.raises(PipelineMismatch):
        run_cat(CATSettings(tasks=["builtin:research?hops=3"], teacher_samples=2, limit=2), tmp_path,
                stop_after="data_sft", echo=lines.append)


def answers_anything(messages, tools):
    from toolself.models.scripted import call

    if not tools:  # the configuration
        return json.dumps({"subgoal": "answer", "strategy": "Answer at once.", "toolbox": ["search"],
                           "knowledge": "none", "context_mode": "basic"})
    return call("terminate", answer="Jorvale")


def test_a_collection_whose_teacher_server_was_down_stays_unfinished_and_resumes_when_it_is_up(tmp_path):
    from http_fixtures import serving
    from ports import free_port

    from toolself.evals.runner import AttemptsFailing
    from toolself.models.scripted import ScriptedModel
    from toolself.train.pipeline import CATSettings, run_cat

    def settings(url: str) -> CATSettings:
        return CATSettings(tasks=["builtin:research?hops=2"], teacher=f"openai:teacher@{url}", teacher_samples=1,
                           limit=1, concurrency=1)

    with pytest.raises(AttemptsFailing, match="every one of the 1 attempts .* ended in an error .*Connection refused"):
        run_cat(settings(f"http://127.0.0.1:{free_port()}/v1"), tmp_path, stop_after="collect_teacher",
                echo=lambda line: None)
    assert not json.loads((tmp_path / "state.json").read_text())["steps"]
    with serving(ScriptedModel([], default=answers_anything)) as url:  # up again, on another port
        done = run_cat(settings(url), tmp_path, stop_after="collect_teacher", echo=lambda line: None)
    assert done["collect_teacher"]["ran"] == 1 and done["collect_teacher"]["errors"] == 0


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_data_step_with_nothing_to_train_on_stays_unfinished(tmp_path, student, isolate):
    from toolself.train.pipeline import CATSettings, EmptyData, run_cat

    # one action per stage: the expert cannot finish, so no attempt succeeds
    settings = CATSettings(tasks=["builtin:research?hops=2"], teacher_samples=1, limit=1, concurrency=1,
                           agent={"max_stages": 1, "max_steps_per_stage": 1})
    with pytest.raises(EmptyData, match="none of the teacher's 1 attempts succeeded"):
        run_cat(settings, tmp_path, echo=lambda line: None, isolate=isolate)
    state = json.loads((tmp_path / "state.json").read_text())
    assert list(state["steps"]) == ["collect_teacher"]


def test_the_compact_head_scores_exactly_what_trls_fused_head_scores(student):
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from toolself.train.compact_head import use_compact_head

    model = AutoModelForCausalLM.from_pretrained(str(student), dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :15] = D.IGNORE  # a prompt, then a reply
    labels[1, :20] = D.IGNORE
    with torch.no_grad():
        tiled = model(input_ids=ids, labels=labels, fused_lm_head=True)
        assert use_compact_head(model)
        compact = model(input_ids=ids, labels=labels, fused_lm_head=True)
        plain = model(input_ids=ids).logits  # calls without the fused head are untouched
    assert plain.shape == (2, 24, model.config.vocab_size)
    assert torch.equal(compact.label_mask, labels[:, 1:] != D.IGNORE)
    for field in ("log_probs", "entropy", "mean_logits"):
        assert torch.allclose(getattr(compact, field), getattr(tiled, field), atol=1e-4), field
    assert torch.equal(compact.is_top1, tiled.is_top1)
    assert float(compact.loss) == pytest.approx(float(tiled.loss), abs=1e-5)


def test_the_compact_head_gives_the_gradients_trls_fused_head_gives(student):
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from toolself.train.compact_head import use_compact_head

    ids = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :20] = D.IGNORE
    grads = []
    for compact in (False, True):
        model = AutoModelForCausalLM.from_pretrained(str(student), dtype=torch.float32)
        model.requires_grad_(False)
        model.model.norm.weight.requires_grad_(True)  # the head stays frozen, as under LoRA
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
        if compact:
            assert use_compact_head(model)
        model(input_ids=ids, labels=labels, fused_lm_head=True).loss.backward()
        grads.append(model.model.norm.weight.grad)
    assert torch.allclose(grads[1], grads[0], atol=1e-6, rtol=1e-4)


def test_lora_layers_adapts_only_the_top_layers_and_leaves_the_rest_without_gradients(student):
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from toolself.train.lora import LoraArguments

    model = AutoModelForCausalLM.from_pretrained(str(student), dtype=torch.float32)
    total = model.config.num_hidden_layers
    peft = get_peft_model(model, LoraArguments(lora_layers=2).peft_config(model))
    adapted = {int(name.split(".layers.")[1].split(".")[0]) for name, p in peft.named_parameters() if p.requires_grad}
    assert adapted == {total - 2, total - 1}
    kinds = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name, p in peft.named_parameters() if p.requires_grad}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ValueError, match="needs the model"):
        LoraArguments(lora_layers=2).peft_config()


def test_kto_is_skipped_when_every_policy_attempt_has_the_same_outcome(tmp_path, student):
    import shutil

    from toolself.train.pipeline import CATSettings, State, run_cat

    # one action per stage: no attempt can succeed, so every decision would be undesirable
    settings = CATSettings(tasks=["builtin:research?hops=2"], teacher_samples=1, limit=1, concurrency=1,
                           agent={"max_stages": 1, "max_steps_per_stage": 1})
    lines: list[str] = []
    run_cat(settings, tmp_path, stop_after="collect_teacher", echo=lines.append)
    shutil.copytree(tmp_path / "collect" / "teacher", tmp_path / "collect" / "policy")
    state = State(tmp_path)
    for step in ("data_sft", "rft", "collect_policy"):  # stand-ins: this test is about the KTO steps
        state.finish(step, {}, 0.0)
    (tmp_path / "rft" / "checkpoints").mkdir(parents=True)
    (tmp_path / "rft" / "adapter_config.json").write_text("{}")
    result = run_cat(settings, tmp_path, stop_after="kto", echo=lines.append)
    assert "every one of the policy's 1 attempts failed" in result["data_kto"]["skip_kto"]
    assert result["kto"]["skipped"] == result["data_kto"]["skip_kto"]
    assert (tmp_path / "kto" / "adapter_config.json").is_file(), "the RFT model stands where the KTO model would"
    assert not (tmp_path / "kto" / "checkpoints").exists()
    assert any(line.startswith("[kto] skipped:") for line in lines)


def test_a_cat_run_resumes_with_its_student_mounted_elsewhere_but_not_with_a_copy_beside_it(tmp_path, tiny):
    import shutil

    from toolself.train.pipeline import CATSettings, PipelineMismatch, run_cat

    def settings(student) -> CATSettings:
        return CATSettings(tasks=["builtin:research?hops=2"], teacher="expert", teacher_samples=1, limit=1,
                           concurrency=1, student=str(student))

    out = tmp_path / "cat"
    first = shutil.copytree(tiny, tmp_path / "first")
    run_cat(settings(first), out, stop_after="collect_teacher", echo=lambda line: None)
    elsewhere = shutil.move(first, tmp_path / "mounted-elsewhere")
    lines: list[str] = []
    run_cat(settings(elsewhere), out, stop_after="collect_teacher", echo=lines.append)
    assert lines == ["[collect_teacher] done earlier, skipped"]
    copy = shutil.copytree(elsewhere, tmp_path / "copy")
    with pytest.raises(PipelineMismatch, match=f"student: was '{elsewhere}', now '{copy}'"):
        run_cat(settings(copy), out, stop_after="collect_teacher", echo=lambda line: None)


@pytest.mark.slow
def test_a_cat_run_resumed_with_its_student_mounted_elsewhere_runs_and_merges_its_rft_adapter_there(tmp_path, tiny):
    import shutil

    from lora_adapters import random_lora_adapter

    from toolself.models.weights import adapter_base
    from toolself.train.merge import prepare_base
    from toolself.train.pipeline import CATSettings, State, run_cat

    def settings(student) -> CATSettings:
        return CATSettings(tasks=["builtin:research?hops=2"], teacher="expert", teacher_samples=1, limit=1,
                           policy_samples=1, concurrency=1, student=str(student))

    out = tmp_path / "cat"
    trained_on = shutil.copytree(tiny, tmp_path / "node-a" / "student")
    run_cat(settings(trained_on), out, stop_after="collect_teacher", echo=lambda line: None)
    random_lora_adapter(trained_on, out / "rft", seed=1)  # as RFT leaves it: naming the path it trained on
    for step in ("data_sft", "rft"):
        State(out).finish(step, {}, 0.0)
    student = shutil.move(trained_on, tmp_path / "node-b-mount")

    result = run_cat(settings(student), out, stop_after="collect_policy", echo=lambda line: None)
    assert (result["collect_policy"]["attempts"], result["collect_policy"]["errors"]) == (1, 0)
    assert adapter_base(out / "rft") == student
    assert (prepare_base(out / "rft", out / "kto") / "config.json").is_file()  # KTO's start: RFT merged into it
