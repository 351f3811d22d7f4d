"""The wheel users install from PyPI holds every file the package reads at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "pyproject.toml", "README.md", "LICENSE", "toolself"], cwd=ROOT,
                            capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


@pytest.mark.timeout(300)
def test_the_wheel_holds_every_tracked_file_of_the_package(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to know which files are tracked")
    source = tmp_path / "source"
    files = tracked_files()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "wheel")], check=True, capture_output=True, timeout=280)
    (wheel,) = (tmp_path / "wheel").glob("toolself-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {name for name in files if name.startswith("toolself/") and "/__pycache__/" not in name}
    assert sorted(expected - shipped) == []
