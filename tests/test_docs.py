"""The docs cannot drift: every code block of README.md and docs/ runs here, in the order of
its document, in a fresh folder, or is marked in its info string with why it cannot
(```bash gpu) and is then checked for shell syntax and for commands, options, scripts and
make targets that no longer exist.

A block's info string is its language, then at most one marker:
- none: runs in the fast tests; `slow`: runs in the slow ones (it needs the embedded model);
- `setup` (builds the environment itself), `server` (needs a model or MCP server the reader
  runs), `gpu`, `cluster`, `container`, `long` (training, benchmarks, a full evaluation: longer
  than a test), `placeholder` (inputs the reader fills in), `fragment` (part of a command):
  parsed and checked only;
- `experiment`: the command line of a past experiment, with options the code has since lost
  (the doc says so): its syntax is checked, its names are not.
A Python block whose first line is `# NAME.py` is that file: it is written, then run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from markdown_it import MarkdownIt

from toolself.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"bash", "python", "text", "json", "toml", "yaml"}
RUNS = {None, "slow"}
CHECKED_ONLY = {"setup", "server", "gpu", "cluster", "container", "long", "placeholder", "fragment", "experiment"}


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    marker: str | None
    code: str

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def file_name(self) -> str | None:
        match = re.match(r"# (\w+\.py)\n", self.code)
        return match.group(1) if self.language == "python" and match else None


def blocks_of(document: Path) -> list[Block]:
    found = []
    for token in MarkdownIt().parse(document.read_text(encoding="utf-8")):
        if token.type == "code_block":  # indented: no info string, so no marker
            found.append(Block(document, token.map[0] + 1, "", "unmarked", token.content))
        elif token.type == "fence":
            language, *rest = token.info.split() or [""]
            found.append(Block(document, token.map[0] + 1, language, rest[0] if rest else None, token.content))
    return found


ALL = [b for d in DOCUMENTS for b in blocks_of(d)]
CHECKED = [b for b in ALL if b.language == "bash" and b.marker in CHECKED_ONLY]
DOCUMENTS_THAT_RUN = [d for d in DOCUMENTS if any(b.marker is None and b.language in ("bash", "python")
                                                  for b in blocks_of(d))]


def test_every_block_is_fenced_with_a_known_language_and_marker():
    wrong = [f"{b.name}: {b.language or 'indented'} {b.marker or ''}".strip() for b in ALL
             if b.language not in LANGUAGES or (b.marker not in RUNS | CHECKED_ONLY and b.language != "text")]
    assert not wrong, "blocks to fence or mark:\n" + "\n".join(wrong)


# -- blocks that cannot run: syntax, and names the code still has -----------------------------

def commands(code: str) -> list[list[str]]:
    """Simple commands of a shell script, as words (continuations joined, comments dropped)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # a quote spanning lines (a JSON option): its first line names the command
        current: list[str] = []
        for word in words + [";"]:
            if word in (";", "&&", "||", "|", "&", "do", "then", "done", "fi"):
                if current:
                    out.append(current)
                current = []
            else:
                current.append(word)
    return out


def toolself_invocation(words: list[str]) -> list[str] | None:
    """The words after `toolself` (also `python -m toolself`, `accelerate launch ... -m toolself`)."""
    for i, word in enumerate(words):
        if word == "toolself" and (i == 0 or words[i - 1] in ("-m", "toolself-image")):
            return words[i + 1:]
    return None


def unknown_options(words: list[str]) -> list[str]:
    command = typer.main.get_command(app)
    path = ["toolself"]
    rest = list(words)
    while rest and hasattr(command, "commands") and rest[0] in command.commands:
        command = command.commands[rest[0]]
        path.append(rest.pop(0))
    if hasattr(command, "commands"):
        return [f"{' '.join(path)}: no sub-command {rest[:1]}"] if rest and not rest[0].startswith("-") else []
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    wrong = []
    for word in rest:
        option = word.split("=", 1)[0]
        if re.fullmatch(r"--[a-z][a-z0-9-]*|-[a-zA-Z]", option) and option not in known:
            wrong.append(f"{' '.join(path)} {option}")
    return wrong


