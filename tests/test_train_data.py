"""Trajectories -> training examples, specified on attempts run through the real agent loop
(a scripted policy, real tools) and rendered with the embedded model's real tokenizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_agent import lookup

from toolself.agent import Agent, AgentSettings
from toolself.models.base import Completion
from toolself.models.protocol import DEFAULT, PAPER
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolPool, tool
from toolself.train import data as D
from toolself.trajectory import Trajectory

pytest.importorskip("transformers")
pytest.importorskip("datasets")


@tool
def read_log(part: int) -> str:
    """Read a part of a long log.

    Args:
        part: Which part.
    """
    return f"part {part}: " + "line of log output. " * 40


POOL = ToolPool([lookup, read_log])


def config(subgoal="find a", toolbox=("lookup",), knowledge="none", mode="basic") -> str:
    return json.dumps({"subgoal": subgoal, "strategy": "Use lookup, then answer.", "toolbox": list(toolbox),
                       "knowledge": knowledge, "context_mode": mode})


TWO_STAGES = [
    config(),
    call("lookup", key="a"),
    call("reconfigure", summary="a is alpha", reason="sub-goal done", next_subgoal="find b"),
    config(subgoal="find b", knowledge="history"),
    call("lookup", key="b"),
    call("terminate", answer="alpha, beta"),
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from toolself.models.weights import MissingWeightsError, default_model_dir

    try:
        return AutoTokenizer.from_pretrained(str(default_model_dir()))
    except MissingWeightsError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return D.Renderer(tokenizer, D.tool_schemas(POOL))


def run(replies, correct=True, model=None, **settings):
    model = model or ScriptedModel(list(replies))
    trajectory = Agent(model, POOL, AgentSettings(**settings)).run("What are a and b?")
    if correct is not None:
        trajectory.metadata["correct"] = correct
    return trajectory


def loss_spans(example) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, label in enumerate(example["labels"] + [D.IGNORE]):
        if label != D.IGNORE and start is None:
            start = i
        elif label == D.IGNORE and start is not None:
            spans.append((start, i))
            start = None
    return spans


def all_calls(trajectory):
    return [(conv, c) for conv in trajectory.conversations() for c in conv.calls]


def test_loss_falls_exactly_on_each_reply_the_policy_wrote(tokenizer, renderer):
    trajectory = run(TWO_STAGES)
    examples = D.sft_sequences(trajectory, renderer)
    decoded = [tokenizer.decode(ex["input_ids"][a:b]) for ex in examples for a, b in loss_spans(ex)]
    expected = []
    for conversation, c in all_calls(trajectory):
        reply = D.to_text_messages([conversation.messages[c.output]], None)[0]["content"]
        expected.append(reply + "<|im_end|>")
    assert decoded == expected


def test_each_loss_span_follows_the_generation_prompt_and_everything_else_is_masked(tokenizer, renderer):
    examples = D.sft_sequences(run(TWO_STAGES), renderer)
    for ex in examples:
        assert len(ex["input_ids"]) == len(ex["labels"])
        for a, b in loss_spans(ex):
            assert tokenizer.decode(ex["input_ids"][a - 5:a]).endswith("<|im_start|>assistant\n")
            assert ex["labels"][a:b] == ex["input_ids"][a:b]
        masked = [i for i, label in enumerate(ex["labels"]) if label == D.IGNORE]
        assert all(ex["labels"][i] == D.IGNORE for i in masked) and masked[0] == 0


def test_a_stage_whose_context_only_grows_is_one_sequence_with_its_configuration_turn(renderer):
    trajectory = run(TWO_STAGES)
    examples = D.sft_sequences(trajectory, renderer)
    # setup turn (C_0) | stage 0: lookup, reconfigure, C_1 in the same context | stage 1: lookup, terminate
    assert [json.loads(ex["decisions"]) for ex in examples] == [
        ["0:0:configure"], ["1:0:action", "1:1:action", "1:2:configure"], ["2:0:action", "2:1:action"]]


def test_every_packed_decision_sees_exactly_the_prompt_it_was_given(renderer):
    trajectory = run(TWO_STAGES)
    conversations = list(trajectory.conversations())
    for ex in D.sft_sequences(trajectory, renderer):
        spans = loss_spans(ex)
        for (a, _), tag in zip(spans, json.loads(ex["decisions"])):
            ci, k, _ = tag.split(":")
            conversation = conversations[int(ci)]
            c = conversation.calls[int(k)]
            assert ex["input_ids"][:a] == renderer.prompt_ids(conversation.visible(c), c.tools)


def test_a_context_mode_cut_starts_a_new_sequence(renderer):
    replies = [config(toolbox=("read_log",), mode="truncation")] + [call("read_log", part=i) for i in range(4)] \
        + [call("terminate", answer="done")]
    trajectory = run(replies)
    stage = trajectory.stages[0].conversation
    assert any(keep is not None for keep in [k for _, k in stage.calls[-1].view])  # the mode did cut
    examples = D.sft_sequences(trajectory, renderer)
    stage_sequences = [json.loads(ex["decisions"]) for ex in examples][1:]
    assert len(stage_sequences) > 1
    assert sum(len(s) for s in stage_sequences) == len(stage.calls)


@pytest.mark.parametrize("protocol", [DEFAULT, PAPER], ids=["toolself", "paper"])
def test_the_rendered_prompt_is_the_embedded_backends_prompt(tokenizer, protocol):
    from toolself.models.local import EmbeddedModel

    renderer = D.Renderer(tokenizer, D.tool_schemas(POOL), protocol)
    trajectory = run(TWO_STAGES)
    backend = SimpleNamespace(tokenizer=tokenizer, text_protocol=protocol)
    for conversation, c in all_calls(trajectory):
        schemas = renderer.tools(c.tools)
        assert renderer.prompt_ids(conversation.visible(c), c.tools) == \
            EmbeddedModel.prompt_ids(backend, conversation.visible(c), schemas)


class TokenizingScripted(ScriptedModel):
    """Records completion token ids as a backend would, tokenized in two halves (so they differ
    from a one-piece tokenization of the same text: the drift a re-tokenization introduces)."""

    def __init__(self, replies, tokenizer):
        super().__init__(replies)
        self.tokenizer = tokenizer

    def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None) -> Completion:
        completion = super().complete(messages, tools, response_schema, session, max_tokens)
        text = D.to_text_messages([completion.message], None)[0]["content"]
        half = len(text) // 2
        ids = self.tokenizer(text[:half], add_special_tokens=False)["input_ids"] + \
            self.tokenizer(text[half:] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        completion.completion_token_ids = ids
        return completion


def test_recorded_completion_ids_are_trained_verbatim(tokenizer, renderer):
    trajectory = run(TWO_STAGES, model=TokenizingScripted(list(TWO_STAGES), tokenizer))
    recorded = [c.completion_token_ids for _, c in all_calls(trajectory)]
    retokenized = [tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] for ids in recorded]
    assert recorded != retokenized  # the halves really drift
    examples = D.sft_sequences(trajectory, renderer)
    trained = [ex["labels"][a:b] for ex in examples for a, b in loss_spans(ex)]
    assert trained == recorded
    kto = D.kto_decisions(trajectory, renderer, label=True)
    assert [ex["completion_ids"] for ex in kto] == recorded and all(ex["recorded_ids"] for ex in kto)


def test_a_rejected_configuration_stays_in_context_but_carries_no_loss(tokenizer, renderer):
    bad = json.dumps({"subgoal": "find a", "strategy": "s", "toolbox": ["telescope"], "knowledge": "none",
                      "context_mode": "basic"})
    trajectory = run([bad] + TWO_STAGES)
    stats = D.BuildStats()
    examples = D.sft_sequences(trajectory, renderer, stats=stats)
    assert stats.masked_rejected == 1
    setup = examples[0]
    assert json.loads(setup["decisions"]) == ["0:0:configure", "0:1:configure"]
    assert "telescope" in tokenizer.decode(setup["input_ids"])
    assert all("telescope" not in tokenizer.decode(setup["input_ids"][a:b]) for a, b in loss_spans(setup))
    assert len(loss_spans(setup)) == 1


def test_one_kto_example_per_decision_all_with_the_attempts_outcome(renderer):
    trajectory = run(TWO_STAGES, correct=False)
    examples = D.kto_decisions(trajectory, renderer, label=D.outcome(trajectory))
    calls = all_calls(trajectory)
    assert len(examples) == len(calls) == 6
    assert [ex["kind"] for ex in examples] == [c.kind for _, c in calls]
    assert {ex["label"] for ex in examples} == {False}
    for ex, (conversation, c) in zip(examples, calls):
        assert ex["prompt_ids"] == renderer.prompt_ids(conversation.visible(c), c.tools)
        assert ex["prompt"].endswith("<|im_start|>assistant\n") and ex["completion"].endswith("<|im_end|>")


def test_datasets_take_successes_for_sft_and_scored_attempts_for_kto(renderer):
    good, bad, unscored = run(TWO_STAGES, True), run(TWO_STAGES, False), run(TWO_STAGES, None)
    sft, sft_build = D.build_sft_dataset([good, bad, unscored], renderer)
    assert set(sft["trajectory_id"]) == {good.id} and sft_build.skipped_trajectories == 2
    kto, kto_build, weights = D.build_kto_dataset([good, bad, unscored], renderer)
    assert len(kto) == 12 and kto_build.skipped_trajectories == 1
    assert (weights.desirable, weights.undesirable) == (6, 6)
    assert sorted(set(kto["trajectory_id"])) == sorted({good.id, bad.id})


def test_outcome_reads_the_scorers_verdict():
    t = run(TWO_STAGES, correct=None)
    assert D.outcome(t) is None
    t.metadata["score"] = {"correct": True}
    assert D.outcome(t) is True
    t.metadata["correct"] = False
    assert D.outcome(t) is False


@pytest.mark.parametrize("desirable,undesirable", [(1, 9), (3, 40), (10, 10), (50, 7), (200, 1), (7, 8)])
def test_kto_weights_put_the_weighted_balance_inside_trls_range(desirable, undesirable):
    w = D.kto_weights(desirable, undesirable)
    assert 1.0 <= w.ratio <= 4 / 3
    assert min(w.desirable_weight, w.undesirable_weight) == 1.0  # only the minority is scaled up
    # TRL's own check (KTOTrainer._prepare_dataset): either weight inside its recommended interval
    des_low = round(undesirable * w.undesirable_weight / desirable, 2)
    und_high = round(desirable * w.desirable_weight / undesirable, 2)
    assert des_low <= w.desirable_weight <= round(des_low * 1.33 / 1.0, 2) + 0.01 or \
        round(und_high / 1.33, 2) <= w.undesirable_weight <= und_high


def test_kto_weights_of_a_single_class_are_neutral():
    w = D.kto_weights(0, 12)
    assert w.single_class and (w.desirable_weight, w.undesirable_weight) == (1.0, 1.0)


def test_a_long_prompt_is_cut_from_the_left_keeping_its_end_and_the_whole_reply(renderer):
    trajectory = run(TWO_STAGES)
    full = D.kto_decisions(trajectory, renderer, True)
    stats = D.BuildStats()
    cut = D.kto_decisions(trajectory, renderer, True, max_length=200, stats=stats)
    assert stats.truncated == sum(len(f["prompt_ids"]) + len(f["completion_ids"]) > 200 for f in full) > 0
    for f, c in zip(full, cut):
        assert len(c["prompt_ids"]) + len(c["completion_ids"]) <= 200
        assert c["completion_ids"] == f["completion_ids"]
        assert f["prompt_ids"][-len(c["prompt_ids"]):] == c["prompt_ids"]
    sft_stats = D.BuildStats()
    for ex in D.sft_sequences(trajectory, renderer, max_length=200, stats=sft_stats):
        assert len(ex["input_ids"]) <= 200 and ex["labels"][-1] != D.IGNORE
    assert sft_stats.truncated > 0


def test_an_unknown_tool_name_is_an_error_not_a_silent_render(tokenizer):
    renderer = D.Renderer(tokenizer, D.tool_schemas(ToolPool([read_log])))
    with pytest.raises(D.RenderError, match="lookup"):
        D.sft_sequences(run(TWO_STAGES), renderer)


def test_a_turn_with_images_is_refused_not_rendered_as_text(renderer):
    saved = run(TWO_STAGES).to_dict()  # as a trajectory file from elsewhere could hold it
    task = next(m for m in saved["stages"][0]["conversation"]["messages"] if m["role"] == "user")
    task["images"] = ["data:image/png;base64,iVBORw0KGgo="]
    trajectory = Trajectory.from_dict(saved)
    with pytest.raises(D.RenderError, match="carries images"):
        D.sft_sequences(trajectory, renderer)
    with pytest.raises(D.RenderError, match="carries images"):
        D.kto_decisions(trajectory, renderer, label=True)


def test_datasets_round_trip_through_disk_with_their_stats(tmp_path, renderer):
    dataset, build = D.build_sft_dataset([run(TWO_STAGES)], renderer)
    D.save_dataset(dataset, tmp_path / "sft", D.sft_stats(dataset, build))
    loaded = D.load_dataset_dir(tmp_path / "sft")
    assert loaded["input_ids"] == dataset["input_ids"] and loaded["labels"] == dataset["labels"]
    stats = json.loads((tmp_path / "sft" / "stats.json").read_text())
    assert stats["sequence_tokens"]["count"] == 3 and stats["build"]["decisions"] == 6


def test_collected_runner_attempts_come_back_labelled_with_their_tool_schemas(tmp_path, tokenizer):
    from toolself.train.collect import collect, load_any

    result = collect(["builtin:research?hops=2"], "expert", tmp_path / "run", samples=2, limit=2,
                     concurrency=2, progress=False)
    assert result.attempts == 4
    trajectories, schemas = load_any(tmp_path / "run")
    assert len(trajectories) == 4 and all(isinstance(D.outcome(t), bool) for t in trajectories)
    assert {"search", "visit", "reconfigure", "terminate"} <= set(schemas)
    kto, build, _ = D.build_kto_dataset(trajectories, D.Renderer(tokenizer, schemas))
    assert len(kto) == sum(len(c.calls) for t in trajectories for c in t.conversations())


def test_data_command_prints_counts_lengths_and_balance(tmp_path):
    from typer.testing import CliRunner

    from toolself.train.cli import train_app
    from toolself.trajectory import write_jsonl

    write_jsonl(tmp_path / "t.jsonl", [run(TWO_STAGES, True), run(TWO_STAGES, False)])
    (tmp_path / "tools.json").write_text(json.dumps(D.tool_schemas(POOL)))  # the pool they ran with
    result = CliRunner().invoke(train_app, ["data", str(tmp_path / "t.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["sft"]["build"]["trajectories"] == 1 and report["sft"]["sequence_tokens"]["count"] == 3
    assert report["kto"]["labels"] == {"desirable": 6, "undesirable": 6}
    assert report["kto"]["by_kind"]["configure"] == {"desirable": 2, "undesirable": 2}


# -- Qwen3's own chat template (the copy TRL ships), on the default tokenizer: both are ChatML --

@pytest.fixture(scope="module")
def qwen3_tokenizer():
    from importlib.resources import files

    from transformers import AutoTokenizer

    from toolself.models.weights import default_model_dir

    template = files("trl") / "chat_templates" / "qwen3.jinja"
    if not template.is_file():
        pytest.skip("this TRL release ships no copy of Qwen3's chat template")
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    tokenizer.chat_template = template.read_text(encoding="utf-8")
    return tokenizer


def thinking(replies) -> list[str]:
    """The replies as a thinking model writes them: each after a reasoning of its own."""
    text = [r if isinstance(r, str) else D.to_text_messages([r], None)[0]["content"] for r in replies]
    return [f"<think>\nstep {i}: what next?\n</think>\n\n{t}" for i, t in enumerate(text)]


def test_under_qwen3s_template_each_reply_is_trained_after_exactly_its_prompt_and_with_its_think_block(
        qwen3_tokenizer):
    renderer = D.Renderer(qwen3_tokenizer, D.tool_schemas(POOL))
    trajectory = run(TWO_STAGES)
    conversations = list(trajectory.conversations())
    examples = D.sft_sequences(trajectory, renderer)
    for ex in examples:
        for (a, b), tag in zip(loss_spans(ex), json.loads(ex["decisions"])):
            ci, k, _ = tag.split(":")
            c = conversations[int(ci)].calls[int(k)]
            assert ex["input_ids"][:a] == renderer.prompt_ids(conversations[int(ci)].visible(c), c.tools)
            assert qwen3_tokenizer.decode(ex["input_ids"][a:b]).startswith("<think>\n\n</think>\n\n")  # as Qwen3 emits
    assert len(examples) == len(all_calls(trajectory))  # no reply could be packed after another (next test)


def test_a_template_that_rerenders_earlier_replies_is_named_with_the_context_tokens_it_makes_training_reread(
        qwen3_tokenizer, renderer):
    trajectory = run(TWO_STAGES)
    _, packed = D.build_sft_dataset([trajectory], renderer)
    dataset, stats = D.build_sft_dataset([trajectory], D.Renderer(qwen3_tokenizer, D.tool_schemas(POOL)))
    assert packed.unpacked == 0 and not packed.notes
    assert stats.unpacked == 3  # the second and third calls of stage 0, the second of stage 1
    total = sum(len(ids) for ids in dataset["input_ids"])
    assert 0 < stats.reread_tokens < total
    assert len(stats.notes) == 1 and "3 of 6 decisions began a sequence of their own" in stats.notes[0]
    assert f"{stats.reread_tokens:,} context tokens are read again" in stats.notes[0]


def test_under_qwen3s_template_replies_that_keep_their_reasoning_pack_as_under_the_default_template(
        qwen3_tokenizer, renderer):
    trajectory = run(thinking(TWO_STAGES))
    qwen3 = D.Renderer(qwen3_tokenizer, D.tool_schemas(POOL), PAPER)  # the paper's protocol keeps <think>
    default = D.Renderer(renderer.tokenizer, D.tool_schemas(POOL), PAPER)
    stats = D.BuildStats()
    grouped = [json.loads(ex["decisions"]) for ex in D.sft_sequences(trajectory, qwen3, stats=stats)]
    assert grouped == [json.loads(ex["decisions"]) for ex in D.sft_sequences(trajectory, default)]
    assert stats.unpacked == 0 and len(grouped) == 3


def test_the_data_command_names_a_qwen3_students_rereading_cost(tmp_path, qwen3_tokenizer):
    import shutil

    from typer.testing import CliRunner

    from toolself.models.weights import default_model_dir
    from toolself.train.cli import train_app
    from toolself.trajectory import write_jsonl

    student = tmp_path / "qwen3-shaped"
    qwen3_tokenizer.save_pretrained(str(student))
    shutil.copy(default_model_dir() / "config.json", student / "config.json")
    write_jsonl(tmp_path / "t.jsonl", [run(TWO_STAGES, True)])
    (tmp_path / "tools.json").write_text(json.dumps(D.tool_schemas(POOL)))
    result = CliRunner().invoke(train_app, ["data", str(tmp_path / "t.jsonl"), "--kind", "sft", "--student",
                                            f"local:{student}", "--json"])
    assert result.exit_code == 0, result.output
    build = json.loads(result.output)["sft"]["build"]
    assert build["unpacked"] == 3 and "began a sequence of their own" in build["notes"][0]


def test_the_chat_template_benchmark_prints_qwen3s_cost_against_the_default_template(qwen3_tokenizer):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    from toolself.models.weights import default_model_dir

    student = default_model_dir()  # a model folder with a tokenizer and a template of its own
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "chat_templates.py"), "--tasks",
                           "builtin:research?hops=2", "--limit", "2", "--tokenizer", str(student)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{\n"):])
    default, qwen3 = report["templates"]["default (SmolLM2)"], report["templates"]["qwen3"]
    assert report["templates"][f"{student.name} (its own tokenizer)"] == default
    assert default["unpacked"] == 0 and qwen3["unpacked"] > 0 and qwen3["sequences"] == qwen3["decisions"]
    assert report["qwen3_over_default_sequence_tokens"] > 1


@pytest.fixture
def qwen3_student(tmp_path, tiny, qwen3_tokenizer):
    """The tiny model with Qwen3's chat template."""
    import shutil

    student = shutil.copytree(tiny, tmp_path / "qwen3-student")
    qwen3_tokenizer.save_pretrained(str(student))
    return student


