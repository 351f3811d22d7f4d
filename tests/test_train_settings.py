"""A training run's settings are typed records that hold what was set, compare with the dicts
run folders recorded before them, and carry a run preset to every model and to the data."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from test_paper_preset import OFFICIAL_RUN, POOL, completion, official_config, paper_settings, tool_call
from toolself.agent import Agent
from toolself.cli import app
from toolself.models.scripted import ScriptedModel
from toolself.models.spec import SMALL_MODEL, ModelSpec
from toolself.train.pipeline import STEPS, CATSettings, PipelineMismatch, State, agent_overrides, run_cat
from toolself.train.settings import AgentOverrides, KTOOverrides, RFTOverrides, installed_spelling
from toolself.train.steps import agent_budgets
from toolself.train.study import StudySettings, demo_preset
from toolself.trajectory import write_jsonl
from toolself.variants import load_run_preset
from web_fakes import FakeService, Reply

PAPER = load_run_preset("paper")

# What state.json held when the settings were plain dicts (the demo recipe's ToolSelf pipeline).
SAVED_BEFORE = {
    "tasks": ["builtin:research", "builtin:data", "builtin:code"], "method": "toolself", "teacher": "expert",
    "student": "embedded", "teacher_samples": 1, "policy_samples": 2, "limit": 36, "policy_limit": 3,
    "eval_tasks": ["builtin:research", "builtin:data", "builtin:code", "builtin:mixed"], "eval_limit": 4,
    "eval_seed": 0, "temperature": 0.7, "seed": 0, "max_length": 4096,
    "agent": {"context_budget": 2000, "config_max_text": 600, "max_stages": 3, "max_steps_per_stage": 6},
    "rft": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "num_train_epochs": 2,
            "learning_rate": 1e-3, "lora_layers": 12},
    "kto": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "max_steps": 6,
            "learning_rate": 1e-4, "lora_layers": 12, "activation_checkpointing": False},
    "concurrency": 8, "timeout": 300.0, "dtype": "auto", "evaluate": ["rft", "kto"],
}


def installed(saved: dict) -> dict:
    """`saved` as this transformers spells it (the same, from 5.24 on)."""
    return {**saved, "kto": installed_spelling(saved["kto"], KTOOverrides().config_fields())}


def test_settings_saved_as_dicts_read_back_as_records_and_compare_equal():
    settings = CATSettings(**json.loads(json.dumps(SAVED_BEFORE)))
    assert isinstance(settings.agent, AgentOverrides) and settings.agent.max_stages == 3
    assert isinstance(settings.rft, RFTOverrides) and settings.rft.learning_rate == 1e-3
    assert settings.to_dict() == installed(SAVED_BEFORE)


def test_a_run_folder_saved_before_the_records_resumes(tmp_path):
    state = State(tmp_path)
    state.data["settings"] = SAVED_BEFORE
    for step in STEPS:
        state.finish(step, {"from": "before"}, 1.0)
    lines: list[str] = []
    results = run_cat(demo_preset().pipeline("toolself", 0), tmp_path, echo=lines.append)
    assert lines == [f"[{step}] done earlier, skipped" for step in STEPS]
    assert results == {step: {"from": "before"} for step in STEPS}


@pytest.mark.parametrize("fields, given, installed", [
    ({"activation_checkpointing", "gradient_checkpointing"}, "gradient_checkpointing", "activation_checkpointing"),
    ({"activation_checkpointing", "gradient_checkpointing"}, "activation_checkpointing", "activation_checkpointing"),
    ({"gradient_checkpointing"}, "activation_checkpointing", "gradient_checkpointing"),  # transformers before 5.24
    ({"gradient_checkpointing_kwargs"}, "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"),
], ids=["old-name-on-5.24+", "new-name-on-5.24+", "new-name-before-5.24", "kwargs-before-5.24"])
def test_a_renamed_trainer_field_is_taken_under_either_name_and_kept_under_the_installed_one(fields, given,
                                                                                             installed):
    assert installed_spelling({given: False, "beta": 0.1}, fields | {"beta"}) == {installed: False, "beta": 0.1}


def test_a_run_folder_written_under_the_other_spelling_of_a_renamed_field_resumes(tmp_path):
    state = State(tmp_path)
    kto = dict(SAVED_BEFORE["kto"])
    kto["gradient_checkpointing"] = kto.pop("activation_checkpointing")  # as transformers before 5.24 records it
    state.data["settings"] = {**SAVED_BEFORE, "kto": kto}
    for step in STEPS:
        state.finish(step, {"from": "before"}, 1.0)
    lines: list[str] = []
    run_cat(demo_preset().pipeline("toolself", 0), tmp_path, echo=lines.append)
    assert lines == [f"[{step}] done earlier, skipped" for step in STEPS]


def test_the_study_records_its_recipe_as_it_did_before():
    saved = {"train_tasks": ["builtin:research"], "eval_tasks": ["builtin:mixed"], "seeds": [0], "methods": ["toolself"],
             "cat": {k: SAVED_BEFORE[k] for k in ("teacher_samples", "agent", "rft", "kto", "timeout")}}
    assert StudySettings(**saved).to_dict() == {**saved, "cat": installed(saved["cat"])}


def test_a_record_holds_only_what_was_set():
    assert AgentOverrides().to_dict() == {}
    assert AgentOverrides(max_total_tokens=None).to_dict() == {"max_total_tokens": None}  # None is a value
    assert RFTOverrides.from_dict({"learning_rate": 1e-3}).num_train_epochs is not None  # unset, not None


@pytest.mark.parametrize("record, data, named", [
    (AgentOverrides, {"max_stage": 3}, "max_stage"),
    (AgentOverrides, {"method": "vanilla"}, "method"),  # the method is the pipeline's, not an override
    (RFTOverrides, {"learnin_rate": 1e-3}, "learnin_rate"),
    (KTOOverrides, {"beta": 0.1, "betta": 0.2}, "betta"),
])
def test_an_unknown_field_is_an_error_naming_it(record, data, named):
    with pytest.raises(ValueError, match=named):
        record.from_dict(data)


def test_a_value_out_of_bounds_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="max_stages must be at least 1"):
        AgentOverrides(max_stages=0)
    with pytest.raises(ValueError, match="per_device_train_batch_size must be at least 2"):
        KTOOverrides(per_device_train_batch_size=1)


def test_a_field_the_run_sets_itself_is_refused_as_an_option():
    with pytest.raises(ValueError, match="set by the run itself"):
        RFTOverrides.from_dict({"max_length": 512})


def test_any_field_of_the_stages_trl_config_passes_through():
    options = RFTOverrides.from_dict({"weight_decay": 0.1, "lora_r": 8})
    assert options.extra == {"weight_decay": 0.1} and options.to_dict() == {"lora_r": 8, "weight_decay": 0.1}


def test_a_study_recipe_with_an_unknown_setting_names_it():
    with pytest.raises(ValueError, match="teacher_sample"):
        StudySettings(["builtin:research"], ["builtin:mixed"], cat={"teacher_sample": 2})
    with pytest.raises(ValueError, match="max_stage"):
        replace(demo_preset().cat, agent={"max_stage": 2})


@pytest.mark.parametrize("option, value, named", [
    ("--agent-options", '{"max_stage": 3}', "max_stage"),
    ("--rft-options", '{"learnin_rate": 0.1}', "learnin_rate"),
    ("--kto-options", "[1]", "JSON object"),
])
def test_train_cat_names_a_bad_key_of_its_json_options(tmp_path, option, value, named):
    result = CliRunner().invoke(app, ["train", "cat", "-t", "builtin:research", "-o", str(tmp_path), option, value])
    assert result.exit_code != 0 and named in result.output + result.stderr
    assert not (tmp_path / "state.json").exists()


def test_train_cat_refuses_fp16_on_a_machine_without_a_gpu_before_any_work(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks what a machine without a CUDA GPU does")
    result = CliRunner().invoke(app, ["train", "cat", "-t", "builtin:research", "-o", str(tmp_path),
                                      "--rft-options", '{"fp16": true}'])
    assert result.exit_code != 0 and "fp16 mixed precision trains on a CUDA GPU only" in result.output + result.stderr
    assert not (tmp_path / "state.json").exists()

# presets -------------------------------------------------------------------------------------

def test_the_preset_is_recorded_only_when_there_is_one():
    assert "preset" not in CATSettings(tasks=["builtin:research"]).to_dict()
    assert CATSettings(tasks=["builtin:research"], preset="paper").to_dict()["preset"] == "paper"
    with pytest.raises(ValueError, match="unknown preset"):
        CATSettings(tasks=["builtin:research"], preset="papr")


def test_a_run_made_without_the_preset_refuses_to_resume_with_it(tmp_path):
    plain = CATSettings(tasks=["builtin:research"])
    state = State(tmp_path)
    state.data["settings"] = plain.to_dict()
    state.save()
    with pytest.raises(PipelineMismatch):
        run_cat(replace(plain, preset="paper"), tmp_path, echo=lambda line: None)


def finished_run(out, settings: CATSettings) -> None:
    state = State(out)
    state.data = {"settings": settings.to_dict(), "steps": {s: {"done": True, "result": {}} for s in STEPS}}
    state.save()


def served_run(teacher_port: int, judge_port: int, search_port: int, **changed) -> CATSettings:
    from toolself.tools.options import ToolOptions

    tools = ToolOptions.from_dict({"judge": f"openai:judge@http://127.0.0.1:{judge_port}/v1",
                                   "web": {"search": "searxng", "search_url": f"http://127.0.0.1:{search_port}"}})
    teacher = f"openai:teacher@http://127.0.0.1:{teacher_port}/v1"
    return CATSettings(**{"tasks": ["builtin:research"], "teacher": teacher, "tools": tools.to_dict(), **changed})


def test_a_run_resumes_with_its_teacher_judge_and_search_served_at_other_addresses(tmp_path):
    finished_run(tmp_path, served_run(8000, 8001, 8888))
    lines: list[str] = []
    run_cat(served_run(9000, 9001, 9888), tmp_path, echo=lines.append)  # a job resumed on another node
    assert lines == [f"[{step}] done earlier, skipped" for step in STEPS]
    assert State(tmp_path).data["settings"]["teacher"] == "openai:teacher@http://127.0.0.1:9000/v1"


def test_a_run_with_another_teacher_is_refused_naming_what_differs(tmp_path):
    finished_run(tmp_path, served_run(8000, 8001, 8888))
    with pytest.raises(PipelineMismatch, match=r"(?s)teacher: was 'openai:teacher', now 'openai:other'.*"
                                               r"temperature: was 0.7, now 0.9"):
        run_cat(served_run(8000, 8001, 8888, teacher="openai:other@http://127.0.0.1:8000/v1", temperature=0.9),
                tmp_path, echo=lambda line: None)


def test_the_presets_settings_sit_between_the_students_budgets_and_the_users():
    settings = CATSettings(tasks=["builtin:research"], preset="paper", agent={"max_stages": 4})
    layered = agent_overrides(settings)
    assert layered["max_stages"] == 4  # the user's
    assert layered["context_budget"] == PAPER.agent["context_budget"] and layered["dialect"] == "official"
    assert agent_budgets(ModelSpec.parse("embedded")).to_dict() == SMALL_MODEL.settings()


def test_every_model_the_pipeline_evaluates_loads_with_the_presets_options():
    settings = CATSettings(tasks=["builtin:research"], preset="paper", dtype="float32")
    assert settings.model_options("local:/runs/cat/rft") == {"dtype": "float32", "temperature": 0.6, "top_p": 0.95,
                                                             "text_protocol": "paper"}
    served = settings.model_options("openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
    assert served["extra_body"] == {"top_p": 0.95} and served["tool_protocol"] == "text"
    assert CATSettings(tasks=["builtin:research"]).model_options("embedded") == {"dtype": "auto"}


def test_a_served_student_is_asked_not_to_think_unless_its_protocol_trains_the_teachers_reasoning():
    served = "openai:rft@http://127.0.0.1:8001/v1"
    default = CATSettings(tasks=["builtin:research"]).model_options(served, served=True)
    assert default == {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    assert CATSettings(tasks=["builtin:research"]).model_options(served) == {}  # a teacher's server decides
    paper = CATSettings(tasks=["builtin:research"], preset="paper").model_options(served, served=True)
    assert paper["extra_body"] == {"top_p": 0.95}  # the paper's protocol keeps <think>: the student thinks


def thinking_run() -> list:
    """The authors' run, each action with a thought before its call."""
    return [reply if isinstance(reply, str) else replace(reply, reasoning="the next step") for reply in OFFICIAL_RUN]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", [None, "paper"])
