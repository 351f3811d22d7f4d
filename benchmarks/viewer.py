"""How fast a large report opens in a real browser, and (optionally) the README screenshots.

    python benchmarks/viewer.py                       # 1,000 tasks x 50 steps, prints JSON
    python benchmarks/viewer.py --screenshots docs/images

Load time is the page's own clock: `performance.now()` (milliseconds since navigation start)
when the overview and the first list rows are on screen (`window.TOOLSELF_READY`). It is
measured for the default report (data beside the page above 8 MB) and for the same data
forced inline, each in a fresh tab, `--repeats` times. Needs Chromium (scripts/install-browser.sh)
and Playwright's Python package.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from toolself.viewer.build import build_report
from toolself.viewer.sample import write_large_run

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def load_times(browser, path: Path, repeats: int) -> dict:
    ready, open_task = [], []
    rows = steps = 0
    for _ in range(repeats):
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready]", state="attached")
        ready.append(page.evaluate("window.TOOLSELF_READY"))
        rows = page.locator(".task-row").count()
        started = time.perf_counter()
        page.locator(".task-row").nth(5).click()
        page.wait_for_selector("#task .stage")
        open_task.append(1000 * (time.perf_counter() - started))
        steps = page.locator("#task .step").count()
        page.close()
    return {"first_render_ms": [round(x) for x in ready], "first_render_ms_median": round(statistics.median(ready)),
            "open_task_ms_median": round(statistics.median(open_task)), "list_rows_in_dom": rows,
            "steps_shown": steps}


def benchmark(tasks: int, stages: int, steps_per_stage: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        tmp = Path(tmp)
        started = time.perf_counter()
        run = write_large_run(tmp / "run", tasks=tasks, stages=stages, steps_per_stage=steps_per_stage)
        generated = time.perf_counter() - started
        jsonl = sum(p.stat().st_size for p in run.rglob("*.jsonl"))
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        out = {"tasks": tasks, "steps_per_task": stages * steps_per_stage, "run_jsonl_mb": round(jsonl / 1e6, 1),
               "generate_s": round(generated, 1), "chromium": browser.version}
        for label, split in (("default", None), ("inline", False)):
            started = time.perf_counter()
            report = build_report([run], tmp / f"{label}.html", split_data=split)
            out[label] = {"build_s": round(time.perf_counter() - started, 1), "report_mb": round(report.bytes / 1e6, 1),
                          "data_beside_page": report.data_path is not None, **load_times(browser, report.path, repeats)}
        browser.close()
    return out


def screenshots(folder: Path, limit: int) -> None:
    """The README images, from a real evaluation run of the built-in suites by the expert
    teacher with some noise (so that some attempts take wrong turns and recover, or fail)."""
    import toolself.evals.runner as runner
    from toolself.evals.teacher import ExpertTeacher

    # The runner has no option for the teacher's noise; the per-task policy factory is set here.
    ExpertTeacher.for_task = classmethod(lambda cls, task: cls(task, noise=0.35, seed=1))
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        tmp = Path(tmp)
        tmp.chmod(0o755)  # tool sandboxes run as another user and must reach the workspaces
        runner.run_eval(["builtin:research", "builtin:data", "builtin:code", "builtin:mixed"],
                        ["toolself", "vanilla", "static:research"], "expert", tmp / "run", limit=limit,
                        concurrency=2, progress=False)
        report = build_report([tmp / "run"], tmp / "report.html", title="Built-in suites · expert teacher, noise 0.35")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900}, device_scale_factor=2)
        page.goto(report.path.as_uri())
        page.wait_for_selector("body[data-ready]", state="attached")
        page.screenshot(path=str(folder / "viewer-overview.png"))
        page.select_option("#f-dataset", "builtin:research")
        page.select_option("#f-method", "toolself")
        page.locator(".task-row").first.click()
        page.wait_for_selector("#task .stage")
        page.set_viewport_size({"width": 1440, "height": 1720})
        page.screenshot(path=str(folder / "viewer-task.png"))
        page.set_viewport_size({"width": 1440, "height": 900})
        page.select_option("#pick-b", index=1)
        page.wait_for_selector('.attempt[data-side="b"]')
        page.screenshot(path=str(folder / "viewer-compare.png"))
        browser.close()
    for image in ("viewer-overview.png", "viewer-task.png", "viewer-compare.png"):
        shrink(folder / image)


def shrink(path: Path) -> None:
    """256 colours without dithering: screenshots of flat UI lose nothing visible and the
    files become a third of the size."""
    try:
        from PIL import Image
    except ImportError:
        return
    image = Image.open(path).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--stages", type=int, default=5)
    parser.add_argument("--steps-per-stage", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--screenshots", type=Path, help="Write the README screenshots to this folder instead.")
    parser.add_argument("--limit", type=int, default=8, help="Tasks per built-in suite for the screenshots.")
    args = parser.parse_args()
    if args.screenshots:
        screenshots(args.screenshots, args.limit)
        return
    print(json.dumps(benchmark(args.tasks, args.stages, args.steps_per_stage, args.repeats), indent=2))


if __name__ == "__main__":
    main()
