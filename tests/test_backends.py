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


def test_the_cli_backend_option_refuses_an_address_without_ray():
    from toolself.evals.eval_cli import backend_option

    assert isinstance(backend_option("local"), LocalBackend)
    with pytest.raises(ValueError, match="--address is for --backend ray"):
        backend_option("local", "auto")
    with pytest.raises(ValueError, match="unknown backend"):
        backend_option("slurm")


def test_the_cli_backend_option_without_ray_says_how_to_install_it(monkeypatch):
    from toolself.evals.eval_cli import backend_option

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'toolself\[ray\]'"):
        backend_option("ray", "auto")


def test_train_collection_commands_take_the_backend_option(tmp_path):
    from typer.testing import CliRunner

    from toolself.train.cli import train_app

    for command in ("rft", "cat"):
        result = CliRunner().invoke(train_app, [command, "-t", "builtin:research", "-o", str(tmp_path / command),
                                                "--backend", "slurm"])
        assert result.exit_code == 2 and "unknown backend" in result.output, result.output
