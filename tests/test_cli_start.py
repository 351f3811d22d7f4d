"""Starting the command line: every invocation mounts every command, so what the mounting
imports is paid by `toolself --help` as much as by a run. The web client, the search index,
torch and the agent load when a command uses them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("httpx", "bm25s", "numpy", "torch", "transformers", "toolself.agent", "toolself.demo")

PROBE = """
import json, sys
from toolself.cli import app
try:
    app(sys.argv[1:], prog_name="toolself")
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "loaded": [m for m in HEAVY if m in sys.modules]}))
"""


def loaded_by(*args: str) -> dict:
    probe = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["demo", "--help"], ["eval", "--help"]])
def test_a_help_page_loads_no_web_client_search_index_torch_or_agent(args):
    seen = loaded_by(*args)
    assert seen == {"code": 0, "loaded": []}
