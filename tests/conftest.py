"""Fixtures that several test files share."""

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
