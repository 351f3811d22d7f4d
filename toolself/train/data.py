"""Trajectories to training examples: SFT sequences for RFT, unpaired decisions for KTO.

Every example is rebuilt from what the policy actually saw: `Conversation.visible(call)` (the
context mode's cuts included), the tools it was offered, rendered with the text tool-call
protocol the policy runs under (toolself's, or a preset's: the paper's keeps `<think>` and
leaves the tool list to the prompt) and the tokenizer's chat template, exactly as the embedded
backend prompts (`EmbeddedModel.prompt_ids`) and as a served model's template renders the text
protocol a client sends it. Where the backend recorded the completion's token ids they are
used verbatim, so training sees exactly what the agent produced; otherwise the recorded text is
tokenized on its own, after the generation prompt, as a model would have emitted it.

SFT: the decisions of one conversation are packed into one sequence while each decision's
prompt is, token for token, the previous sequence plus its completion (the usual case in a
stage whose context was not cut); where a context mode cleared or truncated earlier turns, or
the re-rendered reply differs from the generated tokens, a new sequence starts, so that every
token carrying loss is conditioned on exactly the tokens it was generated after. Loss only on
the policy's own completion tokens (end-of-turn token included), -100 elsewhere.

KTO: one example per decision (configuration turns, actions, final answers), labelled with the
attempt's outcome, the trajectory-level credit of CAT stage II.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from toolself.models.base import Message
from toolself.models.protocol import DEFAULT, TextProtocol, to_text_messages
from toolself.tools.special import SPECIAL_TOOLS
from toolself.trajectory import Conversation, ModelCall, Trajectory

IGNORE = -100
DEFAULT_MAX_LENGTH = 4096


# -- outcomes -----------------------------------------------------------------------------------

def outcome(trajectory: Trajectory) -> bool | None:
    """Whether the attempt succeeded, as its scorer recorded it in `metadata` (`correct`, or
    `score.correct`); None when it was never scored."""
    meta = trajectory.metadata or {}
    if isinstance(meta.get("correct"), bool):
        return meta["correct"]
    score = meta.get("score")
    if isinstance(score, Mapping) and isinstance(score.get("correct"), bool):
        return score["correct"]
    return None


# -- rendering ------------------------------------------------------------------------------------

def tool_schemas(pool: Any = None) -> dict[str, dict[str, Any]]:
    """name -> OpenAI tool schema for a `ToolPool` (or iterable of tools) plus the two special
    tools. A trajectory records the names it was offered; the schemas come from here."""
    schemas = {name: t.schema for name, t in SPECIAL_TOOLS.items()}
    for t in pool or []:
        schemas[t.name] = t.schema
    return schemas


def default_tool_schemas() -> dict[str, dict[str, Any]]:
    """The schemas of the global pool the evaluation runner gives agents by default."""
    from toolself.tools.registry import default_pool

    return tool_schemas(default_pool())


class RenderError(ValueError):
    """A decision cannot be rebuilt exactly (an unknown tool name, an unusable template)."""


@dataclass
class Decision:
    """One model call as token ids: the prompt the policy saw and what it produced."""

    trajectory_id: str
    task_id: str
    conversation: int
    call: int
    kind: str
    prompt_ids: list[int]
    completion_ids: list[int]
    recorded_ids: bool  # completion_ids are the backend's own, not a re-tokenization
    rejected: bool = False  # a configuration the validator rejected
    prompt_len_recorded: int | None = None  # the backend's prompt length, when it knew the ids
    context_grew: bool = False  # saw the previous call's context, its reply and what followed, none of it cut


class Renderer:
    """Rebuilds prompts and completions with one tokenizer, one tool catalogue and the text
    protocol the policy runs under (a protocol that keeps `<think>` trains on it too)."""

    def __init__(self, tokenizer: Any, schemas: Mapping[str, dict[str, Any]] | None = None,
                 protocol: TextProtocol = DEFAULT):
        self.tokenizer = tokenizer
        self.schemas = dict(schemas) if schemas is not None else default_tool_schemas()
        self.protocol = protocol
        self.end_token = _end_of_turn(tokenizer)

    def tools(self, names: list[str]) -> list[dict[str, Any]] | None:
        missing = [n for n in names if n not in self.schemas]
        if missing:
            raise RenderError(f"no schema for tool(s) {missing}: pass the pool the trajectories were run with")
        return [self.schemas[n] for n in names] or None

    def chat_text(self, messages: list[Message], tools: list[dict[str, Any]] | None, **options: Any) -> str:
        """The chat template's rendering. A turn with images is refused, not rendered: a
        text-only template would train the student on its content parts' repr, or on the turn
        without the images it was answering."""
        pictured = next((i for i, m in enumerate(messages) if m.images), None)
        if pictured is not None:
            raise RenderError(f"message {pictured} ({messages[pictured].role}) carries images; a text-only chat "
                              "template cannot render them: leave such trajectories out of the training data")
        return self.tokenizer.apply_chat_template(to_text_messages(messages, tools, self.protocol), tokenize=False,
                                                  **options)

    def prompt_text(self, messages: list[Message], tool_names: list[str]) -> str:
        return self.chat_text(messages, self.tools(tool_names), add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[Message], tool_names: list[str]) -> list[int]:
        """Exactly `EmbeddedModel.prompt_ids` for the same messages and tools."""
        return self.encode(self.prompt_text(messages, tool_names))

    def completion_text(self, messages: list[Message], output: Message, tool_names: list[str]) -> str:
        """The reply as the model would have written it: the template's rendering of the
        assistant turn after the generation prompt, up to and including its end-of-turn token."""
        tools = self.tools(tool_names)
        prompt = self.prompt_text(messages, tool_names)
        full = self.chat_text(messages + [output], tools)
        if full.startswith(prompt):
            text = full[len(prompt):]
            if self.end_token and self.end_token in text:
                return text[: text.rindex(self.end_token) + len(self.end_token)]
            return text.rstrip()
        rendered = to_text_messages([output], None, self.protocol)[0]["content"]
        return rendered + (self.end_token or "")

    def decisions(self, trajectory: Trajectory) -> Iterator[Decision]:
        for ci, conversation in enumerate(trajectory.conversations()):
            for k, call in enumerate(conversation.calls):
                yield self.decision(trajectory, ci, conversation, k, call)

    def decision(self, trajectory: Trajectory, ci: int, conversation: Conversation, k: int,
                 call: ModelCall) -> Decision:
        visible = conversation.visible(call)
        prompt = self.prompt_ids(visible, call.tools)
        if call.completion_token_ids:
            completion, recorded = list(call.completion_token_ids), True
        else:
            output = conversation.messages[call.output]
            completion, recorded = self.encode(self.completion_text(visible, output, call.tools)), False
        before = conversation.calls[k - 1] if k else None
        return Decision(trajectory.id, trajectory.task_id, ci, k, call.kind, prompt, completion, recorded,
                        rejected=call.kind == "configure" and bool(call.problems),
                        prompt_len_recorded=call.usage.prompt_tokens if recorded else None,
                        context_grew=before is not None
                        and call.view[: len(before.view) + 1] == before.view + [[before.output, None]])


def _end_of_turn(tokenizer: Any) -> str | None:
    """The token that closes an assistant turn in the template (ChatML's `<|im_end|>`)."""
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        if token in vocab:
            return token
    return tokenizer.eos_token


# -- SFT ------------------------------------------------------------------------------------------

@dataclass
class BuildStats:
    """What a builder did, for `--stats` and the training log."""

    trajectories: int = 0
    skipped_trajectories: int = 0
    decisions: int = 0
    examples: int = 0
    truncated: int = 0
    recorded_ids: int = 0
    prompt_mismatches: int = 0  # rebuilt prompt length differs from the backend's record
    masked_rejected: int = 0
    unpacked: int = 0  # decisions whose grown context still began a new sequence (see `template_note`)
    reread_tokens: int = 0  # the prompt tokens those decisions read again
    notes: list[str] = field(default_factory=list)

    def template_note(self, sequence_tokens: int) -> None:
        """Name the cost of a chat template that renders a reply differently once a turn follows
        it (Qwen3's drops an empty `<think>` block from all but the last reply): no decision can
        continue the sequence before it, so each is trained on its own copy of the context."""
        if self.unpacked:
            self.notes.append(
                f"{self.unpacked} of {self.decisions} decisions began a sequence of their own although their "
                "context only grew: the chat template renders a reply differently once another turn follows it "
                f"(Qwen3's drops an empty <think> block), so {self.reread_tokens:,} context tokens are read again "
                f"({self.reread_tokens / max(1, sequence_tokens):.0%} of {sequence_tokens:,}); replies that keep a "
                "reasoning (a thinking teacher under --preset paper, whose protocol keeps <think>) pack as usual "
                "(docs/training.md)")


@dataclass
class _Sequence:
    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    truncated: bool = False


def _check(decision: Decision, stats: BuildStats) -> None:
    stats.decisions += 1
    stats.recorded_ids += decision.recorded_ids
    if decision.prompt_len_recorded is not None and decision.prompt_len_recorded != len(decision.prompt_ids):
        stats.prompt_mismatches += 1


def _fit(prompt: list[int], completion: list[int], max_length: int) -> tuple[list[int], list[int], bool]:
    """Cut the prompt from the left (keeping its end, where the decision's context is) so that
    prompt + completion fits; a completion longer than the whole budget keeps its start."""
    if len(prompt) + len(completion) <= max_length:
        return prompt, completion, False
    completion = completion[: max_length - 1]
    keep = max_length - len(completion)
    return prompt[len(prompt) - keep:], completion, True


def sft_sequences(trajectory: Trajectory, renderer: Renderer, max_length: int = DEFAULT_MAX_LENGTH,
                  mask_rejected: bool = True, stats: BuildStats | None = None) -> list[dict[str, Any]]:
    """The SFT examples of one trajectory (see the module docs for the packing rule).

    mask_rejected: a configuration the validator rejected stays in the context that follows
    (the repair turn refers to it) but carries no loss: RFT should not teach invalid output.
    """
    stats = stats if stats is not None else BuildStats()
    out: list[dict[str, Any]] = []
    current: _Sequence | None = None
    last_conversation = -1

    def flush() -> None:
        nonlocal current
        if current is not None and any(label != IGNORE for label in current.labels):
            out.append({"input_ids": current.input_ids, "labels": current.labels,
                        "trajectory_id": trajectory.id, "task_id": trajectory.task_id,
                        "decisions": json.dumps(current.decisions), "truncated": current.truncated})
            stats.truncated += current.truncated
        current = None

    for d in renderer.decisions(trajectory):
        _check(d, stats)
        masked = mask_rejected and d.rejected
        stats.masked_rejected += masked
        completion_labels = [IGNORE] * len(d.completion_ids) if masked else list(d.completion_ids)
        tag = f"{d.conversation}:{d.call}:{d.kind}"
        could_extend = (current is not None and d.conversation == last_conversation
                        and len(d.prompt_ids) + len(d.completion_ids) <= max_length)
        extends = could_extend and d.prompt_ids[: len(current.input_ids)] == current.input_ids
        if could_extend and not extends and d.context_grew:
            stats.unpacked += 1
            stats.reread_tokens += len(os.path.commonprefix([d.prompt_ids, current.input_ids]))
        if extends:
            assert current is not None
            tail = d.prompt_ids[len(current.input_ids):]
            current.input_ids += tail + d.completion_ids
            current.labels += [IGNORE] * len(tail) + completion_labels
            current.decisions.append(tag)
        else:
            flush()
            prompt, completion, cut = _fit(d.prompt_ids, d.completion_ids, max_length)
            current = _Sequence(prompt + completion, [IGNORE] * len(prompt) + completion_labels[: len(completion)],
                                [tag], cut)
        last_conversation = d.conversation
    flush()
    return out


# -- KTO ------------------------------------------------------------------------------------------

def kto_decisions(trajectory: Trajectory, renderer: Renderer, label: bool, max_length: int = DEFAULT_MAX_LENGTH,
                  stats: BuildStats | None = None) -> list[dict[str, Any]]:
    """One KTO example per decision of the trajectory, all with the trajectory's label."""
    stats = stats if stats is not None else BuildStats()
    out = []
    for d in renderer.decisions(trajectory):
        _check(d, stats)
        prompt, completion, cut = _fit(d.prompt_ids, d.completion_ids, max_length)
        stats.truncated += cut
        out.append({"prompt_ids": prompt, "completion_ids": completion, "label": label,
                    "prompt": renderer.tokenizer.decode(prompt), "completion": renderer.tokenizer.decode(completion),
                    "kind": d.kind, "trajectory_id": trajectory.id, "task_id": trajectory.task_id,
                    "decision": f"{d.conversation}:{d.call}", "truncated": cut, "recorded_ids": d.recorded_ids})
    return out


@dataclass
class KTOWeights:
    """Desirable / undesirable loss weights from the label balance.

    The KTO paper (Eq. 8) and TRL ask for desirable_weight * n_desirable /
    (undesirable_weight * n_undesirable) in [1, 4/3]; we aim at `target` inside that range and
    scale the minority class up (the other weight stays 1), so neither class is down-weighted.
    """

    desirable: int
    undesirable: int
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    target: float = 1.15

    @property
    def ratio(self) -> float:
        if not self.desirable or not self.undesirable:
            return float("nan")
        return self.desirable_weight * self.desirable / (self.undesirable_weight * self.undesirable)

    @property
    def single_class(self) -> bool:
        return not self.desirable or not self.undesirable

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = None if self.single_class else round(self.ratio, 4)
        return out


def kto_weights(desirable: int, undesirable: int, target: float = 1.15) -> KTOWeights:
    if not 1.0 <= target <= 4 / 3:
        raise ValueError("target must lie in [1, 4/3]")
    weights = KTOWeights(desirable, undesirable, target=target)
    if weights.single_class:
        return weights
    if desirable < undesirable * target:
        weights.desirable_weight = round(target * undesirable / desirable, 4)
    else:
        weights.undesirable_weight = round(desirable / (target * undesirable), 4)
    return weights


# -- datasets -------------------------------------------------------------------------------------

def build_sft_dataset(trajectories: Iterable[Trajectory], renderer: Renderer, max_length: int = DEFAULT_MAX_LENGTH,
                      only_successful: bool = True, mask_rejected: bool = True):
    """(datasets.Dataset with input_ids / labels, BuildStats). With `only_successful`, the
    rejection-sampling filter: attempts the scorer did not mark correct are skipped."""
    from datasets import Dataset

    stats = BuildStats()
    rows: list[dict[str, Any]] = []
    for t in trajectories:
        if only_successful and outcome(t) is not True:
            stats.skipped_trajectories += 1
            continue
        stats.trajectories += 1
        rows.extend(sft_sequences(t, renderer, max_length, mask_rejected, stats))
    stats.examples = len(rows)
    stats.template_note(sum(len(r["input_ids"]) for r in rows))
    columns = ["input_ids", "labels", "trajectory_id", "task_id", "decisions", "truncated"]
    return Dataset.from_dict({c: [r[c] for r in rows] for c in columns}), stats


def build_kto_dataset(trajectories: Iterable[Trajectory], renderer: Renderer, max_length: int = DEFAULT_MAX_LENGTH):
    """(datasets.Dataset of decisions, BuildStats, KTOWeights). Unscored attempts are skipped."""
    from datasets import Dataset

    stats = BuildStats()
    rows: list[dict[str, Any]] = []
    for t in trajectories:
        label = outcome(t)
        if label is None:
            stats.skipped_trajectories += 1
            continue
        stats.trajectories += 1
        rows.extend(kto_decisions(t, renderer, label, max_length, stats))
    stats.examples = len(rows)
    desirable = sum(r["label"] for r in rows)
    weights = kto_weights(desirable, len(rows) - desirable)
    if weights.single_class and rows:
        stats.notes.append(f"all {len(rows)} decisions are {'desirable' if desirable else 'undesirable'}: "
                           "KTO has a single class to learn from")
    columns = ["prompt_ids", "completion_ids", "label", "prompt", "completion", "kind", "trajectory_id", "task_id",
               "decision", "truncated", "recorded_ids"]
    return Dataset.from_dict({c: [r[c] for r in rows] for c in columns}), stats, weights


# -- statistics -----------------------------------------------------------------------------------

def _lengths(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {"count": len(values), "min": ordered[0], "median": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max": ordered[-1],
            "total": sum(values)}


def sft_stats(dataset, stats: BuildStats) -> dict[str, Any]:
    lengths = [len(x) for x in dataset["input_ids"]] if len(dataset) else []
    loss_tokens = [sum(1 for v in labels if v != IGNORE) for labels in dataset["labels"]] if len(dataset) else []
    return {"build": asdict(stats), "sequence_tokens": _lengths(lengths), "loss_tokens": _lengths(loss_tokens)}


def kto_stats(dataset, stats: BuildStats, weights: KTOWeights) -> dict[str, Any]:
    kinds: dict[str, dict[str, int]] = {}
    if len(dataset):
        for kind, label in zip(dataset["kind"], dataset["label"]):
            entry = kinds.setdefault(kind, {"desirable": 0, "undesirable": 0})
            entry["desirable" if label else "undesirable"] += 1
    return {"build": asdict(stats),
            "prompt_tokens": _lengths([len(x) for x in dataset["prompt_ids"]] if len(dataset) else []),
            "completion_tokens": _lengths([len(x) for x in dataset["completion_ids"]] if len(dataset) else []),
            "labels": {"desirable": weights.desirable, "undesirable": weights.undesirable}, "by_kind": kinds,
            "weights": weights.to_dict()}


def save_dataset(dataset, directory: str | Path, stats: dict[str, Any]) -> Path:
    """`datasets`' own on-disk format, with the build statistics next to it."""
    directory = Path(directory)
    dataset.save_to_disk(str(directory))
    (directory / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return directory


def load_dataset_dir(directory: str | Path):
    from datasets import load_from_disk

    return load_from_disk(str(directory))
