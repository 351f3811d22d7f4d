"""`train cat --vllm`: the pipeline's on-policy collection and evaluations reach the trained
adapters through vLLM servers, one at a time, each stopped before the next starts.

The servers are `tests/vllm_standin.py`: toolself's engine behind an OpenAI-compatible server
that takes `vllm serve`'s arguments, routes by model name as vLLM does, and notes in a ledger
when each server ran. The adapters are real LoRA adapters on a random-initialised tiny model.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from lora_adapters import random_lora_adapter  # noqa: E402
from ports import free_port  # noqa: E402
from vllm_standin import standin_executable  # noqa: E402
from toolself.train import served as S  # noqa: E402


@pytest.fixture
def vllm(tmp_path, monkeypatch) -> Path:
    """An executable that runs as `vllm serve ...` would, with its ledger in tmp_path."""
    monkeypatch.setenv("STANDIN_LEDGER", str(tmp_path / "ledger.jsonl"))
    return standin_executable(tmp_path)


def ledger(tmp_path: Path) -> list[tuple[str, str]]:
    return [(e["event"], e["names"][-1]) for e in map(json.loads, (tmp_path / "ledger.jsonl").read_text().splitlines())]


@pytest.mark.slow
def test_the_policy_collection_and_the_evaluations_go_through_one_server_at_a_time(tmp_path, tiny, vllm):
    from toolself.evals.records import read_records
    from toolself.train.merge import prepare_base
    from toolself.train.pipeline import CATSettings, run_step

    out = tmp_path / "cat"
    trained_on = shutil.copytree(tiny, tmp_path / "node-a" / "student")
    random_lora_adapter(trained_on, out / "rft", seed=1)
    random_lora_adapter(prepare_base(out / "rft", out / "kto"), out / "kto", seed=2)  # KTO on the merged RFT model
    student = shutil.move(trained_on, tmp_path / "node-b-mount")  # the run resumed where it is mounted elsewhere
    settings = CATSettings(tasks=["builtin:research?hops=2"], student=str(student), limit=1, policy_samples=1,
                           eval_limit=1, concurrency=1, timeout=300, max_length=512,
                           agent={"max_stages": 2, "max_steps_per_stage": 2})
    server = S.AdapterServer(str(vllm), free_port(), startup_seconds=120)

    collected = run_step(settings, out, "collect_policy", server=server)
    assert collected["attempts"] == 1
    evaluated = run_step(settings, out, "evaluate", server=server)
    assert set(evaluated) == {"student", "rft", "kto"}

    assert ledger(tmp_path) == [("start", "rft"), ("stop", "rft"), ("start", "rft"), ("stop", "rft"),
                                ("start", "kto"), ("stop", "kto")]
    models = {name: json.loads((out / folder / "run.json").read_text())["last_command"]["served_at"]["model"]
              for name, folder in (("policy", "collect/policy"), ("student", "eval/student"), ("rft", "eval/rft"),
                                   ("kto", "eval/kto"))}
    assert models["policy"] == models["rft"] == f"openai:rft@{server.url}"
    assert models["student"] == f"openai:student@{server.url}"  # the base, by a name its mount cannot change
    assert models["kto"] == f"openai:kto@{server.url}"
    for folder in ("collect/policy", "eval/student", "eval/rft", "eval/kto"):  # decoded as their data renders
        options = json.loads((out / folder / "run.json").read_text())["identity"]["model_options"]
        assert options["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
        assert all(r.status != "error" for r in read_records(out / folder / "toolself"))
    assert not list(out.glob("vllm-*.pid")) and (out / "vllm-kto.log").is_file()


def test_an_adapter_of_a_rank_vllm_has_no_setting_for_is_served_under_the_next_one_up(tmp_path, tiny, vllm):
    # vLLM's --max-lora-rank takes 1, 8, 16, 32, ... 512 only, and any other value fails its start
    adapter = tmp_path / "rft"
    random_lora_adapter(tiny, adapter, seed=1, rank=24)
    with S.AdapterServer(str(vllm), free_port()).serving("rft", adapter, tmp_path):
        pass  # started: the stand-in, as vLLM, exits at once on a --max-lora-rank of 24
    assert ledger(tmp_path) == [("start", "rft"), ("stop", "rft")]
    assert [S.max_lora_rank(r) for r in (1, 4, 16, 17, 320, 512)] == [1, 8, 16, 32, 320, 512]
    with pytest.raises(S.ServerError, match="rank 1024: vLLM serves LoRA adapters of rank 512 at most"):
        S.max_lora_rank(1024)


def test_a_server_that_exits_while_starting_is_reported_with_its_log(tmp_path, tiny):
    adapter = tmp_path / "rft"
    random_lora_adapter(tiny, adapter, seed=1)
    failing = tmp_path / "vllm"
    failing.write_text("#!/bin/sh\necho 'CUDA out of memory' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(S.ServerError, match="exited while starting .exit code 1.: see .*vllm-rft.log"):
        with S.AdapterServer(str(failing), free_port()).serving("rft", adapter, tmp_path):
            pass
    assert "CUDA out of memory" in (tmp_path / "vllm-rft.log").read_text()
    assert not list(tmp_path.glob("vllm-*.pid"))


CRASHING_SERVER = """#!{python}
import http.server, json, os, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # up: it lists its models
        body = json.dumps({{"object": "list", "data": [{{"id": "rft", "object": "model"}}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # then dies at the first completion, as an engine that hits a CUDA fault
        print("CUDA error: an illegal memory access was encountered", flush=True)
        os._exit(3)

port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_a_server_that_dies_during_the_collection_leaves_the_step_unfinished_and_names_its_log(tmp_path, tiny):
    from toolself.evals.runner import AttemptsFailing
    from toolself.train.pipeline import CATSettings, run_step

    out = tmp_path / "cat"
    random_lora_adapter(tiny, out / "rft", seed=1)
    crashing = tmp_path / "vllm"
    crashing.write_text(CRASHING_SERVER.format(python=sys.executable))
    crashing.chmod(0o755)
    settings = CATSettings(tasks=["builtin:research?hops=2"], student=str(tiny), limit=1, policy_samples=1,
                           concurrency=1, timeout=300, max_length=512)
    with pytest.raises(AttemptsFailing, match=r"(?s)every one of the 1 attempts .*ended in an error.*"
                                              r"The vLLM server of rft had exited \(exit code 3\): see .*vllm-rft.log"):
        run_step(settings, out, "collect_policy", server=S.AdapterServer(str(crashing), free_port()))
    assert "illegal memory access" in (out / "vllm-rft.log").read_text()
    assert not list(out.glob("vllm-*.pid"))


def test_a_server_a_killed_step_left_running_is_stopped_before_the_next_starts(tmp_path):
    import subprocess

    left = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (tmp_path / "vllm-rft.pid").write_text(str(left.pid))
    S.stop_servers(tmp_path)
    assert left.wait(timeout=10) == -15 and not list(tmp_path.glob("vllm-*.pid"))


def test_train_cat_refuses_a_vllm_command_that_is_not_there(tmp_path):
    from typer.testing import CliRunner

    from toolself.cli import app

    result = CliRunner().invoke(app, ["train", "cat", "-t", "builtin:research", "-o", str(tmp_path / "cat"),
                                      "--vllm", str(tmp_path / "no-vllm")])
    assert result.exit_code == 2 and "no such command" in result.output + result.stderr
    assert not (tmp_path / "cat").exists()


def test_train_cat_refuses_a_lora_rank_vllm_cannot_serve_before_it_trains(tmp_path, vllm):
    from typer.testing import CliRunner

    from toolself.cli import app

    result = CliRunner().invoke(app, ["train", "cat", "-t", "builtin:research", "-o", str(tmp_path / "cat"),
                                      "--vllm", str(vllm), "--kto-options", '{"lora_r": 1024}'])
    assert result.exit_code == 2
    assert "--kto-options: LoRA rank 1024: vLLM serves LoRA adapters of rank 512 at most" in \
        " ".join((result.output + result.stderr).split())
    assert not (tmp_path / "cat").exists()
