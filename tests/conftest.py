"""Fixtures that several test files share."""

import os

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.sandbox import with_limits


@pytest.fixture
def sandbox_timeout() -> float:
    """Seconds one sandboxed call of `ctx` may run; a file whose calls need longer overrides it."""
    return 5


@pytest.fixture
def ctx(sandbox_timeout):
    """A fresh temporary workspace under the sandbox's limits, removed after the test."""
    context = ToolContext.temporary()
    with_limits(context, timeout_s=sandbox_timeout)
    yield context
    context.close()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A random-initialised model directory of the `tiny` shape, with the default tokenizer."""
    from toolself.models.weights import MissingWeightsError
    from toolself.train.shapes import random_model_dir

    try:
        return random_model_dir("tiny", tmp_path_factory.mktemp("tiny") / "model")
    except MissingWeightsError as exc:  # the tokenizer is the default model's
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_attempts(tmp_path_factory):
    """The expert teacher's scored attempts at two 2-hop research tasks, saved as a trajectory
    file with its tool schemas beside it (what `--trajectories` takes); returns (attempts, schemas, path)."""
    import json

    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool
    from toolself.train import data as D
    from toolself.train.collect import TOOLS_FILE
    from toolself.trajectory import write_jsonl

    pool = default_pool()
    attempts = scored_attempts("builtin:research?hops=2", limit=2, noises=(0.0,), pool=pool)
    schemas = D.tool_schemas(pool)
    path = tmp_path_factory.mktemp("attempts") / "attempts.jsonl"
    write_jsonl(path, attempts, append=False)
    (path.parent / TOOLS_FILE).write_text(json.dumps(schemas) + "\n", encoding="utf-8")
    return attempts, schemas, path


@pytest.fixture(scope="session")
def tiny_sft(tiny, tiny_attempts, tmp_path_factory):
    """RFT data of `tiny_attempts` for the `tiny` model, built in memory and saved; returns (dataset, path)."""
    from transformers import AutoTokenizer

    from toolself.train import data as D

    attempts, schemas, _ = tiny_attempts
    dataset, _ = D.build_sft_dataset(attempts, D.Renderer(AutoTokenizer.from_pretrained(str(tiny)), schemas),
                                     max_length=256)
    path = tmp_path_factory.mktemp("sft") / "data"
    dataset.save_to_disk(str(path))
    return dataset, path


def pytest_configure(config):
    """The built-in suites' tasks depend on a key made at random for each user on first use, so
    a test that names a task's content would pass on one machine and fail on the next: the
    tests see the published tasks. A test of the key itself sets or removes the variable."""
    from toolself.evals.suites.common import KEY_VARIABLE, PUBLIC_KEY

    os.environ[KEY_VARIABLE] = PUBLIC_KEY
    keep_to_this_workers_cores()


def keep_to_this_workers_cores() -> None:
    """Under pytest-xdist each worker keeps to its own share of the cores, and so does every
    process it starts. The engine and torch size their threads from the cores a process may use:
    unpinned, two workers that both compute would run four threads on two cores. One test at a
    time left a third of two cores idle (a command's imports, the agent loop between decode steps
    and Chromium run on one thread); two tests, a core each, keep both busy without contending
    (docs/notes/2026-12-07-the-slow-tests-on-a-core-each.md)."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or workers < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= workers:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % workers::workers])
