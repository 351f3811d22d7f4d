"""A seeded train / test split of a benchmark that publishes only a test set (FRAMES).

FRAMES ships its 824 questions as one file, and CAT needs training tasks that the final
evaluation never sees. `carve` shuffles the rows with a seed and writes two files in the
original format, `<name>_train<ext>` and `<name>_test<ext>`, which the same loader reads (it
takes the split from the file name). The rows keep their index column, so a task keeps its
id (`frames-<index>`) in either file; a file without one gets an `id` column of the original
row numbers. The same file, size and seed always give the same split.

    python -m toolself.train.splits test.tsv --train 300 --seed 0 --name frames --out data/
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path

INDEX_COLUMNS = ("Unnamed: 0", "", "id")


def _read(path: Path) -> tuple[list[str] | None, list]:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return None, [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter)
        rows = list(reader)
        columns = list(reader.fieldnames or [])
    if not any(c in columns for c in INDEX_COLUMNS):
        columns = ["id", *columns]
        for number, row in enumerate(rows):
            row["id"] = str(number)
    return columns, rows


def _write(path: Path, columns: list[str] | None, rows: list) -> None:
    if columns is None:
        path.write_text("".join(f"{line}\n" for line in rows), encoding="utf-8")
        return
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)


def carve(path: str | Path, out_dir: str | Path, train: int, seed: int = 0,
          name: str | None = None) -> tuple[Path, Path]:
    """Write `train` rows of `path`, chosen by a shuffle seeded with `seed`, to the train file
    and the rest, in their original order, to the test file (`name`, default the file's own
    name, with `_train` / `_test`); returns (train, test)."""
    path, out_dir = Path(path), Path(out_dir)
    columns, rows = _read(path)
    if not 0 < train < len(rows):
        raise ValueError(f"{path} has {len(rows)} rows: the train split must take between 1 and {len(rows) - 1}")
    chosen = set(random.Random(seed).sample(range(len(rows)), train))
    stem = name or path.stem.removesuffix("_test").removesuffix("_train")
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = out_dir / f"{stem}_train{path.suffix}", out_dir / f"{stem}_test{path.suffix}"
    _write(targets[0], columns, [r for i, r in enumerate(rows) if i in chosen])
    _write(targets[1], columns, [r for i, r in enumerate(rows) if i not in chosen])
    return targets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Carve a seeded train split out of a test-only benchmark file.")
    parser.add_argument("path", type=Path)
    parser.add_argument("--train", type=int, required=True, help="rows for the train split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="folder for the two files")
    parser.add_argument("--name", default=None, help="the files' name before _train / _test (default: the input's)")
    args = parser.parse_args(argv)
    train, test = carve(args.path, args.out, args.train, args.seed, args.name)
    print(json.dumps({"train": str(train), "test": str(test)}))


if __name__ == "__main__":
    main()