def test_a_local_qwen3_student_writes_a_constrained_reply_as_training_renders_it(qwen3_student, qwen3_tokenizer):
    from toolself.models import load_model
    from toolself.models.base import Message

    student = qwen3_student
    question = [Message(role="user", content="Which context mode?")]
    model = load_model(f"local:{student}")
    try:
        reply = model.complete(question, response_schema={
            "type": "object", "properties": {"mode": {"enum": ["basic", "history"]}}, "required": ["mode"]})
        call_reply = model.complete(question, tools=[D.tool_schemas(POOL)["lookup"]], max_tokens=24)
    finally:
        model.close()
    written = qwen3_tokenizer.decode(reply.completion_token_ids)
    assert written.startswith("<think>\n\n</think>\n\n{") and json.loads(reply.message.content)["mode"]
    assert written == D.Renderer(qwen3_tokenizer, D.tool_schemas(POOL)).completion_text(question, reply.message, [])
    assert qwen3_tokenizer.decode(call_reply.completion_token_ids).startswith("<think>\n\n</think>\n\n<tool_call>")


def test_a_local_qwen3_student_opens_a_free_reply_without_reasoning_too(qwen3_student, qwen3_tokenizer):
    from toolself.models import load_model
    from toolself.models.base import Message

    model = load_model(f"local:{qwen3_student}")
    try:
        free = model.complete([Message(role="user", content="Say something.")], max_tokens=12)
    finally:
        model.close()
    assert qwen3_tokenizer.decode(free.completion_token_ids).startswith("<think>\n\n</think>\n\n")
    assert "<think>" not in free.message.content