def test_train_data_renders_the_examples_in_the_presets_protocol(tmp_path, preset):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from toolself.models.weights import MissingWeightsError, default_model_dir
    from toolself.train.data import tool_schemas

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    except MissingWeightsError as exc:
        pytest.skip(str(exc))
    trajectory = Agent(ScriptedModel(thinking_run()), POOL, paper_settings()).run("find a and b")
    trajectory.metadata["correct"] = True
    write_jsonl(tmp_path / "runs.jsonl", [trajectory])
    (tmp_path / "tools.json").write_text(json.dumps(tool_schemas(POOL)))
    command = ["train", "data", str(tmp_path / "runs.jsonl"), "--kind", "sft", "--out", str(tmp_path / "data")]
    result = CliRunner().invoke(app, command + (["--preset", preset] if preset else []))
    assert result.exit_code == 0, result.output + result.stderr
    text = "\n".join(tokenizer.decode(ids) for ids in load_from_disk(str(tmp_path / "data" / "sft"))["input_ids"])
    assert '<tool_call>\n{"name": "reconfigure", "arguments": {"execution_summary": "a is alpha"' in text
    appended = "# Tools\n\nYou may call one or more functions"  # toolself's tool list, after the system prompt
    if preset == "paper":  # the tools travel in the stage's own user turn; the thoughts stay in context
        assert appended not in text and "<think>\nthe next step\n</think>" in text
    else:
        assert appended in text and "the next step" not in text
    assert json.loads((tmp_path / "data" / "sft" / "stats.json").read_text())["preset"] == preset


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_train_cat_with_the_paper_preset_collects_and_scores_as_the_authors_did(tmp_path, monkeypatch):
    from toolself.evals.loaders import load_tasks

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    answer = load_tasks("builtin:research", split="train", limit=1)[0].answer  # the suite key decides it
    terminate = tool_call("terminate", status="success", result=answer, summary="looked it up")
    teacher = FakeService([Reply(200, completion(official_config(toolbox=("search", "visit")))),
                           Reply(200, completion("<think>I know it</think>\n" + terminate + "\n"
                                                 + tool_call("terminate", status="success", result="WRONG",
                                                             summary="")))],
                          default=Reply(200, completion(terminate)))
    out = tmp_path / "cat"
    with teacher.running() as url:
        result = CliRunner().invoke(app, [
            "train", "cat", "--preset", "paper", "-t", "builtin:research", "--limit", "1", "--teacher-samples", "1",
            "--teacher", f"openai:Qwen/Qwen3-8B@{url}/v1", "--concurrency", "1", "--stop-after", "collect_teacher",
            "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    bodies = [r["body"] for r in teacher.requests]
    assert bodies and all(b["temperature"] == 0.6 and b["top_p"] == 0.95 and "tools" not in b for b in bodies)
    assert all("<tools>" not in b["messages"][0]["content"] for b in bodies)
    collected = out / "collect" / "teacher"
    trajectory = json.loads((collected / "toolself" / "trajectories.jsonl").read_text())
    assert trajectory["end_reason"] == "terminate" and trajectory["answer"] == answer  # the first call only
    record = json.loads((collected / "toolself" / "results.jsonl").read_text())
    assert record["correct"] and (record["scorer"], record["reason"]) == ("paper", "correct at the exact step")
    assert json.loads((collected / "tools.json").read_text())["visit"]["function"]["parameters"]["required"] == [
        "url", "goal"]  # the authors' visit
    saved = json.loads((out / "state.json").read_text())["settings"]
    assert saved["preset"] == "paper" and saved["temperature"] == 0.6 and saved["timeout"] == 1800
