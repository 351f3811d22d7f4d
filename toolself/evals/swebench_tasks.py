"""SWE-bench (Lite) tasks from the dataset's rows and the user's local clones.

An attempt's workspace holds the clone's tree at the instance's `base_commit` and nothing else
of the clone (see `SweBenchSetup`); the test patch stays out of the attempt's sight and is
applied by the check, which runs the repository's tests in the instance's environment (see
`toolself.evals.rules.swebench`). Apart from the other loaders because only this one reaches
beyond the dataset's own folder: the clones, the environments, git.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolself.evals.rules.swebench import (TEST_PATCH_FILE, SweBenchEnvironmentMissing, environment_name,
                                           instance_spec, require_environment, swebench_check_command)
from toolself.evals.task import Task
from toolself.evals.task_rows import RowError, SkippedRow, each_row, require_fields, split_for


def _test_list(value: Any, name: str) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as exc:
        raise RowError(f"{name} is not a JSON-encoded list ({exc.msg})") from None
    if not isinstance(parsed, list):
        raise RowError(f"{name} is not a list")
    return [str(v) for v in parsed]


@dataclass
class SweBenchSetup:
    """Puts the tree of `base_commit` of a local clone into the workspace as a fresh one-commit
    repository (so `git diff` shows the attempt's changes).

    Only the tree is exported (`git archive`): no object is shared with the user's clone, so
    nothing the attempt does can touch it, and no later commit (which may hold the fix) is
    visible. As in the official harness, the test patch is not shown to the attempt: it is
    applied by the check (see `swebench_check_command`)."""

    clone: Path | None
    base_commit: str
    instance_id: str
    refusal: str | None = None

    def __call__(self, workspace: Path) -> None:
        if self.clone is None:
            raise ValueError(f"{self.instance_id}: SWE-bench tasks need a local clone: add ?repo=PATH to the spec")
        if self.refusal:
            raise SweBenchEnvironmentMissing(self.refusal)

        def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
            result = subprocess.run(args, cwd=workspace, capture_output=True, **kwargs)
            if result.returncode != 0:
                error = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else result.stderr
                raise RuntimeError(f"{self.instance_id}: {' '.join(args[:4])} failed: {error.strip()[-500:]}")
            return result

        archive = subprocess.Popen(["git", "-c", f"safe.directory={self.clone}", "-C", str(self.clone), "archive",
                                    "--format=tar", self.base_commit], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        run(["tar", "-x", "-f", "-"], stdin=archive.stdout)
        archive.stdout.close()
        if archive.wait() != 0:
            raise RuntimeError(f"{self.instance_id}: git archive {self.base_commit} failed: "
                               f"{archive.stderr.read().decode(errors='replace').strip()[-500:]}")
        identity = ["-c", "user.name=toolself", "-c", "user.email=toolself@localhost"]
        run(["git", "init", "-q"])
        run(["git", "add", "-A"])
        run(["git", *identity, "commit", "-q", "--no-verify", "-m", f"base {self.base_commit}"])


def _find_clone(root: Path | None, repo: str) -> Path | None:
    if root is None:
        return None
    if (root / ".git").exists():
        return root
    owner, _, name = repo.partition("/")
    for candidate in (root / repo.replace("/", "__"), root / name, root / owner / name):
        if (candidate / ".git").exists():
            return candidate
    return None


def _find_environment(envs: Path | None, instance_id: str, repo: str, version: str | None) -> Path | None:
    if envs is None:
        return None
    for candidate in (envs / instance_id, envs / environment_name(repo, version)):
        if (candidate / "bin" / "python").exists():
            return candidate
    return None


def load_swebench(path: Path, split: str | None, options: dict[str, str], skipped: list[SkippedRow]) -> list[Task]:
    split_name = split_for(path, split)
    root = Path(options["repo"]).expanduser().resolve() if options.get("repo") else None
    if root is not None and not root.exists():
        raise FileNotFoundError(f"{path}: no clone at {root}")
    envs = Path(options["envs"]).expanduser().resolve() if options.get("envs") else None
    if envs is not None and not envs.is_dir():
        raise FileNotFoundError(f"{path}: no environments folder at {envs}")

    def make(line: int, record: dict[str, Any]) -> Task:
        instance_id, repo, base_commit, problem = require_fields(record, "instance_id", "repo", "base_commit",
                                                                 "problem_statement")
        fail_to_pass = _test_list(record.get("FAIL_TO_PASS", "[]"), "FAIL_TO_PASS")
        pass_to_pass = _test_list(record.get("PASS_TO_PASS", "[]"), "PASS_TO_PASS")
        if not fail_to_pass:
            raise RowError("FAIL_TO_PASS is empty")
        test_patch = str(record.get("test_patch") or "")
        if not test_patch.strip():
            raise RowError("test_patch is empty")
        clone = _find_clone(root, str(repo))
        if root is not None and clone is None:
            raise RowError(f"no clone of {repo} under {root}")
        version = None if record.get("version") is None else str(record["version"])
        if instance_spec(str(repo), version) is None and not options.get("test_cmd"):
            raise RowError(f"no official SWE-bench spec for {repo} {version}: give test_cmd= and log_parser=")
        environment = _find_environment(envs, str(instance_id), str(repo), version)
        question = (f"Resolve this issue in the repository {repo} (checked out in your workspace):\n\n"
                    f"{str(problem).strip()}")
        task = Task(id=str(instance_id), question=question, answer=None, family="swebench", split=split_name,
                    metadata={"repo": repo, "base_commit": base_commit, "version": version,
                              "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass,
                              "test_patch": test_patch, "gold_patch": record.get("patch"), "scorer": "swebench",
                              "environment": str(environment) if environment else None,
                              "test_cmd": options.get("test_cmd"), "log_parser": options.get("log_parser")},
                    check_files={TEST_PATCH_FILE: test_patch}, check_timeout=900.0,
                    check_tests={"FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass})
        task.check_command = swebench_check_command(task)
        try:
            require_environment(task)
            refusal = None
        except SweBenchEnvironmentMissing as exc:
            refusal = str(exc)
        task.setup = SweBenchSetup(clone, str(base_commit), str(instance_id), refusal)
        return task

    return each_row(path, skipped, make)
