"""A small run to look at: real attempts of the real loop, with scripted decisions.

The agent, the tools (search and visit over the shipped demo collection), the scorer and
the run layout are all the real ones; only the model's choices are written out in advance,
so the report's tests and screenshots show what a run really records without needing a
model. It is a fixture for seeing the viewer, not a result.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from toolself.agent import Agent
from toolself.evals.records import RESULTS, TRAJECTORIES, AttemptKey, AttemptRecord, MethodStore, safe_name
from toolself.evals.rules.gaia import gaia_match
from toolself.models.base import Message
from toolself.models.scripted import ScriptedModel, call
from toolself.tools.base import ToolContext, ToolPool
from toolself.tools.collection import Collection
from toolself.tools.search import search
from toolself.tools.visit import visit
from toolself.variants import settings_for

DATASET = "demo"


def config(subgoal: str, strategy: str, toolbox: list[str], knowledge: str = "none", mode: str = "basic",
           knowledge_summary: str = "") -> str:
    return json.dumps({"subgoal": subgoal, "strategy": strategy, "toolbox": toolbox, "knowledge": knowledge,
                       "knowledge_summary": knowledge_summary, "context_mode": mode})


def say(words: str, name: str, /, **arguments: Any) -> Message:
    """A tool call with the model's words before it, as real models write them."""
    message = call(name, **arguments)
    message.content = words
    return message


@dataclass
class SampleTask:
    id: str
    question: str
    answer: str
    scripts: dict[str, list[Any]] = field(default_factory=dict)


TASKS = [
    SampleTask(
        "lumen-founder-town",
        "In which town was the founder of the company that makes the Lumen kettle born?",
        "Harrowgate",
        {
            "toolself": [
                config("Find which company makes the Lumen kettle",
                       "Search the collection for the kettle and read the maker off the best result.", ["search"]),
                say("First, who makes the Lumen kettle?", "search", query="Lumen kettle maker"),
                say("The snippet says Brightwater Appliances. Let me read the page to be sure.", "visit",
                    locator="lumen-kettle.md"),
                say("The maker is settled; the next hop needs a different sub-goal and reading tools.",
                    "reconfigure", summary="The Lumen kettle is made by Brightwater Appliances (lumen-kettle.md).",
                    reason="The maker is found; the next hop is its founder, which needs visit to read pages.",
                    next_subgoal="Find who founded Brightwater Appliances and where they were born",
                    toolbox_request="search and visit"),
                config("Find the founder of Brightwater Appliances and their birthplace",
                       "Read the company page for the founder's exact name, then the founder's own page for "
                       "the birthplace. Names in this collection are close: match them letter for letter.",
                       ["search", "visit"], knowledge="history", mode="truncation"),
                say("", "visit", locator="brightwater-appliances.md"),
                say("Founded by Ada Marsh (not Ada Marshall). Her page should give the birthplace.", "search",
                    query="Ada Marsh engineer born"),
                say("", "visit", locator="ada-marsh.md"),
                say("Ada Marsh was born in Harrowgate.", "terminate", answer="Harrowgate"),
            ],
            "vanilla": [
                say("", "search", query="Lumen kettle founder birthplace"),
                say("", "visit", locator="brightwater-appliances.md"),
                say("The founder is Ada Marsh. Search her birthplace.", "search", query="Ada Marsh born"),
                say("", "visit", locator="ada-marshall.md"),
                say("She was born in Port Wren.", "terminate", answer="Port Wren"),
            ],
        },
    ),
    SampleTask(
        "nova-founder-village",
        "In which village was the founder of the maker of the Nova kettle born?",
        "Elmstead",
        {
            "toolself": [
                config("Find the maker of the Nova kettle", "One search should name the maker.", ["search"]),
                say("", "search", query="Nova kettle"),
                say("Brightline makes it; its page names the founder.", "reconfigure",
                    summary="The Nova kettle is made by Brightline Appliances (nova-kettle.md).",
                    reason="Maker found; reading the company page answers the rest.",
                    next_subgoal="Read the Brightline Appliances page for the founder's birthplace",
                    toolbox_request="visit only"),
                config("Find where the founder of Brightline Appliances was born",
                       "Read brightline-appliances.md; the founder's birthplace is in the first lines.",
                       ["visit"], knowledge="summary",
                       knowledge_summary="Maker: Brightline Appliances (page brightline-appliances.md)."),
                say("", "visit", locator="brightline-appliances.md"),
                say("Tomas Reyes was born in Elmstead.", "terminate", answer="Elmstead"),
            ],
            "vanilla": [
                say("", "search", query="Nova kettle maker founder"),
                say("", "visit", locator="brightline-appliances.md"),
                say("", "terminate", answer="Elmstead"),
            ],
        },
    ),
    SampleTask(
        "lumen-head-office",
        "Where is the head office of the company that makes the Lumen kettle?",
        "Calder Bay",
        {
            "toolself": [
                config("Find the Lumen kettle's maker and its head office",
                       "Search, then read the company page.", ["search", "visit"]),
                say("", "search", query="Lumen kettle company head office"),
                say("", "visit", locator="brightwater-appliances.md"),
                say("The head office is in Calder Bay.", "terminate", answer="Calder Bay"),
            ],
            "vanilla": [
                say("", "search", query="Lumen kettle head office"),
                say("The search snippet names Calder Bay.", "terminate", answer="Calder Bay"),
            ],
        },
    ),
    SampleTask(
        "kettle-years",
        "How many years after the Nova kettle was first made was the Lumen kettle first sold?",
        "12",
        {
            "toolself": [
                config("Find the year the Nova kettle was first made", "Search for the Nova kettle.", ["search"]),
                say("", "search", query="Nova kettle first made year"),
                say("1982 for the Nova kettle.", "reconfigure", summary="The Nova kettle has been made since 1982.",
                    reason="First year found; now the Lumen kettle's.",
                    next_subgoal="Find the year the Lumen kettle was first sold and subtract",
                    toolbox_request="search"),
                config("Find the year the Lumen kettle was first sold, then compute the gap",
                       "Search the Lumen kettle; subtract 1982 from its first year of sale.", ["search"],
                       knowledge="history"),
                say("", "search", query="Lumen kettle first sold"),
                say("1994 - 1982 = 12.", "terminate", answer="12"),
            ],
            "vanilla": [
                say("", "search", query="Nova kettle Lumen kettle years"),
                say("Nova 1982, and the Lumen kettle... I will guess 1997.", "terminate", answer="15"),
            ],
        },
    ),
]


