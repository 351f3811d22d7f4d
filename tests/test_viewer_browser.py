"""The report in a real headless Chromium, opened from file:// like a user opens it.

Needs Debian's `chromium` (scripts/install-browser.sh installs it; the fixture runs that script
once if the browser is missing) and Playwright's Python package (the dev extra), which drives
that system browser: no browser is ever downloaded. Screenshots land in test-artifacts/viewer/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from toolself.agent import Agent
from toolself.evals.records import RESULTS, AttemptRecord
from toolself.models.scripted import ScriptedModel
from toolself.tools.base import ToolPool, tool
from toolself.trajectory import write_jsonl
from toolself.variants import settings_for
from toolself.viewer.build import build_report
from toolself.viewer.sample import config, say, write_large_run, write_sample_run

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is missing: pip install playwright "
                                                             "(it is in the dev extra)")

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "viewer"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold?</b>'


def chromium_path() -> str | None:
    for candidate in (os.environ.get("TOOLSELF_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                      shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        install = subprocess.run(["sh", str(ROOT / "scripts" / "install-browser.sh")], capture_output=True, text=True,
                                 timeout=900)
        path = chromium_path()
        if path is None:
            pytest.skip("Chromium is not installed and could not be installed here "
                        f"(scripts/install-browser.sh: {install.stderr.strip() or install.stdout.strip()})")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@tool
def fetch_page(url: str) -> str:
    """Return a page that tries to run script in whatever displays it.

    Args:
        url: Any address.
    """
    return f"<html><title>{url}</title>{HOSTILE}</html>"


def extra_trajectories(path: Path) -> Path:
    """Real attempts with hard cases: markup in an observation, an answer and the model's
    words; a configuration the loop had to have repaired."""
    pool = ToolPool([fetch_page])
    hostile = Agent(pool=pool, settings=settings_for("toolself"), model=ScriptedModel([
        config("Read the page " + HOSTILE, "Fetch it.", ["fetch_page"]),
        say("Let me look: " + HOSTILE, "fetch_page", url="http://127.0.0.1/x"),
        say("", "terminate", answer=HOSTILE),
    ])).run("Summarise the page " + HOSTILE, task_id="hostile-page")
    repaired = Agent(pool=pool, settings=settings_for("toolself"), model=ScriptedModel([
        config("Fetch", "Use the browser.", ["web_browser"]),
        config("Fetch", "Use fetch_page.", ["fetch_page"]),
        say("", "terminate", answer="nothing to fetch"),
    ])).run("Fetch nothing.", task_id="repaired-config")
    write_jsonl(path, [hostile, repaired])
    return path


def crashed_run(folder: Path) -> Path:
    """A method folder whose only attempt crashed before writing a trajectory."""
    record = AttemptRecord(dataset="demo", task_id="crashed-task", method="toolself", repeat=0, status="error",
                           error="Traceback (most recent call last):\nRuntimeError: <script>window.__pwned = 3</script>")
    (folder / "toolself").mkdir(parents=True)
    (folder / "toolself" / RESULTS).write_text(record.to_json() + "\n")
    return folder


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    run = write_sample_run(folder / "run")
    extra = extra_trajectories(folder / "extra.jsonl")
    crashed = crashed_run(folder / "crashed")
    return build_report([run, extra, crashed], folder / "report.html", title="Sample run").path


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield page
    page.close()
    assert errors == [], "the page logged errors"


def open_report(page, path: Path) -> None:
    page.goto(path.as_uri())
    # An attribute, not a polled script: the page's CSP forbids the eval Playwright polls with.
    page.wait_for_selector("body[data-ready]", state="attached")


def visible_task_ids(page) -> list[str]:
    return page.eval_on_selector_all(".task-row", "rows => rows.map(r => r.querySelector('.id span').textContent)")


def open_task(page, task_id: str) -> None:
    page.locator(".task-row", has_text=task_id).click()
    page.wait_for_selector("#task .stage")


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


def test_overview_counts_tasks_and_shows_accuracy_per_method(page, report):
    open_report(page, report)
    assert page.text_content("#count") == "7 of 7 tasks · 11 attempts"
    methods = page.eval_on_selector_all("tr.method-row", "rows => rows.map(r => r.cells[0].textContent)")
    assert methods == ["toolself", "vanilla"]
    # The crashed attempt counts as a failure; the two unscored ones count for nothing.
    assert "80.0%4/5" in page.text_content('tr.method-row[data-method="toolself"]')
    assert "80.0%4/5" in page.text_content('tr.ds-row[data-method="toolself"][data-dataset="demo"]')
    assert "—" in page.text_content('tr.ds-row[data-method="toolself"][data-dataset=""]')
    assert "50.0%2/4" in page.text_content('tr.method-row[data-method="vanilla"]')
    screenshot(page, "overview.png")


def test_a_stage_shows_its_toolbox_diff_and_what_changed(page, report):
    open_report(page, report)
    open_task(page, "lumen-founder-town")
    second = page.locator("#stage-a-1")
    toolbox = second.locator('.cfg-row[data-field="toolbox"]')
    assert "changed" in toolbox.get_attribute("class")
    assert toolbox.locator(".tool.added").all_text_contents() == ["+ visit"]
    assert toolbox.locator(".tool:not(.added):not(.removed)").all_text_contents() == ["search"]
    assert "was: none" in second.locator('.cfg-row[data-field="knowledge"]').text_content()
    first = page.locator("#stage-a-0")
    assert first.locator(".cfg-row.changed").count() == 0
    reconfigure = first.locator(".special.reconfigure").text_content()
    assert "made by Brightwater Appliances" in reconfigure and "next hop is its founder" in reconfigure
    assert "Opened by reconfigure" in second.locator(".opened").first.text_content()
    assert page.locator("#task .strip li").count() == 2
    screenshot(page, "task.png")


def test_filters_narrow_the_list_by_outcome_method_and_text(page, report):
    open_report(page, report)
    page.select_option("#f-outcome", "wrong")
    assert page.text_content("#count").startswith("2 of 7 tasks")
    assert sorted(visible_task_ids(page)) == ["kettle-years", "lumen-founder-town"]
    page.select_option("#f-method", "toolself")
    assert page.text_content("#count").startswith("0 of 7 tasks")
    page.select_option("#f-outcome", "")
    page.fill("#q", "nova village")
    sync_api.expect(page.locator("#count")).to_have_text("1 of 7 tasks · 2 attempts")
    assert visible_task_ids(page) == ["nova-founder-village"]
    page.fill("#q", "")
    page.select_option("#f-method", "")
    page.select_option("#f-outcome", "disagree")
    sync_api.expect(page.locator("#count")).to_have_text("2 of 7 tasks · 4 attempts")
    assert sorted(visible_task_ids(page)) == ["kettle-years", "lumen-founder-town"]


def test_two_methods_side_by_side_on_the_same_task(page, report):
    open_report(page, report)
    open_task(page, "kettle-years")
    page.select_option("#pick-b", label="vanilla — wrong")
    page.wait_for_selector('.attempt[data-side="b"]')
    names = page.eval_on_selector_all(".attempt .attempt-title .name", "nodes => nodes.map(n => n.textContent)")
    assert names == ["toolself", "vanilla"]
    assert page.locator('.attempt[data-side="a"] .stage').count() == 2
    assert page.locator('.attempt[data-side="b"] .stage').count() == 1
    assert "two" in page.get_attribute(".cols", "class")
    screenshot(page, "side-by-side.png")


def test_markup_in_model_output_and_observations_is_shown_as_text(page, report):
    open_report(page, report)
    open_task(page, "hostile-page")
    observation = page.locator('.step[data-tool="fetch_page"] .obs pre').text_content()
    assert HOSTILE in observation
    assert HOSTILE in page.locator(".special.terminate").text_content()
    assert HOSTILE in page.locator(".thought").first.text_content()
    assert HOSTILE in page.text_content("#task h2")
    page.wait_for_timeout(100)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#content img, #content script").count() == 0
    assert page.locator("#content b", has_text="bold?").count() == 0


def test_a_long_observation_is_collapsed_until_asked_for(page, report):
    open_report(page, report)
    open_task(page, "lumen-founder-town")
    step = page.locator('#stage-a-0 .step[data-tool="search"]')
    shown = step.locator(".obs pre").text_content()
    step.locator("button.more").click()
    full = step.locator(".obs pre").text_content()
    assert len(full) > len(shown) and full.startswith(shown) and "Use visit(locator)" in full
    assert step.locator("button.more").text_content() == "Show less"


def test_the_address_keeps_the_selected_task_and_comparison(page, report):
    open_report(page, report)
    open_task(page, "nova-founder-village")
    page.select_option("#pick-b", index=1)
    page.wait_for_selector('.attempt[data-side="b"]')
    address = page.url
    page.goto("about:blank")
    page.goto(address)
    page.wait_for_selector('.attempt[data-side="b"]')
    assert page.text_content("#task .crumbs").endswith("nova-founder-village")
    page.keyboard.press("Escape")
    page.wait_for_selector("#overview")


def test_a_report_with_its_data_beside_it_opens_from_file(page, tmp_path):
    run = write_sample_run(tmp_path / "run", methods=("toolself",))
    path = build_report([run], tmp_path / "split.html", split_data=True).path
    open_report(page, path)
    assert page.text_content("#count") == "4 of 4 tasks · 4 attempts"


def test_the_list_draws_only_the_rows_in_view(page, tmp_path):
    run = write_large_run(tmp_path / "large", tasks=500, stages=1, steps_per_stage=3, distinct=2)
    path = build_report([run], tmp_path / "large.html").path
    open_report(page, path)
    assert page.text_content("#count").startswith("500 of 500 tasks")
    assert page.locator(".task-row").count() < 40
    page.eval_on_selector("#list", "list => { list.scrollTop = list.scrollHeight; }")
    sync_api.expect(page.locator(".task-row", has_text="long-00499")).to_have_count(1)
    assert page.locator(".task-row").count() < 40


@pytest.mark.slow
def test_a_thousand_tasks_of_fifty_steps_open_in_under_three_seconds(page, tmp_path):
    run = write_large_run(tmp_path / "large", tasks=1000, stages=5, steps_per_stage=10)
    report = build_report([run], tmp_path / "large.html")
    open_report(page, report.path)
    ready_ms = page.evaluate("window.TOOLSELF_READY")
    assert ready_ms < 3000, f"first render after {ready_ms:.0f} ms"
    page.fill("#q", "long-00500")
    open_task(page, "long-00500")
    assert page.locator("#task .step").count() == 50


def test_a_crashed_attempt_shows_its_error_and_that_no_trajectory_was_kept(page, report):
    open_report(page, report)
    page.select_option("#f-outcome", "error")
    sync_api.expect(page.locator("#count")).to_have_text("1 of 7 tasks · 1 attempt")
    page.locator(".task-row", has_text="crashed-task").click()
    page.wait_for_selector("#task .attempt")
    assert "No trajectory was recorded" in page.text_content("#task .attempt")
    assert "RuntimeError: <script>window.__pwned = 3</script>" in page.text_content("#task .error-box")
    assert page.evaluate("window.__pwned") is None


def test_a_repaired_configuration_shows_its_source_and_problems(page, report):
    open_report(page, report)
    open_task(page, "repaired-config")
    stage = page.locator("#stage-a-0")
    assert stage.locator(".src").text_content() == "repaired"
    assert "web_browser" in stage.locator(".problems").text_content()


def test_arrow_keys_walk_the_list(page, report):
    open_report(page, report)
    page.keyboard.press("ArrowDown")
    page.wait_for_selector('#task[data-task="demo/lumen-founder-town"]')
    page.keyboard.press("ArrowDown")
    page.wait_for_selector('#task[data-task="demo/nova-founder-village"]')
    assert page.locator(".task-row.selected").text_content().startswith("nova-founder-village")