def problems_of(block: Block) -> list[str]:
    problems = []
    syntax = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=30)
    if syntax.returncode != 0:
        problems.append(syntax.stderr.strip())
    if block.marker == "experiment":
        return problems
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for words in commands(block.code):
        invocation = toolself_invocation(words)
        if invocation is not None:
            problems += unknown_options(invocation)
        elif words[0] == "make":
            problems += [f"make {t}: no such target" for t in words[1:] if t not in targets]
        elif words[0] == "python" and len(words) > 1 and words[1].startswith("benchmarks/"):
            script = ROOT / words[1]
            if not script.is_file():
                problems.append(f"{words[1]}: no such script")
                continue
            source = script.read_text(encoding="utf-8")
            problems += [f"{words[1]} {w}" for w in words[2:]
                         if w.startswith("--") and f'"{w.split("=")[0]}"' not in source]
    return problems


@pytest.mark.parametrize("block", CHECKED, ids=lambda b: b.name)
def test_a_block_that_cannot_run_parses_and_names_what_still_exists(block):
    assert problems_of(block) == []


def served_cat_models_that_may_think(block: Block) -> list[str]:
    """`toolself eval` commands of a block whose model is a served RFT or KTO adapter
    (`openai:rft@...`, `openai:kto@...`, also through a variable the block sets) sent without
    `--request-options` or `--preset paper`."""
    assigned: dict[str, str] = {}
    found = []
    for words in commands(block.code):
        if len(words) == 1 and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words[0].partition("=")
            assigned[name] = value
        invocation = toolself_invocation(words) or []
        if invocation[:1] != ["eval"]:
            continue
        models = [re.sub(r"\$\{?(\w+)\}?", lambda m: assigned.get(m.group(1), m.group(0)), w)
                  for flag, w in zip(invocation, invocation[1:]) if flag in ("-m", "--model")]
        if any(re.match(r"openai:(rft|kto)@", m) for m in models) and "--request-options" not in invocation \
                and "paper" not in invocation:
            found.append(f"{block.name}: {' '.join(words)[:120]}")
    return found


def test_every_documented_evaluation_of_a_served_cat_model_asks_it_not_to_think():
    """Under toolself's protocol the data keeps no reasoning, and served Qwen3 thinks unless asked
    not to (training.md, "Serving a trained adapter"); a CAT model that thinks decodes otherwise
    than it was trained, and KTO would train on replies without the reasoning it wrote."""
    assert [line for b in CHECKED for line in served_cat_models_that_may_think(b)] == []
    stale = Block(ROOT / "docs" / "scaling.md", 1, "bash", "gpu",
                  'POLICY="openai:rft@http://127.0.0.1:8000/v1"\ntoolself eval -t builtin:research -m "$POLICY"\n')
    assert len(served_cat_models_that_may_think(stale)) == 1


def test_the_checks_catch_a_renamed_option_a_missing_target_and_bad_syntax():
    stale = Block(ROOT / "README.md", 1, "bash", "long",
                  "toolself eval --tasks builtin:research --time-limit 5\nmake nothing\nfor x in; do\n")
    problems = problems_of(stale)
    assert "toolself eval --time-limit" in problems
    assert "make nothing: no such target" in problems
    assert any("syntax error" in p for p in problems)


# -- blocks that run ---------------------------------------------------------------------------

def run_blocks(document: Path, folder: Path, markers: set[str | None]) -> None:
    """Run the blocks of `document` with a marker in `markers`, in order, in `folder`, where
    the repository's `toolself/` is reachable as in a checkout (`--docs toolself/data/demo`)."""
    (folder / "toolself").symlink_to(ROOT / "toolself")
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "120"}
    env.pop("TOOLSELF_DEBUG", None)
    for block in blocks_of(document):
        if block.marker not in markers or block.language not in ("bash", "python"):
            continue
        if block.language == "python":
            script = folder / (block.file_name or f"block_{block.line}.py")
            script.write_text(block.code, encoding="utf-8")
            argv = [sys.executable, script.name]
        else:
            argv = ["bash", "-euo", "pipefail", "-c", block.code]
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("document", DOCUMENTS_THAT_RUN, ids=lambda d: str(d.relative_to(ROOT)))
def test_the_blocks_of_a_document_run_in_order(document, tmp_path):
    run_blocks(document, tmp_path, {None})


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(b.marker == "slow" for b in blocks_of(d))],
                         ids=lambda d: str(d.relative_to(ROOT)))
def test_the_slow_blocks_of_a_document_run_after_the_others(document, tmp_path):
    run_blocks(document, tmp_path, {None, "slow"})