def demo_collection() -> Collection:
    return Collection.from_path(Path(str(resources.files("toolself") / "data" / "demo")))


def run_attempt(task: SampleTask, method: str, collection: Collection, repeat: int = 0, max_stages: int = 4,
                max_steps_per_stage: int = 8) -> tuple[Any, AttemptRecord]:
    """One real attempt with scripted decisions, scored by the real scorer."""
    settings = settings_for(method, max_stages=max_stages, max_steps_per_stage=max_steps_per_stage)
    model = ScriptedModel(list(task.scripts[method]), name="scripted")
    key = AttemptKey(DATASET, task.id, method, repeat)
    ctx = ToolContext.temporary(collection=collection)
    try:
        trajectory = Agent(model, ToolPool([search, visit]), settings).run(
            task.question, ctx=ctx, task_id=task.id, metadata={"attempt": key.to_dict()})
    finally:
        ctx.close()
    correct, reason = gaia_match(trajectory.answer, task.answer) if trajectory.answer is not None else (False, "no answer")
    record = AttemptRecord(
        dataset=DATASET, task_id=task.id, method=method, repeat=repeat,
        status="error" if trajectory.error else "ok", family="research", split="test",
        answer=trajectory.answer, reference=task.answer, correct=correct, scorer="exact", reason=reason,
        end_reason=trajectory.end_reason, error=trajectory.error,
        prompt_tokens=trajectory.usage.prompt_tokens, completion_tokens=trajectory.usage.completion_tokens,
        steps=trajectory.num_steps, stages=len(trajectory.stages),
        reconfigurations=trajectory.num_reconfigurations, wall_time=trajectory.duration,
        trajectory_id=trajectory.id, finished_at=time.time())
    return trajectory, record


def write_sample_run(folder: str | Path, methods: tuple[str, ...] = ("toolself", "vanilla")) -> Path:
    """A run folder in the evaluation layout (`<folder>/<method>/{results,trajectories}.jsonl`)."""
    folder = Path(folder)
    collection = demo_collection()
    for method in methods:
        store = MethodStore.open(folder / safe_name(method))
        try:
            for task in TASKS:
                trajectory, record = run_attempt(task, method, collection)
                store.commit(record, trajectory.to_json())
        finally:
            store.close()
    return folder


