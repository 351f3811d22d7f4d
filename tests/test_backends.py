"""Choosing where attempts execute."""

from __future__ import annotations

import sys

import pytest

from toolself.evals.backends import LocalBackend, RayBackend, import_ray, make_backend


def test_backend_specs_name_local_threads_or_a_ray_cluster():
    assert isinstance(make_backend("local"), LocalBackend)
    assert make_backend("ray") == RayBackend(address=None)
    assert make_backend("ray:auto") == RayBackend(address="auto")
    assert make_backend("ray:ray://head:10001").address == "ray://head:10001"
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("dask")


def test_the_ray_backend_without_ray_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ImportError, match=r"pip install 'toolself\[ray\]'"):
        import_ray()
