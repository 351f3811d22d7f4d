"""Regression tests for what model-written code can do to the host, to other attempts and to
its own reward (issue 25). Each test plays an attack and asserts that the harm did not happen.

Tests that need each attempt to run as a uid of its own need a root host (CI runs as root) and
are skipped otherwise; the rest hold for an ordinary user too.
"""

import os
import secrets

import pytest

SECRET_NAMES = ("OPENAI_API_KEY", "HF_TOKEN")


@pytest.fixture
def host_secret(monkeypatch):
    """A credential in the host's environment, as a real deployment has one."""
    value = "sk-" + secrets.token_hex(16)
    for name in SECRET_NAMES:
        monkeypatch.setenv(name, value)
    return value
