"""A report names the scorer of every cell and shows the numbers a benchmark reports beside its
accuracy (HotpotQA's F1, GSM8K's strict match)."""

from __future__ import annotations

from test_report import rec, write_run
from toolself.evals.records import AttemptRecord
from toolself.evals.report import write_report


def test_the_report_shows_each_cells_scorer_and_its_other_metrics(tmp_path):
    records = [rec("a", True, dataset="hotpotqa:/d/dev.jsonl", scorer="hotpotqa_em", metrics={"em": 1.0, "f1": 1.0}),
               rec("b", False, dataset="hotpotqa:/d/dev.jsonl", scorer="hotpotqa_em", metrics={"em": 0.0, "f1": 0.5}),
               rec("c", True, dataset="gsm8k:/d/test.jsonl", scorer="gsm8k_flexible",
                   metrics={"strict": 0.0, "flexible": 1.0})]
    report = write_report([write_run(tmp_path / "run", records)], tmp_path / "report").markdown.read_text()
    assert "| m | hotpotqa | hotpotqa_em | em 50.0, f1 75.0 |" in report
    assert "| m | gsm8k | gsm8k_flexible | strict 0.0, flexible 100.0 |" in report


def test_metrics_survive_the_record_round_trip():
    record = rec("a", True, scorer="hotpotqa_em", metrics={"em": 1.0, "f1": 1.0})
    assert AttemptRecord.from_dict(record.to_dict()).metrics == {"em": 1.0, "f1": 1.0}
