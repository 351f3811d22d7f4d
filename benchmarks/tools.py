"""Tool performance: BM25 over a 100k-document collection, sandboxed session call overhead, and
the host-side file tools (link-safe editor and file_analyzer calls).

    python benchmarks/tools.py [--docs 100000] [--queries 300] [--calls 200]

Prints one JSON object. Targets: search p50 < 20 ms after indexing; code_interpreter warm
trivial call p50 < 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from toolself.tools.base import ToolContext
from toolself.tools.code import code_interpreter
from toolself.tools.collection import Collection, Document
from toolself.tools.editor import str_replace_editor
from toolself.tools.files import file_analyzer
from toolself.tools.search import search
from toolself.tools.shell import execute_bash


def vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(4, 11, size)
    words = {"".join(rng.choice(letters, n)) for n in lengths}
    return sorted(words)


def synthetic_documents(n: int, seed: int = 0) -> tuple[list[Document], list[str]]:
    """Zipf-distributed words, 80-240 per document: roughly the shape of short web passages."""
    rng = np.random.default_rng(seed)
    vocab = np.array(vocabulary(60_000, rng))
    ranks = np.minimum(rng.zipf(1.2, size=n * 160), len(vocab)) - 1
    lengths = rng.integers(80, 240, n)
    docs, at = [], 0
    for i in range(n):
        words = vocab[ranks[at: at + lengths[i]] % len(vocab)]
        at = (at + lengths[i]) % (len(ranks) - 300)
        docs.append(Document(f"doc/{i:06d}", f"Document {i} {words[0]} {words[1]}", " ".join(words)))
    mid = vocab[200:20_000]
    queries = [" ".join(rng.choice(mid, rng.integers(2, 6))) for _ in range(1000)]
    return docs, queries


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(1000 * statistics.median(ordered), 3),
            "p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 3),
            "mean_ms": round(1000 * statistics.fmean(ordered), 3)}


def bench_search(n_docs: int, n_queries: int) -> dict:
    docs, queries = synthetic_documents(n_docs)
    start = time.perf_counter()
    collection = Collection.from_documents(docs)
    collection.index  # noqa: B018 - builds the index
    index_s = time.perf_counter() - start
    ctx = ToolContext(workspace=Path(tempfile.mkdtemp()), collection=collection)
    for q in queries[:20]:
        collection.search(q)
    raw = []
    for q in queries[:n_queries]:
        t = time.perf_counter()
        collection.search(q, k=5)
        raw.append(time.perf_counter() - t)
    tool_calls = []
    for i in range(0, min(len(queries), n_queries), 1):
        t = time.perf_counter()
        search({"query": queries[i]}, ctx)
        tool_calls.append(time.perf_counter() - t)
    ctx.close()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.jsonl"
        with path.open("w") as handle:
            for d in docs:
                handle.write(json.dumps({"id": d.locator, "title": d.title, "text": d.text}) + "\n")
        t = time.perf_counter()
        Collection.from_path(path, cache_dir=Path(tmp) / "cache")
        cold_s = time.perf_counter() - t
        t = time.perf_counter()
        reloaded = Collection.from_path(path, cache_dir=Path(tmp) / "cache")
        warm_s = time.perf_counter() - t
        assert reloaded.search(queries[0]) == collection.search(queries[0])
    return {
        "documents": n_docs,
        "words": int(sum(len(d.text.split()) for d in docs)),
        "index_seconds": round(index_s, 2),
        "index_docs_per_second": round(n_docs / index_s),
        "search_k5": percentiles(raw),
        "search_tool_call": percentiles(tool_calls),
        "jsonl_first_load_seconds": round(cold_s, 2),
        "jsonl_cached_load_seconds": round(warm_s, 2),
    }


def bench_small_collection() -> dict:
    docs, queries = synthetic_documents(300, seed=1)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        Collection.from_documents(docs).search(queries[0])
        times.append(time.perf_counter() - t)
    return {"documents": 300, "build_and_first_search": percentiles(times)}


def bench_sessions(n_calls: int) -> dict:
    ctx = ToolContext.temporary()
    try:
        t = time.perf_counter()
        code_interpreter({"code": "1"}, ctx)
        python_start = time.perf_counter() - t
        python = []
        for _ in range(n_calls):
            t = time.perf_counter()
            code_interpreter({"code": "x = 1 + 1"}, ctx)
            python.append(time.perf_counter() - t)
        t = time.perf_counter()
        execute_bash({"command": "true"}, ctx)
        bash_start = time.perf_counter() - t
        bash = []
        for _ in range(n_calls):
            t = time.perf_counter()
            execute_bash({"command": "x=1"}, ctx)
            bash.append(time.perf_counter() - t)
        user = ctx.resources.get("sandbox_user")
        return {
            "sandbox_uid_dedicated": bool(user and user.dedicated),
            "code_interpreter_start_seconds": round(python_start, 3),
            "code_interpreter_warm_call": percentiles(python),
            "execute_bash_start_seconds": round(bash_start, 3),
            "execute_bash_warm_call": percentiles(bash),
        }
    finally:
        ctx.close()


def bench_files(n_calls: int) -> dict:
    """Editor and file_analyzer calls on a 400-line file two folders deep, which each
    str_replace changes, so that file_analyzer reads and splits it again every time."""
    ctx = ToolContext.temporary()
    try:
        text = "".join(f"line {i} of a module\n" for i in range(400))
        str_replace_editor({"command": "create", "path": "pkg/sub/mod.py", "file_text": text}, ctx)
        file_analyzer({"path": "pkg/sub/mod.py"}, ctx)
        timings: dict[str, list[float]] = {"editor_view": [], "editor_str_replace": [], "file_analyzer_text": []}
        for i in range(n_calls):
            for name, call in (
                ("editor_view", lambda: str_replace_editor({"command": "view", "path": "pkg/sub/mod.py",
                                                            "view_range": [10, 60]}, ctx)),
                ("editor_str_replace", lambda: str_replace_editor({"command": "str_replace", "path": "pkg/sub/mod.py",
                                                                   "old_str": f"line {i} of", "new_str": f"line {i} in"}, ctx)),
                ("file_analyzer_text", lambda: file_analyzer({"path": "pkg/sub/mod.py"}, ctx)),
            ):
                t = time.perf_counter()
                call()
                timings[name].append(time.perf_counter() - t)
        return {name: percentiles(values) for name, values in timings.items()}
    finally:
        ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    out = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "search": bench_search(args.docs, args.queries),
        "small_collection": bench_small_collection(),
        "sessions": bench_sessions(args.calls),
        "files": bench_files(args.calls),
    }
    out["targets_met"] = {
        "search_p50_under_20ms": out["search"]["search_k5"]["p50_ms"] < 20,
        "code_interpreter_warm_p50_under_50ms": out["sessions"]["code_interpreter_warm_call"]["p50_ms"] < 50,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
