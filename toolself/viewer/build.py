"""Write the report: one HTML file with its CSS, JavaScript and data inline.

The data is two globals: the run (list rows and summaries, small) and the details, one JSON
*string* per attempt. A string literal costs the browser a scan, not an object graph, so a
run of thousands of long attempts opens as fast as its list; an attempt is parsed when it is
first shown. Above `SPLIT_BYTES` the data goes to `<report>.data.js` beside the page, loaded
by a plain `<script src>` (which, unlike fetch, works from file://): Chromium gets through a
large inline script in the HTML parser more slowly than through the same bytes as an
external script (docs/benchmarks.md, "Trajectory viewer"), and the HTML stays small enough
for any tool to open.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable

from toolself.viewer.digest import attempt_detail, attempt_row, json_for_script, method_order, summarize
from toolself.viewer.load import OUTCOMES, Attempt, load_attempts

SPLIT_BYTES = 8 * 1024 * 1024
MAX_OBSERVATION = 100_000


@dataclass
class Report:
    path: Path
    data_path: Path | None
    attempts: int
    tasks: int
    bytes: int


def _asset(name: str) -> str:
    return (resources.files("toolself.viewer") / name).read_text(encoding="utf-8")


def data_script(attempts: list[Attempt], title: str, sources: list[str],
                max_observation: int | None = MAX_OBSERVATION) -> str:
    """The JavaScript that defines the report's data."""
    rows = [attempt_row(i, a) for i, a in enumerate(attempts)]
    run = {
        "title": title, "sources": sources, "generated": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
        "outcomes": list(OUTCOMES), "rows": rows, "summary": summarize(rows),
        "methods": sorted({r["method"] for r in rows}, key=method_order), "datasets": sorted({r["dataset"] for r in rows}),
    }
    details = []
    for attempt in attempts:
        detail = attempt_detail(attempt, max_observation)
        details.append(None if detail is None else json_for_script(detail))
    # Each detail is already JSON text; quoting it again makes it a string literal.
    return ("window.TOOLSELF_RUN=" + json_for_script(run) + ";\n"
            "window.TOOLSELF_DETAILS=" + json_for_script(details) + ";\n")


def render_html(title: str, data: str | None, data_src: str | None) -> str:
    page = _asset("viewer.html")
    if data is not None:
        data_tag = "<script>" + data + "</script>"
    else:
        data_tag = f'<script src="{_attr(data_src or "")}"></script>'
    values = {"__TITLE__": _text(title), "/*__CSS__*/": _asset("viewer.css"), "<!--__DATA__-->": data_tag,
              "/*__JS__*/": _asset("viewer.js")}
    # One pass: text put in by one marker is never scanned for another.
    pattern = re.compile("|".join(re.escape(m) for m in values))
    return pattern.sub(lambda m: values[m.group(0)], page)


def _text(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(value: str) -> str:
    return _text(value).replace('"', "&quot;")


def build_report(paths: Iterable[str | Path], out: str | Path = "report.html", title: str | None = None,
                 split_data: bool | None = None, max_observation: int | None = MAX_OBSERVATION) -> Report:
    """Read trajectories (and results) from `paths` and write the report to `out`.

    split_data: True writes the data beside the page, False inlines it, None decides by size.
    max_observation: observations longer than this are cut in the report (not in the run).
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("give at least one trajectories file or run folder")
    attempts = load_attempts(paths)
    title = title or " + ".join(p.name for p in paths)
    data = data_script(attempts, title, [p.name for p in paths], max_observation)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data_path = out.with_name(out.stem + ".data.js")
    split = split_data if split_data is not None else len(data.encode("utf-8")) > SPLIT_BYTES
    if split:
        data_path.write_text(data, encoding="utf-8")
        html = render_html(title, None, data_path.name)
    else:
        data_path.unlink(missing_ok=True)
        html = render_html(title, data, None)
    out.write_text(html, encoding="utf-8")
    tasks = len({(a.dataset, a.task_id) for a in attempts})
    size = out.stat().st_size + (data_path.stat().st_size if split else 0)
    return Report(out, data_path if split else None, len(attempts), tasks, size)