QUERIES = ["Lumen kettle", "Brightwater Appliances", "Ada Marsh", "Harrowgate", "Nova kettle",
           "Brightline Appliances", "Tomas Reyes", "Elmstead", "Calder Bay", "Ada Marshall"]
LOCATORS = ["lumen-kettle.md", "brightwater-appliances.md", "ada-marsh.md", "harrowgate.md", "nova-kettle.md",
            "brightline-appliances.md", "elmstead.md", "calder-bay.md", "ada-marshall.md"]


def long_script(stages: int, steps_per_stage: int, answer: str, seed: int = 0) -> list[Any]:
    """Decisions for an attempt of `stages` x `steps_per_stage` steps (the last step of each
    stage being reconfigure or terminate), alternating search and visit."""
    replies: list[Any] = []
    tools = [["search"], ["search", "visit"], ["visit"], ["search", "visit"]]
    for s in range(stages):
        replies.append(config(f"Part {s + 1} of {stages}: check {QUERIES[(seed + s) % len(QUERIES)]}",
                              f"Alternate search and visit; keep notes short (pass {s + 1}).",
                              tools[s % len(tools)] if s else ["search", "visit"],
                              knowledge=("none", "history", "summary")[s % 3], mode=("basic", "truncation")[s % 2],
                              knowledge_summary="notes so far" if s % 3 == 2 else ""))
        for k in range(steps_per_stage - 1):
            n = seed + s * steps_per_stage + k
            if k % 2 == 0:
                replies.append(say(f"Looking up {QUERIES[n % len(QUERIES)]}.", "search", query=QUERIES[n % len(QUERIES)]))
            else:
                replies.append(say("", "visit", locator=LOCATORS[n % len(LOCATORS)]))
        if s < stages - 1:
            replies.append(say("This part is done.", "reconfigure", summary=f"Part {s + 1} checked.",
                               reason=f"Part {s + 1} is complete.", next_subgoal=f"Part {s + 2}"))
        else:
            replies.append(say("Done.", "terminate", answer=answer))
    return replies


def write_large_run(folder: str | Path, tasks: int = 1000, stages: int = 5, steps_per_stage: int = 10,
                    distinct: int = 10, method: str = "toolself") -> Path:
    """A run of `tasks` attempts of `stages * steps_per_stage` steps each, for load tests.

    `distinct` attempts are really run; the others are copies of them under new task ids
    (and scored again), because what a load test needs is the size and shape of a real run,
    not thousands of identical replays of the loop.
    """
    folder = Path(folder) / safe_name(method)
    folder.mkdir(parents=True, exist_ok=True)
    collection = demo_collection()
    answers = ["Harrowgate", "Elmstead", "Port Wren"]
    templates = []
    for i in range(distinct):
        task = SampleTask(f"long-{i}", f"Long task {i}: where was the founder of Brightwater Appliances born?",
                          "Harrowgate", {method: long_script(stages, steps_per_stage, answers[i % len(answers)], i)})
        templates.append(run_attempt(task, method, collection, max_stages=stages, max_steps_per_stage=steps_per_stage))
    # Written in one go rather than committed attempt by attempt: the layout is the same and
    # a fixture has no crash to survive.
    with open(folder / TRAJECTORIES, "w", encoding="utf-8") as tf, open(folder / RESULTS, "w", encoding="utf-8") as rf:
        for n in range(tasks):
            trajectory, record = templates[n % distinct]
            data = trajectory.to_dict()
            task_id = f"long-{n:05d}"
            data["id"], data["task_id"] = f"{n:016x}", task_id
            data["task"] = f"Long task {n}: where was the founder of Brightwater Appliances born?"
            data["metadata"] = {"attempt": AttemptKey(DATASET, task_id, method, 0).to_dict()}
            copy = AttemptRecord.from_dict({**record.to_dict(), "task_id": task_id, "trajectory_id": data["id"]})
            tf.write(json.dumps(data, ensure_ascii=False) + "\n")
            rf.write(copy.to_json() + "\n")
    return folder.parent