def test_a_chatml_template_opens_a_reply_with_nothing_and_qwen3s_with_an_empty_think_block(tokenizer, qwen3_tokenizer):
    from toolself.models.local import reply_opening

    assert reply_opening(tokenizer) == "" and reply_opening(qwen3_tokenizer) == "<think>\n\n</think>\n\n"


def replaying(replies, native: bool, bodies: list):
    """An OpenAI-compatible chat endpoint that answers the n-th request with replies[n], as a
    server answers on that protocol, and keeps every request body in `bodies`."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def endpoint(request):
        bodies.append(await request.json())
        reply = replies[len(bodies) - 1]
        if isinstance(reply, str):
            message = {"content": reply}
        elif native:
            calls = [{"id": f"call_{len(bodies)}_{i}", "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                     for i, c in enumerate(reply.tool_calls)]
            message = {"content": reply.content or None, "tool_calls": calls}
        else:
            message = {"content": D.to_text_messages([reply], None)[0]["content"]}
        return JSONResponse({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "student",
                             "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                          "finish_reason": "stop"}]})

    return Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])


def as_vllm_renders(messages):
    """A request's messages as vLLM hands them to the chat template: tool-call arguments parsed."""
    def parsed(call):
        return {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}

    return [{**m, "tool_calls": [parsed(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


@pytest.mark.parametrize("tool_protocol", ["native", "text"])
def test_under_qwen3s_template_a_served_policy_is_prompted_as_training_rendered_each_replys_prompt(
        qwen3_tokenizer, tool_protocol):
    from http_fixtures import running_server

    from toolself.models.openai_compat import OpenAIModel

    bodies: list = []
    with running_server(replaying(TWO_STAGES, tool_protocol == "native", bodies)) as url:
        trajectory = run(TWO_STAGES, model=OpenAIModel("student", url + "/v1", tool_protocol=tool_protocol,
                                                       max_retries=0))
    renderer = D.Renderer(qwen3_tokenizer, D.tool_schemas(POOL))
    calls = all_calls(trajectory)
    assert len(bodies) == len(calls) == len(TWO_STAGES)
    for body, (conversation, c) in zip(bodies, calls):
        served = qwen3_tokenizer.apply_chat_template(  # as vLLM renders it, thinking off
            as_vllm_renders(body["messages"]), tools=body.get("tools"), tokenize=False, add_generation_prompt=True,
            enable_thinking=False)
        trained = qwen3_tokenizer.decode(renderer.prompt_ids(conversation.visible(c), c.tools))
        assert served == trained + "<think>\n\n</think>\n\n"  # the opening every trained reply has
