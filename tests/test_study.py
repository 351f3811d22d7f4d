"""The CAT study's bookkeeping: which pipelines it runs, and the table it builds from their
evaluation folders (filled here by the real runner with the expert teacher, which is fast and
exact; the pipelines themselves are exercised in test_train and by `make cat-demo`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from toolself.train.pipeline import CATSettings
from toolself.train.pipeline import PipelineMismatch
from toolself.train.study import (BEGIN, END, PRESETS, ROWS, StudySettings, claim, pipeline_dir, publish,
                                  write_results)

SUITES = ["builtin:research", "builtin:mixed"]


def study(seeds=(0, 1)) -> StudySettings:
    return StudySettings(train_tasks=["builtin:research"], eval_tasks=SUITES, seeds=list(seeds),
                         cat={"eval_limit": 2})


def test_each_method_and_seed_is_one_pipeline_that_evaluates_its_trained_models():
    s = study(seeds=(3, 4))
    first, second, control = s.pipeline("toolself", 3), s.pipeline("toolself", 4), s.pipeline("vanilla", 3)
    assert (first.method, first.seed, first.evaluate) == ("toolself", 3, ("rft", "kto"))
    assert (second.seed, control.method, control.evaluate) == (4, "vanilla", ("rft", "kto"))
    assert first.eval_tasks == SUITES and first.tasks == ["builtin:research"] and first.eval_limit == 2
    assert first.eval_seed == second.eval_seed  # every seed is tested on the same held-out tasks


def test_a_pipeline_refuses_an_unknown_method_or_model_to_evaluate():
    with pytest.raises(ValueError, match="unknown method"):
        CATSettings(tasks=["builtin:research"], method="nope")
    with pytest.raises(ValueError, match="unknown models to evaluate"):
        CATSettings(tasks=["builtin:research"], evaluate=("teacher",))


def test_a_study_folder_takes_more_seeds_but_refuses_another_recipe(tmp_path):
    claim(tmp_path, PRESETS["demo"]())
    claim(tmp_path, PRESETS["full"]())  # the demo's seed, then two more
    other = PRESETS["full"]()
    other.cat = replace(other.cat, limit=99)
    with pytest.raises(PipelineMismatch, match="other settings"):
        claim(tmp_path, other)
    claim(tmp_path, other, force=True)


def test_every_preset_trains_without_mixed_and_evaluates_on_all_four_suites():
    for make in PRESETS.values():
        s = make()
        assert "builtin:mixed" not in s.train_tasks and len(s.eval_tasks) == 4
        assert set(s.methods) == {"toolself", "vanilla"}
        s.pipeline("toolself", s.seeds[0])  # valid CAT settings


def fill(out, s: StudySettings, wrong_on_seed: dict[int, set[str]]) -> None:
    """Real evaluation folders for every row and seed (the expert teacher answers; a row's
    answers are then marked wrong for the listed datasets to give the table a spread)."""
    from toolself.evals.records import RESULTS, read_records, safe_name
    from toolself.evals.runner import run_eval

    for row in ROWS:
        for seed in s.seeds[:1] if row.model == "student" else s.seeds:
            folder = (out / "zero-shot" if row.model == "student"
                      else pipeline_dir(out, row.method, seed) / "eval" / row.model)
            run_eval(SUITES, [row.method], "expert", folder, split="heldout", limit=2, progress=False)
            path = folder / safe_name(row.method) / RESULTS
            records = read_records(path.parent)
            lines = []
            for r in records:
                record = r.to_dict()
                if row.model == "kto" and r.dataset in wrong_on_seed.get(seed, set()):
                    record["correct"] = False
                lines.append(json.dumps(record))
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_the_table_has_one_row_per_model_with_the_mean_and_standard_error_over_seeds(tmp_path):
    s = study(seeds=(0, 1))
    fill(tmp_path, s, wrong_on_seed={1: {"builtin:mixed"}})
    summary = write_results(tmp_path, s)
    table = summary["table"]
    assert list(table) == [r.label for r in ROWS]
    assert table["ToolSelf, zero-shot"]["research"] == {"accuracy": 1.0, "stderr": None, "attempts": 2}
    kto = table["ToolSelf + RFT + KTO"]
    assert kto["mixed"]["accuracy"] == pytest.approx(0.5) and kto["mixed"]["stderr"] == pytest.approx(0.5)
    assert kto["research"]["accuracy"] == 1.0 and kto["research"]["stderr"] == 0.0
    assert kto["average"]["accuracy"] == pytest.approx(0.75)
    markdown = (tmp_path / "results.md").read_text()
    assert "| ToolSelf + RFT + KTO | 100.0 ± 0.0 | 50.0 ± 50.0 | 75.0 ± 25.0 |" in markdown
    assert (tmp_path / "accuracy.png").stat().st_size > 1000


def test_the_table_is_written_between_its_markers_and_the_rest_of_the_file_is_kept(tmp_path):
    results = tmp_path / "docs" / "cat-cpu.md"
    results.parent.mkdir()
    results.write_text(f"# CAT\n\nExperiments above.\n\n{BEGIN}\nold table\n{END}\n\nNotes below.\n")
    (tmp_path / "accuracy.png").write_bytes(b"png")
    publish(tmp_path, results, "| new | table |\n\n![accuracy](accuracy.png)\n")
    text = results.read_text()
    assert "old table" not in text and "| new | table |" in text
    assert text.startswith("# CAT\n\nExperiments above.") and text.endswith("Notes below.\n")
    assert "](cat-cpu/accuracy.png)" in text and (tmp_path / "docs" / "cat-cpu" / "accuracy.png").is_file()
    publish(tmp_path, results, "| newer |\n")
    assert results.read_text().count(BEGIN) == 1 and "| new | table |" not in results.read_text()
