"""Per-step framework overhead of the agent loop, side by side with smolagents.

Both frameworks run the same 100-step episode against an instant scripted model and a trivial
tool, so what is timed is the framework itself: building the context, validating and running
the call, recording the step. The per-step time is the interval between consecutive model
calls. toolself records its trajectory (and writes it as JSONL at the end, included in the
total). Prints one JSON object.

    python benchmarks/overhead.py [--steps 100] [--episodes 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path


def toolself_episode(steps: int) -> tuple[list[float], float]:
    from toolself.agent import Agent, AgentSettings
    from toolself.models.base import Completion, Message, SyncModelBase, ToolCall, Usage
    from toolself.tools.base import ToolPool, tool
    from toolself.trajectory import write_jsonl

    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return f"value of {key}"

    stamps: list[float] = []

    class Instant(SyncModelBase):
        name = "instant"

        def __init__(self):
            self.n = 0

        def complete(self, messages, tools=None, response_schema=None, session=None, max_tokens=None):
            stamps.append(time.perf_counter())
            if response_schema is not None:
                text = json.dumps({"subgoal": "look keys up", "strategy": "call lookup", "toolbox": ["lookup"],
                                   "knowledge": "none", "context_mode": "basic"})
                return Completion(Message("assistant", text), Usage(10, 10))
            self.n += 1
            if self.n > steps:
                call = ToolCall("terminate", {"answer": "done"}, id=f"c{self.n}", raw_arguments='{"answer": "done"}')
            else:
                call = ToolCall("lookup", {"key": f"k{self.n}"}, id=f"c{self.n}", raw_arguments=f'{{"key": "k{self.n}"}}')
            return Completion(Message("assistant", tool_calls=[call]), Usage(10, 10))

    agent = Agent(Instant(), ToolPool([lookup]), AgentSettings(max_steps_per_stage=steps + 10))
    start = time.perf_counter()
    trajectory = agent.run("Look up keys.")
    with tempfile.TemporaryDirectory() as tmp:
        write_jsonl(Path(tmp) / "t.jsonl", [trajectory])
    total = time.perf_counter() - start
    assert trajectory.end_reason == "terminate" and trajectory.num_steps == steps + 1, trajectory.end_reason
    return [b - a for a, b in zip(stamps[1:], stamps[2:])], total


def smolagents_episode(steps: int) -> tuple[list[float], float]:
    from smolagents import ToolCallingAgent, tool
    from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, Model
    from smolagents.monitoring import LogLevel, TokenUsage

    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return f"value of {key}"

    stamps: list[float] = []

    class Instant(Model):
        def __init__(self):
            super().__init__(model_id="instant")
            self.n = 0

        def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
            stamps.append(time.perf_counter())
            self.n += 1
            if self.n > steps:
                fn = ChatMessageToolCallFunction(name="final_answer", arguments={"answer": "done"})
            else:
                fn = ChatMessageToolCallFunction(name="lookup", arguments={"key": f"k{self.n}"})
            return ChatMessage(role="assistant", content="", token_usage=TokenUsage(10, 10),
                               tool_calls=[ChatMessageToolCall(id=f"c{self.n}", type="function", function=fn)])

    agent = ToolCallingAgent(tools=[lookup], model=Instant(), max_steps=steps + 10, verbosity_level=LogLevel.OFF)
    start = time.perf_counter()
    result = agent.run("Look up keys.")
    total = time.perf_counter() - start
    assert result == "done", result
    return [b - a for a, b in zip(stamps, stamps[1:])], total


def summarise(intervals: list[float], totals: list[float]) -> dict:
    ms = sorted(i * 1000 for i in intervals)
    return {
        "median_ms": round(statistics.median(ms), 4),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 4),
        "mean_ms": round(statistics.fmean(ms), 4),
        "episode_s": round(statistics.median(totals), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=5)
    args = parser.parse_args()
    from toolself.models.cores import cpu_name

    results: dict[str, dict] = {}
    runners = {"toolself": toolself_episode}
    try:
        import smolagents  # noqa: F401

        runners["smolagents"] = smolagents_episode
    except ImportError:
        results["smolagents"] = {"skipped": "pip install smolagents to compare"}
    collected = {name: ([], []) for name in runners}
    for name, fn in runners.items():  # warm-up: imports and first-call caches
        fn(5)
    for _ in range(args.episodes):  # interleaved, so machine noise hits both alike
        for name, fn in runners.items():
            intervals, total = fn(args.steps)
            collected[name][0].extend(intervals)
            collected[name][1].append(total)
    for name, (intervals, totals) in collected.items():
        results[name] = summarise(intervals, totals)
    out = {"benchmark": "overhead", "steps": args.steps, "episodes": args.episodes,
           "machine": f"{cpu_name()} python {platform.python_version()}",
           **results}
    if "median_ms" in results.get("smolagents", {}):
        out["smolagents_over_toolself_median"] = round(results["smolagents"]["median_ms"] / results["toolself"]["median_ms"], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
