"""A model spec is parsed once, and every layer reads the same budgets and options from it."""

import pytest

from toolself.models.spec import LARGE_MODEL, SMALL_MODEL, ModelSpec, model_defaults, runs_in_process, served_name
from toolself.train.pipeline import CATSettings, agent_overrides, student_spec

SERVED = "openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1"


@pytest.mark.parametrize("text", ["embedded", "default", "embedded:cat", "local:/models/student"])
def test_the_embedded_model_and_a_local_one_not_known_to_be_large_get_the_small_model_budgets(text):
    spec = ModelSpec.parse(text)
    assert spec.in_process and runs_in_process(text)
    assert spec.defaults == SMALL_MODEL


def test_a_served_model_gets_a_large_context_and_no_caps():
    assert ModelSpec.parse(SERVED).defaults == LARGE_MODEL
    assert not runs_in_process(SERVED)


def test_the_default_student_is_the_embedded_model_in_training_as_in_evaluation():
    default, embedded = CATSettings(tasks=["builtin:research"], student="default"), CATSettings(
        tasks=["builtin:research"], student="embedded")
    assert agent_overrides(default) == agent_overrides(embedded) == SMALL_MODEL.settings()
    assert student_spec(default) == student_spec(embedded) == "embedded"


def test_the_users_budgets_win_over_the_models():
    settings = CATSettings(tasks=["builtin:research"], agent={"context_budget": 2000})
    assert agent_overrides(settings)["context_budget"] == 2000
    assert agent_overrides(settings)["config_max_text"] == SMALL_MODEL.config_max_text


def test_the_expert_keeps_the_agents_own_budgets():
    assert ModelSpec.parse("expert").defaults is None
    assert model_defaults("expert") == LARGE_MODEL


def test_load_options_follow_where_the_model_runs():
    assert ModelSpec.parse("embedded").options(0.7, 3, "float32") == {"temperature": 0.7, "seed": 3,
                                                                      "dtype": "float32"}
    assert ModelSpec.parse(SERVED).options(0.7, 3) == {"temperature": 0.7}
    assert ModelSpec.parse(SERVED).options(0.0, 3) == {}
    assert ModelSpec.parse("expert").options(0.7, 3) == {}


def test_a_bare_directory_is_a_local_model_only_where_training_allows_it(tmp_path):
    assert ModelSpec.parse(str(tmp_path), directories=True) == ModelSpec("local", f"local:{tmp_path}", str(tmp_path))
    with pytest.raises(ValueError, match="unknown model spec"):
        ModelSpec.parse(str(tmp_path))


@pytest.mark.parametrize("text", ["", "gpt", "embedded:nope", "local:"])
def test_an_unknown_spec_is_an_error_that_names_what_is_accepted(text):
    with pytest.raises(ValueError, match="embedded:cat|local:DIR"):
        ModelSpec.parse(text)


def test_a_directory_without_weights_cannot_be_trained_from(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a transformers model directory nor a LoRA adapter"):
        ModelSpec.parse(f"local:{tmp_path}").weights()


def test_the_expert_cannot_be_loaded_as_one_model():
    with pytest.raises(ValueError, match="teacher per task"):
        ModelSpec.parse("expert").load()


def test_a_served_model_is_known_by_its_name_not_by_where_it_is_served():
    assert served_name("openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1") == "openai:Qwen/Qwen3-8B"
    assert served_name("openai:m@http://127.0.0.1:8001/v1#4,http://127.0.0.1:8002/v1") == "openai:m"
    assert served_name("openai:me@example@https://127.0.0.1/v1") == "openai:me@example"
    assert served_name("openai:m") == "openai:m"  # served where OPENAI_BASE_URL says
    assert served_name("local:/runs/rft") == "local:/runs/rft"
    assert ModelSpec.parse("openai:m@http://127.0.0.1:8000/v1").identity == "openai:m"


def test_request_options_join_a_presets_extra_body_of_a_served_model():
    options = ModelSpec.parse(SERVED).with_request_fields({"temperature": 0.6, "extra_body": {"top_p": 0.95}},
                                                          {"chat_template_kwargs": {"enable_thinking": False}})
    assert options == {"temperature": 0.6, "extra_body": {"top_p": 0.95,
                                                          "chat_template_kwargs": {"enable_thinking": False}}}


@pytest.mark.parametrize("text", ["embedded", "local:/models/tiny", "expert"])
def test_request_options_are_refused_for_a_model_no_server_reads(text):
    with pytest.raises(ValueError, match="go to a served model"):
        ModelSpec.parse(text).with_request_fields({}, {"top_k": 20})


def test_request_options_cannot_set_a_field_the_client_writes_itself():
    with pytest.raises(ValueError, match="cannot set seed, temperature: toolself writes them"):
        ModelSpec.parse(SERVED).with_request_fields({}, {"temperature": 1.0, "seed": 2, "top_k": 20})
