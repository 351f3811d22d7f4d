"""Loaders read the published formats from the real samples, report malformed rows, and build
environments that never leak between attempts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from toolself.evals.cli import tasks_app
from toolself.evals.loaders import load_tasks, parse_spec, xbench_decrypt, xbench_encrypt
from toolself.evals.rules.swebench import SweBenchEnvironmentMissing, swebench_verdict
from toolself.evals.scorers import score
from toolself.evals.task import Task
from toolself.tools.search import search
from toolself.tools.visit import visit

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples"
GAIA = Path(__file__).resolve().parent / "fixtures" / "gaia" / "2023" / "validation"


def sample(relative: str) -> Path:
    path = SAMPLES / relative
    if not path.exists():
        pytest.skip(f"the benchmark samples are not at {SAMPLES} (expected next to the repository, in shared/)")
    return path


# FRAMES -------------------------------------------------------------------------------------

def test_frames_sample_gives_prompt_answer_links_and_reasoning_types():
    tasks = load_tasks(f"frames:{sample('frames/test_sample.tsv')}")
    assert len(tasks) == 10 and not tasks.skipped
    first = tasks[0]
    assert first.family == "frames" and first.question.startswith("If my future wife")
    assert first.answer == "Jane Ballou"
    assert first.metadata["wiki_links"][1] == "https://en.wikipedia.org/wiki/James_Buchanan"
    assert first.metadata["reasoning_types"] == ["Multiple constraints"]
    assert first.metadata["scorer"] == "frames_judge"


def test_the_format_is_inferred_from_the_file_when_unambiguous():
    families = {name: load_tasks(str(sample(name)), limit=1)[0].family for name in (
        "frames/test_sample.tsv", "gsm8k/test_sample.jsonl", "hotpotqa/dev_sample.jsonl",
        "xbench_deepsearch/DeepSearch-2510_sample.csv", "swebench_lite/test_sample.json")}
    assert list(families.values()) == ["frames", "gsm8k", "hotpotqa", "xbench", "swebench"]
    assert load_tasks(str(GAIA))[0].family == "gaia"


def test_an_unrecognisable_file_asks_for_a_prefix(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt_text": "x", "label": 1}) + "\n")
    with pytest.raises(ValueError, match="prefix"):
        load_tasks(str(path))


def test_a_missing_path_fails_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        load_tasks(f"gsm8k:{tmp_path / 'nothing-here.jsonl'}")


# GSM8K, plain JSONL ------------------------------------------------------------------------

def test_gsm8k_answer_is_what_follows_the_hashes():
    tasks = load_tasks(f"gsm8k:{sample('gsm8k/test_sample.jsonl')}")
    assert len(tasks) == 20
    assert tasks[0].answer == "18" and "#### 18" in tasks[0].metadata["solution"]
    assert all(t.answer and "####" not in t.answer for t in tasks)


def test_malformed_rows_are_skipped_and_reported_by_file_and_line(tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join([
        json.dumps({"question": "2+2?", "answer": "4"}),
        "{not json",
        json.dumps({"answer": "5"}),
        json.dumps(["a", "list"]),
        json.dumps({"question": "3+3?", "answer": 6, "id": "six"}),
    ]) + "\n")
    tasks = load_tasks(f"jsonl:{path}")
    assert [t.id for t in tasks] == ["mine-1", "six"] and tasks[1].answer == "6"
    assert [(s.line, s.file) for s in tasks.skipped] == [(2, str(path)), (3, str(path)), (4, str(path))]
    assert "question" in tasks.skipped[1].reason
    err = capsys.readouterr().err
    assert "skipped 3 malformed row(s)" in err and f"{path}:2" in err.replace("\n", "")


def test_a_file_of_another_benchmark_is_refused_with_the_prefix_its_rows_suggest():
    path = sample("frames/test_sample.tsv")
    with pytest.raises(ValueError, match=f"none of its 10 row.s. is a gsm8k task .* try frames:{path}$"):
        load_tasks(f"gsm8k:{path}")


def test_a_file_whose_rows_are_all_malformed_is_refused_with_the_first_reason(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"answer": "5"}) + "\n" + "{not json\n")
    with pytest.raises(ValueError, match=f"none of its 2 row.s. is a jsonl task .first: {path}:1: missing field "
                                         "'question'.$"):
        load_tasks(f"jsonl:{path}")


def test_an_eval_of_a_file_of_another_benchmark_stops_before_writing_anything(tmp_path):
    from toolself.cli import app

    done = CliRunner().invoke(app, ["eval", "--tasks", f"hotpotqa:{sample('gsm8k/test_sample.jsonl')}",
                                    "--out", str(tmp_path / "run")])
    assert done.exit_code != 0 and "try gsm8k:" in " ".join(done.output.split())
    assert not (tmp_path / "run").exists()


def test_limit_takes_the_first_tasks_and_shuffle_uses_the_seed():
    path = sample("gsm8k/test_sample.jsonl")
    first = load_tasks(f"gsm8k:{path}", limit=3)
    assert [t.id for t in first] == ["gsm8k-1", "gsm8k-2", "gsm8k-3"]
    shuffled = [t.id for t in load_tasks(f"gsm8k:{path}?shuffle=1", limit=5, seed=7)]
    assert shuffled == [t.id for t in load_tasks(f"gsm8k:{path}?shuffle=1", limit=5, seed=7)]
    assert shuffled != [t.id for t in load_tasks(f"gsm8k:{path}?shuffle=1", limit=5, seed=8)]


def test_a_spec_splits_into_kind_target_and_options():
    spec = parse_spec("swebench:/data/lite.json?repo=/src/django&test_cmd=pytest {tests}")
    assert (spec.kind, spec.target, spec.options) == ("swebench", "/data/lite.json",
                                                      {"repo": "/src/django", "test_cmd": "pytest {tests}"})
    assert parse_spec("rows.jsonl").kind == ""


# HotpotQA ----------------------------------------------------------------------------------

def test_hotpotqa_paragraphs_become_the_tasks_own_collection():
    task = load_tasks(f"hotpotqa:{sample('hotpotqa/dev_sample.jsonl')}", limit=1)[0]
    assert task.answer == "Chief of Protocol" and len(task.documents) == 10
    assert sorted(task.metadata["supporting"]) == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    with task.environment() as env:
        results = search({"query": "Shirley Temple Chief of Protocol"}, env.context).content
        page = visit({"locator": "Shirley Temple"}, env.context).content
    assert "Shirley Temple" in results.splitlines()[0]
    assert "Chief of Protocol of the United States" in page


def test_hotpotqa_original_json_format(tmp_path):
    path = tmp_path / "hotpot_dev_distractor.json"
    path.write_text(json.dumps([{
        "_id": "q1", "question": "Which city is the capital of the country where the Vasa Museum is?",
        "answer": "Stockholm", "type": "bridge", "level": "hard",
        "supporting_facts": [["Vasa Museum", 0], ["Sweden", 0]],
        "context": [["Vasa Museum", ["The Vasa Museum is in Sweden."]],
                    ["Sweden", ["Sweden's capital is ", "Stockholm."]], ["Norway", ["Oslo is the capital."]]],
    }]))
    task = load_tasks(f"hotpotqa:{path}")[0]
    assert task.split == "validation" and task.level == "hard"
    assert task.documents[1] == {"id": "Sweden", "title": "Sweden", "text": "Sweden's capital is Stockholm."}
    assert task.metadata["supporting"] == ["Vasa Museum", "Sweden"]


# xbench-DeepSearch --------------------------------------------------------------------------

def test_xbench_sample_is_decrypted_with_each_rows_canary():
    tasks = load_tasks(f"xbench:{sample('xbench_deepsearch/DeepSearch-2510_sample.csv')}")
    assert [t.id for t in tasks] == ["xbench-101", "xbench-102", "xbench-103"]
    assert "世界卫生组织" in tasks[0].question and tasks[0].answer == "1.1"
    assert tasks[1].answer.startswith("Vidu4D")
    assert tasks[2].answer == "-1999" and tasks[0].metadata["reference_steps"].startswith("1.")


@settings(max_examples=50, deadline=None)
@given(plaintext=st.text(), canary=st.text(min_size=1))
def test_xbench_encryption_round_trips(plaintext, canary):
    assert xbench_decrypt(xbench_encrypt(plaintext, canary), canary) == plaintext


def test_an_xbench_row_that_does_not_decrypt_is_reported(tmp_path):
    path = tmp_path / "xbench.csv"
    good = [xbench_encrypt(t, "key-1") for t in ("What is 2+2?", "4", "add")]
    path.write_text("id,prompt,answer,reference_steps,canary\n"
                    f"1,{good[0]},{good[1]},{good[2]},key-1\n"
                    f"2,@@not-base64@@,{good[1]},,key-1\n")
    tasks = load_tasks(f"xbench:{path}", quiet=True)
    assert [t.question for t in tasks] == ["What is 2+2?"]
    assert tasks.skipped[0].line == 3 and "decrypt" in tasks.skipped[0].reason


# GAIA ----------------------------------------------------------------------------------------

def test_gaia_attachments_are_resolved_next_to_the_metadata():
    tasks = load_tasks(f"gaia:{GAIA}", quiet=True)
    assert [t.level for t in tasks] == [1, 2, 3]
    assert tasks[0].answer == "12" and tasks[0].split == "validation"
    assert "7f3c1e2a-inventory.csv" in tasks[0].question
    assert tasks[2].answer is None  # the test split hides answers as "?"
    with tasks[0].environment() as env:
        assert (env.workspace / "7f3c1e2a-inventory.csv").read_text().startswith("item,count")


def test_gaia_rows_without_question_or_attachment_are_reported():
    tasks = load_tasks(f"gaia:{GAIA / 'metadata.jsonl'}", quiet=True)
    assert [(s.line, s.reason) for s in tasks.skipped] == [
        (4, "missing field 'Question'"), (5, "attachment '9d191bce-slides.pptx' not found next to metadata.jsonl")]


def test_gaia_text_only_and_level_filters():
    assert [t.level for t in load_tasks(f"gaia:{GAIA}?text_only=1", quiet=True)] == [2, 3]
    assert [t.level for t in load_tasks(f"gaia:{GAIA}?level=2", quiet=True)] == [2]


def test_gaia_list_answer_is_scored_element_by_element():
    task = load_tasks(f"gaia:{GAIA}?level=2", quiet=True)[0]
    assert score(task, "Hydrogen; Oxygen").correct and not score(task, "oxygen, hydrogen").correct


# SWE-bench -----------------------------------------------------------------------------------

def test_swebench_sample_decodes_the_json_encoded_test_lists():
    tasks = load_tasks(f"swebench:{sample('swebench_lite/test_sample.json')}")
    assert [t.id for t in tasks] == ["django__django-15202", "django__django-17087", "sphinx-doc__sphinx-8721"]
    first = tasks[0]
    assert first.metadata["FAIL_TO_PASS"][0] == "test_urlfield_clean_invalid (forms_tests.field_tests.test_urlfield.URLFieldTest)"
    assert first.check_tests["FAIL_TO_PASS"] == first.metadata["FAIL_TO_PASS"] and first.metadata["scorer"] == "swebench"
    assert "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 forms_tests.field_tests.test_urlfield;" \
        in first.check_command
    assert "tox --current-env -epy39 -v -- tests/test_ext_viewcode.py;" in tasks[2].check_command
    assert tasks[2].check_command.startswith("git checkout -q HEAD -- tests/test_ext_viewcode.py && git apply")
    assert tasks[2].check_files[".toolself/test.patch"].startswith("diff --git")
    with pytest.raises(ValueError, match=r"\?repo="):
        first.environment()


def test_a_swebench_instance_without_its_python_environment_is_refused_with_what_it_needs(tmp_path):
    clone = tmp_path / "django"
    clone.mkdir()
    git(clone, "init", "-q")
    task = load_tasks(f"swebench:{sample('swebench_lite/test_sample.json')}?repo={tmp_path}", limit=1)[0]
    with pytest.raises(SweBenchEnvironmentMissing, match=r"Python 3\.9, .*envs=DIR"):
        task.environment(root=tmp_path / "ws")


def test_a_swebench_instance_runs_in_the_environment_given_for_it(tmp_path):
    env = tmp_path / "envs" / "django__django__4.1"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    task = load_tasks(f"swebench:{sample('swebench_lite/test_sample.json')}?envs={tmp_path / 'envs'}", limit=1)[0]
    assert task.metadata["environment"] == str(env) and task.setup.refusal is None
    assert task.check_command.startswith(f"export PATH={env / 'bin'}:")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def tiny_repo(tmp_path) -> tuple[Path, str]:
    """A real git repository with a bug at its base commit and a later, unrelated commit."""
    repo = tmp_path / "calc"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef double(x):\n    return 2 * x\n")
    (repo / "test_calc.py").write_text("import unittest\nfrom calc import double\n\n\nclass TestDouble(unittest.TestCase):\n"
                                       "    def test_double(self):\n        self.assertEqual(double(3), 6)\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "later.txt").write_text("after the base commit\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "later")
    return repo, base


TEST_PATCH = """diff --git a/test_add.py b/test_add.py
new file mode 100644
--- /dev/null
+++ b/test_add.py
@@ -0,0 +1,7 @@
+import unittest
+from calc import add
+
+
+class TestAdd(unittest.TestCase):
+    def test_add(self):
+        self.assertEqual(add(2, 3), 5)
"""


def test_swebench_environment_holds_the_base_commit_and_the_log_decides_each_listed_test(tmp_path, tiny_repo):
    repo, base = tiny_repo
    path = tmp_path / "lite.jsonl"
    path.write_text(json.dumps({
        "instance_id": "calc__calc-1", "repo": "calc/calc", "base_commit": base, "problem_statement": "add subtracts",
        "test_patch": TEST_PATCH, "patch": "", "FAIL_TO_PASS": json.dumps(["test_add.py::TestAdd::test_add"]),
        "PASS_TO_PASS": "[]", "version": "1.0",
    }) + "\n")
    spec = f"swebench:{path}?repo={tmp_path}&test_cmd=python -m pytest -rA -p no:cacheprovider&log_parser=pytest-dev/pytest"
    task = load_tasks(spec)[0]

    def check(workspace: Path):
        for relative, content in task.check_files.items():
            (workspace / relative).parent.mkdir(parents=True, exist_ok=True)
            (workspace / relative).write_text(content)
        log = subprocess.run(["bash", "-c", task.check_command], cwd=workspace, capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        return swebench_verdict(task, log.stdout + log.stderr)

    with task.environment() as env:
        assert (env.workspace / "calc.py").exists() and not (env.workspace / "later.txt").exists()
        assert not (env.workspace / "test_add.py").exists()  # the test patch is the grader's, as officially
        assert git(env.workspace, "log", "--all", "--format=%s") == f"base {base}"  # no later history
        (env.workspace / "test_add.py").write_text("")  # a stand-in for the grader's test is replaced
        before = check(env.workspace)
        source = env.workspace / "calc.py"
        source.write_text(source.read_text().replace("a - b", "a + b"))
        after = check(env.workspace)
    assert task.check_command.startswith("rm -f -- test_add.py && git apply")
    assert "python -m pytest -rA -p no:cacheprovider test_add.py;" in task.check_command  # the patch's files only
    assert not before.correct and before.scorer == "swebench" and "FAIL_TO_PASS 0/1" in before.reason
    assert after.correct and "FAIL_TO_PASS 1/1, PASS_TO_PASS 0/0" in after.reason
    assert git(repo, "status", "--porcelain") == "" and "later.txt" in git(repo, "ls-files")


# environments and the CLI ------------------------------------------------------------------

def test_each_environment_is_a_fresh_private_copy_removed_on_close(tmp_path):
    source = tmp_path / "data"
    source.mkdir()
    (source / "table.csv").write_text("a,b\n1,2\n")
    task = Task(id="t/1", question="q", files=[source], inline_files={"notes/readme.txt": "hello"})
    first, second = task.environment(root=tmp_path / "ws"), task.environment(root=tmp_path / "ws")
    (first.workspace / "table.csv").write_text("changed")
    assert (second.workspace / "table.csv").read_text() == "a,b\n1,2\n"
    assert (second.workspace / "notes" / "readme.txt").read_text() == "hello"
    assert (source / "table.csv").read_text() == "a,b\n1,2\n"
    first.close()
    second.close()
    assert not first.workspace.exists() and not second.workspace.exists()


def test_an_inline_file_cannot_escape_the_workspace(tmp_path):
    task = Task(id="t", question="q", inline_files={"../outside.txt": "x"})
    with pytest.raises(ValueError, match="escapes"):
        task.environment(root=tmp_path / "ws")
    assert not (tmp_path / "outside.txt").exists()


def test_tasks_show_prints_examples():
    result = CliRunner().invoke(tasks_app, ["show", "builtin:research", "--split", "heldout", "--limit", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("research-heldout-0-") == 3 and "answer:" in result.output


def test_tasks_show_json_and_errors():
    result = CliRunner().invoke(tasks_app, ["show", "builtin:data", "--limit", "1", "--json"])
    record = json.loads(result.output)
    assert record["family"] == "data" and record["answer"].isdigit()
    missing = CliRunner().invoke(tasks_app, ["show", "gsm8k:/nonexistent/file.jsonl"])
    assert missing.exit_code == 2 and "no file" in missing.output


def test_swebench_parquet_reads_like_the_json(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    rows = json.loads(sample("swebench_lite/test_sample.json").read_text())
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test-00000-of-00001.parquet")
    tasks = load_tasks(str(tmp_path / "test-00000-of-00001.parquet"))
    assert [t.id for t in tasks] == [r["instance_id"] for r in rows] and tasks[0].family == "swebench"
