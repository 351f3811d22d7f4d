"""The history pool: the per-task archive of stage summaries H_0, H_1, ...

`reconfigure` appends to it; configuration-generation specs show it; a configuration whose
knowledge is `history` makes it visible to the next stage. It is the only channel through
which one stage's work reaches the next, besides a summary the policy writes itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StageRecord:
    stage: int
    subgoal: str
    summary: str
    reason: str = ""


@dataclass
class HistoryPool:
    records: list[StageRecord] = field(default_factory=list)

    def archive(self, stage: int, subgoal: str, summary: str, reason: str = "") -> StageRecord:
        record = StageRecord(stage=stage, subgoal=subgoal, summary=summary.strip(), reason=reason.strip())
        self.records.append(record)
        return record

    def __len__(self) -> int:
        return len(self.records)

    def render(self, empty: str = "(empty: no stage has finished yet)") -> str:
        if not self.records:
            return empty
        return "\n".join(f"[stage {r.stage}] sub-goal: {r.subgoal}\n  summary: {r.summary}" for r in self.records)

    def to_list(self) -> list[dict]:
        return [asdict(r) for r in self.records]
