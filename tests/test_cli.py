"""The command line, end to end over a real OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from http_fixtures import serving
from toolself.cli import DEMO_ANSWER, app, demo_docs
from toolself.models.scripted import ScriptedModel, call
from toolself.trajectory import read_jsonl

runner = CliRunner()


def research_config(**change) -> str:
    return json.dumps({"subgoal": "find the maker", "strategy": "search, then visit", "toolbox": ["search", "visit"],
                       "knowledge": "none", "context_mode": "basic", **change})


def test_run_shows_stages_and_actions_prints_the_answer_and_writes_the_trajectory(tmp_path):
    model = ScriptedModel([
        research_config(),
        call("search", query="Lumen kettle maker"),
        call("visit", locator="lumen-kettle.md"),
        call("reconfigure", summary="Brightwater Appliances makes the Lumen kettle", reason="maker found",
             next_subgoal="find the founder's birthplace"),
        research_config(subgoal="find the founder's birthplace", knowledge="history"),
        call("terminate", answer=DEMO_ANSWER),
    ])
    out = tmp_path / "t.jsonl"
    with serving(model) as url:
        result = runner.invoke(app, ["run", "Where was the founder born?", "--model", f"openai:scripted@{url}",
                                     "--docs", str(demo_docs()), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "stage 1" in result.output and "stage 2" in result.output and "1. search" in result.output
    assert "search" in result.output and "maker found" in result.output
    assert f"answer: '{DEMO_ANSWER}'" in result.output
    [trajectory] = read_jsonl(out)
    assert trajectory.answer == DEMO_ANSWER and len(trajectory.stages) == 2
    visit = trajectory.stages[0].steps[1]
    assert not visit.is_error and "Brightwater Appliances" in visit.observation


def test_an_unknown_method_is_a_clear_error():
    result = runner.invoke(app, ["run", "x", "--method", "telepathy"])
    assert result.exit_code == 2 and "unknown method 'telepathy'" in result.output


def test_run_refuses_request_options_for_a_model_no_server_reads_before_loading_it():
    result = runner.invoke(app, ["run", "x", "--request-options", '{"top_k": 20}'])
    assert result.exit_code == 2 and "go to a served model" in result.output
    assert "loading the model" not in result.output


def test_a_missing_docs_folder_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["run", "x", "--docs", str(tmp_path / "nope"), "--model", "openai:x@http://127.0.0.1:9/v1"])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())


def test_methods_lists_every_variant_and_ablation():
    result = runner.invoke(app, ["methods"])
    for name in ("toolself", "vanilla", "static:research", "static:general", "static:swe", "decoupled",
                 "toolself-freeze:knowledge"):
        assert name in result.output


# -- exit codes: a script can trust them, a person reads one line -----------------------------

def test_version_prints_the_package_version():
    from toolself import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"toolself {__version__}"


def test_a_run_whose_model_fails_exits_1_with_one_line_on_stderr(tmp_path):
    with serving(ScriptedModel([])) as url:  # a wrong path: HTTP 404, which no retry mends
        result = runner.invoke(app, ["run", "hi", "--model", f"openai:x@{url}/nothing", "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: the attempt failed:") and "404" in line
    assert "Traceback" not in result.output


def test_the_old_time_limit_option_still_works_with_a_warning(tmp_path):
    result = runner.invoke(app, ["run", "hi", "--time-limit", "5", "--max-stages", "1", "--model",
                                 "openai:x@http://127.0.0.1:9/v1", "--method", "nonsense"])
    assert "--time-limit is deprecated; it is --timeout" in result.stderr
    assert result.exit_code == 2 and "unknown method 'nonsense'" in result.stderr


def test_an_eval_whose_every_attempt_failed_exits_1(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "question": "Double 2?", "answer": "4"}) + "\n")
    with serving(ScriptedModel([])) as url:
        result = runner.invoke(app, ["eval", "-t", f"jsonl:{tasks}", "--methods", "vanilla", "-m",
                                     f"openai:x@{url}/nothing", "-o", str(tmp_path / "out"), "--no-report"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: every attempt of this run failed (1)")


def test_an_eval_whose_attempts_keep_failing_stops_exits_1_and_says_how_to_resume(tmp_path, monkeypatch):
    import shlex

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": "Double 2?", "answer": "4"}) + "\n"
                             for i in range(6)))
    with serving(ScriptedModel([])) as url:  # a wrong path: every attempt fails at once
        args = ["eval", "-t", f"jsonl:{tasks}", "--methods", "vanilla", "-m", f"openai:x@{url}/nothing", "-o",
                str(tmp_path / "out"), "--no-report", "--concurrency", "1", "--stop-after-errors", "2"]
        monkeypatch.setattr(sys, "argv", ["toolself", *args])
        result = runner.invoke(app, args)
    assert result.exit_code == 1
    *_, error, resume = result.stderr.strip().splitlines()
    assert error.startswith("error: 2 attempts in a row ended in an error, so the run stopped with 3 attempts "
                            "not started (the last error: ") and "404" in error
    assert resume == "to resume: " + shlex.join(["toolself", *args])


def test_eval_sends_its_request_options_with_every_request_and_records_them(tmp_path):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from http_fixtures import running_server

    received = []

    async def chat(request):  # answers every request by ending the attempt
        received.append(await request.json())
        call = {"id": "call_1", "type": "function", "function": {"name": "terminate", "arguments": '{"answer": "4"}'}}
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": "x", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
             "finish_reason": "tool_calls"}]})

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "question": "Double 2?", "answer": "4"}) + "\n")
    out = tmp_path / "out"
    with running_server(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])) as base:
        result = runner.invoke(app, ["eval", "-t", f"jsonl:{tasks}", "--methods", "vanilla", "-m",
                                     f"openai:x@{base}/v1", "-o", str(out), "--no-report", "--temperature", "0.6",
                                     "--request-options",
                                     '{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}'])
    assert result.exit_code == 0, result.output
    assert received and all(body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_k"] == 20
                            and body["temperature"] == 0.6 for body in received)
    recorded = json.loads((out / "run.json").read_text())["identity"]["model_options"]
    assert recorded["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20}


@pytest.mark.parametrize("args", [
    ["eval", "-t", "builtin:research", "--limit", "-2"],
    ["eval", "-t", "builtin:research", "--concurrency", "0"],
    ["eval", "-t", "builtin:research", "--repeats", "0"],
    ["eval", "-t", "nope:/x"],
    ["eval", "-t", "builtin:research", "-m", "local:/nonexistent/model"],
    ["eval", "-t", "builtin:research", "--request-options", '{"top_k": 20}'],  # the embedded model has no server
    ["eval", "-t", "builtin:research", "-m", "openai:x@http://127.0.0.1:9/v1", "--request-options", '{"seed": 1}'],
    ["eval", "-t", "builtin:research", "-m", "openai:x@http://127.0.0.1:9/v1", "--request-options", "top_k=20"],
])
def test_invalid_eval_options_are_refused_before_any_file_is_written(tmp_path, args):
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.exists()


def test_tasks_show_refuses_a_negative_limit_and_an_unknown_prefix():
    assert runner.invoke(app, ["tasks", "show", "builtin:research", "--limit", "-1"]).exit_code == 2
    result = runner.invoke(app, ["tasks", "show", "nope:/x"])
    assert result.exit_code == 2 and "unknown prefix 'nope'" in result.stderr and not result.stdout


def test_a_model_that_fails_to_load_leaves_no_run_file_to_block_the_corrected_rerun(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    out = tmp_path / "out"
    failed = runner.invoke(app, ["eval", "-t", "builtin:research", "--limit", "1", "-m",
                                 f"local:{tmp_path / 'not-a-model'}", "-o", str(out), "--no-report"])
    assert failed.exit_code != 0 and "Traceback" not in failed.output
    assert not (out / "run.json").exists()
    rerun = runner.invoke(app, ["eval", "-t", "builtin:research", "--limit", "1", "-m", "expert", "-o", str(out),
                                "--no-report"])
    assert rerun.exit_code == 0, rerun.output


def test_eval_outside_a_terminal_prints_a_progress_line_after_every_attempt(tmp_path):
    result = runner.invoke(app, ["eval", "-t", "builtin:research", "--limit", "3", "-m", "expert", "--methods",
                                 "vanilla", "--concurrency", "1", "-o", str(tmp_path / "out"), "--no-report"])
    assert result.exit_code == 0, result.output
    done = [line.split(" done")[0] for line in result.stderr.splitlines() if " done, " in line]
    assert done[:3] == ["1/3", "2/3", "3/3"]


def test_an_unexpected_failure_is_one_line_and_debug_shows_the_traceback(monkeypatch):
    import toolself.variants

    def broken():
        raise KeyError("planted")

    monkeypatch.setattr(toolself.variants, "methods", broken)
    monkeypatch.setenv("TOOLSELF_DEBUG", "0")  # recorded, so the 1 that --debug sets is undone after the test
    plain = runner.invoke(app, ["methods"])
    assert plain.exit_code == 1
    assert plain.stderr.strip() == "error: KeyError: 'planted' (toolself --debug ... shows where)"
    debug = runner.invoke(app, ["--debug", "methods"])
    assert isinstance(debug.exception, KeyError)


def test_the_command_exits_with_its_status_and_writes_errors_to_stderr():
    result = subprocess.run([sys.executable, "-m", "toolself", "tasks", "show", "nope:/x"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == "" and "unknown prefix" in result.stderr


# -- one name per concept, help and defaults on every option ----------------------------------

def every_option():
    import typer
    from typer.core import TyperOption

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield from ((" ".join(path), p) for p in command.params if isinstance(p, TyperOption))

    return list(walk(typer.main.get_command(app), ["toolself"]))


def test_every_option_of_every_command_has_help():
    missing = [f"{path} {p.opts[0]}" for path, p in every_option() if not p.hidden and not p.help]
    assert missing == []


def test_a_wall_clock_limit_is_called_timeout_in_every_command():
    names = {o for _, p in every_option() if not p.hidden for o in p.opts}
    assert "--timeout" in names and "--time-limit" not in names


def test_the_defaults_the_training_options_state_are_the_configs_own():
    import dataclasses

    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft_config import RFTConfig

    fields = {"--epochs": "num_train_epochs", "--lr": "learning_rate", "--batch-size": "per_device_train_batch_size",
              "--grad-accum": "gradient_accumulation_steps", "--max-steps": "max_steps", "--lora-r": "lora_r",
              "--beta": "beta"}
    for path, config in (("toolself train rft", RFTConfig), ("toolself train kto", CATKTOConfig)):
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        for command, option in every_option():
            if command == path and option.opts[0] in fields:
                stated = re.search(r"\(default: ([^,)]+)", option.help).group(1)
                assert float(stated) == defaults[fields[option.opts[0]]], (path, option.opts[0], stated)


def test_training_resumes_by_default_as_the_readme_says():
    resume = {command: p.default for command, p in every_option() if p.name == "resume"}
    assert resume == {"toolself train rft": True, "toolself train kto": True}


@pytest.mark.slow  # transformers and the embedded model's tokenizer
def test_train_data_warns_how_many_examples_max_length_cut(tmp_path):
    from toolself.evals.runner import run_eval

    run_eval(["builtin:research"], ["toolself"], "expert", tmp_path / "run", limit=1, progress=False)
    result = runner.invoke(app, ["train", "data", str(tmp_path / "run"), "--kind", "sft", "--max-length", "64"])
    assert result.exit_code == 0, result.output
    assert re.search(r"warning: --max-length 64 cut (\d+) of \1 examples from the left", result.stderr)


@pytest.mark.parametrize("option", ["--tools-config", "--mcp-config"])
def test_a_config_file_that_does_not_parse_is_named_in_the_error(tmp_path, option):
    config = tmp_path / "tools.json"
    config.write_text("garbage{")
    result = runner.invoke(app, ["tools", "list", option, str(config)])
    assert result.exit_code != 0
    assert f"{config}: not a valid JSON" in " ".join(result.stderr.split())


def test_a_file_of_mcp_servers_is_a_tools_config_in_every_command(tmp_path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    assert runner.invoke(app, ["tools", "list", "--tools-config", str(config)]).exit_code == 0
    old_name = runner.invoke(app, ["tools", "list", "--mcp-config", str(config)])
    assert old_name.exit_code == 0 and "--mcp-config is deprecated" in old_name.stderr
