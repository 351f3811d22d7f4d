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
    from toolself.models.local import MissingWeightsError
    from toolself.train.shapes import random_model_dir

    try:
        return random_model_dir("tiny", tmp_path_factory.mktemp("tiny") / "model")
    except MissingWeightsError as exc:  # the tokenizer is the default model's
        pytest.skip(str(exc))


def pytest_configure(config):
    """The built-in suites' tasks depend on a key made at random for each user on first use, so
    a test that names a task's content would pass on one machine and fail on the next: the
    tests see the published tasks. A test of the key itself sets or removes the variable."""
    from toolself.evals.suites.common import KEY_VARIABLE, PUBLIC_KEY

    os.environ[KEY_VARIABLE] = PUBLIC_KEY
