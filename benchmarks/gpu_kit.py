"""What a GPU machine without network needs for benchmarks/gpu_session.py beyond its own image:
the wheels it lacks, at the versions installed here (those the tests ran with), and the expert
teacher's attempts with their tool schemas and tokenizer, in one folder to copy there.

    python benchmarks/gpu_kit.py --out .gpu [--python 3.12] [--tasks ...] [--limit 24]

The GPU image (torch, transformers, peft, accelerate, pandas, pyarrow, xxhash, jinja2, ...) has
no trl, datasets, pydantic or xgrammar; the list below is what toolself's training, data and
engine import on top of it (checked by installing these wheels alone over such an environment).
liger-kernel comes too, for the run that measures it. No network is needed on the GPU
machine, and the folder stays small (18 MB).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent

# Imported by toolself's training, data and engine, absent from the GPU image.
MISSING = ["trl", "datasets", "dill", "multiprocess", "pydantic", "pydantic-core", "annotated-types",
           "typing-inspection", "xgrammar", "apache-tvm-ffi"]
# There, but perhaps older than what the carried ones need (pydantic: typing-extensions >= 4.16).
NEWER = ["typing-extensions"]
# Never pyarrow, even where the image's is older than datasets asks: from a --target folder on
# PYTHONPATH, outside the interpreter's prefix and not named site-packages, dill pickles it by
# value and datasets >= 5.1 fails on its first dataset
# (docs/notes/2026-12-05-gpu-session-rehearsed-on-torch-2-11.md).
EXTRA = {"liger-kernel": "0.8.5"}  # optional here, measured there
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def pins() -> list[str]:
    """`name==version` for every wheel to bring: the versions installed here."""
    try:
        return ([f"{name}=={md.version(name)}" for name in MISSING + NEWER]
                + [f"{n}=={v}" for n, v in EXTRA.items()])
    except md.PackageNotFoundError as exc:
        raise SystemExit(f"{exc.name} is not installed here: run `make setup` first") from exc


def download(requirements: list[str], folder: Path, python: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()  # one version of each: two stop the install there
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--implementation", "cp", *platforms, "-d", str(folder),
                    *requirements], check=True)


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".gpu"))
    parser.add_argument("--python", default="3.12", help="the GPU image's Python (X.Y)")
    parser.add_argument("--tasks", default="builtin:research,builtin:data,builtin:code")
    parser.add_argument("--limit", type=int, default=24, help="tasks per suite (each attempted twice)")
    parser.add_argument("--no-wheels", action="store_true", help="the attempts only (a CPU run of the session)")
    args = parser.parse_args(argv)

    requirements = pins()
    if not args.no_wheels:
        download(requirements, args.out / "wheels", args.python)
    subprocess.run([sys.executable, str(BENCHMARKS / "train_gpu.py"), "--save-trajectories",
                    str(args.out / "trajectories.jsonl"), "--tasks", args.tasks, "--limit", str(args.limit)],
                   check=True, stdout=subprocess.DEVNULL)
    report = {"folder": str(args.out), "wheels": [] if args.no_wheels else requirements, "bytes": size(args.out)}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
