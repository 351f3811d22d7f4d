"""The order KTO trains on its decisions in (`order.py`): TRL's KTO trainer reads them as the
dataset holds them, and the data builder keeps each attempt's decisions together, attempt after
attempt."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from toolself.train.kernels import sequence_share  # noqa: E402
from toolself.train.kto import decision_lengths  # noqa: E402
from toolself.train.order import micro_batch_order, whole_micro_batch_epoch  # noqa: E402


@pytest.fixture(scope="module")
def decisions(tiny):
    """KTO's decisions on the expert teacher's attempts at four research tasks, some spoiled by
    noise (so both labels), for the `tiny` model's tokenizer."""
    from transformers import AutoTokenizer

    from toolself.evals.teacher import scored_attempts
    from toolself.tools.registry import default_pool
    from toolself.train import data as D

    pool = default_pool()
    attempts = scored_attempts("builtin:research?hops=2", limit=4, noises=(0.0, 1.0), pool=pool)
    renderer = D.Renderer(AutoTokenizer.from_pretrained(str(tiny)), D.tool_schemas(pool))
    dataset, _, _ = D.build_kto_dataset(attempts, renderer, max_length=4096)
    assert len(set(dataset["label"])) == 2
    return dataset


def one_attempt_share(attempts: list[str], order: list[int], batch: int) -> float:
    """The share of whole micro-batches whose decisions all come from one attempt."""
    chunks = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    return sum(len({attempts[i] for i in chunk}) == 1 for chunk in chunks) / len(chunks)


@pytest.mark.parametrize("grouped", [False, True])
def test_the_order_is_a_permutation_fixed_by_its_seed(grouped):
    lengths = [(7 * i) % 23 + 1 for i in range(50)]
    order = micro_batch_order(lengths, 4, seed=3, grouped=grouped)
    assert sorted(order) == list(range(50))
    assert order == micro_batch_order(lengths, 4, seed=3, grouped=grouped)
    assert order != micro_batch_order(lengths, 4, seed=4, grouped=grouped)


def test_a_grouped_order_puts_the_longest_decision_first_and_a_partial_micro_batch_last():
    lengths = [(7 * i) % 23 + 1 for i in range(50)] + [99]
    for seed in range(5):
        order = micro_batch_order(lengths, 4, seed=seed, grouped=True)
        assert 50 in order[:4]
        tail = order[48:]  # 51 decisions: twelve whole micro-batches, then three
        assert len(tail) == 3 and max(lengths[i] for i in tail) <= max(lengths[i] for i in order[:4])


def test_the_builders_order_gives_micro_batches_of_one_attempt_and_a_shuffle_mixes_them(decisions):
    attempts = decisions["trajectory_id"]
    as_built = list(range(len(decisions)))
    assert one_attempt_share(attempts, as_built, 4) > 0.5
    for grouped in (False, True):
        assert one_attempt_share(attempts, micro_batch_order(decision_lengths(decisions), 4, 0, grouped), 4) < 0.2


def test_grouped_micro_batches_pad_far_less_than_shuffled_ones(decisions):
    lengths = decision_lengths(decisions)
    shuffled = [sequence_share(lengths, micro_batch_order(lengths, 4, seed, False), 4) for seed in range(5)]
    grouped = [sequence_share(lengths, micro_batch_order(lengths, 4, seed, True), 4) for seed in range(5)]
    assert min(grouped) > max(shuffled) + 0.1  # 89-92% against 71-77% here


def test_kto_trains_on_its_decisions_in_their_order_not_the_builders(tmp_path, tiny, decisions):
    from toolself.train import kto as K
    from toolself.train.kto_config import CATKTOConfig

    seen = []
    prepare = K.PretokenizedKTOTrainer._prepare_dataset

    def recording(self, dataset, *args, **kwargs):
        seen.append(list(dataset["trajectory_id"]))
        return prepare(self, dataset, *args, **kwargs)

    K.PretokenizedKTOTrainer._prepare_dataset = recording
    try:
        config = CATKTOConfig(output_dir=str(tmp_path / "ck"), max_steps=1, per_device_train_batch_size=4,
                              gradient_accumulation_steps=1, bf16=False, disable_tqdm=True, seed=5)
        result = K.train_kto(decisions, tiny, tmp_path / "kto", config)
    finally:
        K.PretokenizedKTOTrainer._prepare_dataset = prepare
    order = micro_batch_order(decision_lengths(decisions), 4, 5, grouped=True)
    assert seen[0] == [decisions["trajectory_id"][i] for i in order]
    assert result.extra["kernels"]["length_grouped"] is True


def test_the_first_epoch_reads_the_decisions_as_ordered_and_later_ones_move_only_whole_micro_batches():
    first = whole_micro_batch_epoch(23, 4, seed=1, epoch=0)
    assert first == list(range(23))
    whole = {tuple(range(i, i + 4)) for i in range(0, 20, 4)}
    orders = [whole_micro_batch_epoch(23, 4, seed=1, epoch=e) for e in (1, 2)]
    for order in orders:
        assert {tuple(order[i:i + 4]) for i in range(0, 20, 4)} == whole
        assert order[20:] == [20, 21, 22]
    assert first != orders[0] != orders[1]
    assert orders[0] == whole_micro_batch_epoch(23, 4, seed=1, epoch=1)
    assert orders[0] != whole_micro_batch_epoch(23, 4, seed=2, epoch=1)


def test_kto_reads_its_micro_batches_in_a_new_order_each_epoch_each_with_its_own_kl_completions(
        tmp_path, tiny, decisions, monkeypatch):
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    from toolself.train import kto as K
    from toolself.train.kto_config import CATKTOConfig

    batches = []
    collate = DataCollatorForUnpairedPreference.__call__

    def recording(self, examples):
        completions = {tuple(e["completion_ids"]) for e in examples}
        assert {tuple(e["KL_completion_ids"]) for e in examples} == completions
        batches.append(frozenset(tuple(e["prompt_ids"] + e["completion_ids"]) for e in examples))
        return collate(self, examples)

    monkeypatch.setattr(DataCollatorForUnpairedPreference, "__call__", recording)
    labels, lengths = decisions["label"], decision_lengths(decisions)
    shortest = sorted(range(len(decisions)), key=lengths.__getitem__)
    subset = decisions.select([i for i in shortest if labels[i]][:6] + [i for i in shortest if not labels[i]][:2])
    config = CATKTOConfig(output_dir=str(tmp_path / "ck"), num_train_epochs=2, per_device_train_batch_size=2,
                          gradient_accumulation_steps=1, bf16=False, disable_tqdm=True, seed=5)
    K.train_kto(subset, tiny, tmp_path / "kto", config)
    assert len(batches) == 8
    first, second = batches[:4], batches[4:]
    assert set(first) == set(second) and len(set(first)) == 4
    assert first != second


def test_kto_resumes_in_another_number_of_processes_only_in_the_micro_batches_it_ordered_its_decisions_in(
        tmp_path, tiny, decisions):
    import json

    from toolself.train import reruns as R
    from toolself.train.kto import train_kto
    from toolself.train.kto_config import CATKTOConfig

    lengths = decision_lengths(decisions)
    subset = decisions.select(sorted(range(len(decisions)), key=lengths.__getitem__)[:8])
    config = dict(output_dir=str(tmp_path / "checkpoints"), max_steps=2, per_device_train_batch_size=2,
                  gradient_accumulation_steps=1, save_strategy="steps", save_steps=1, bf16=False, disable_tqdm=True)
    train_kto(subset, tiny, tmp_path, CATKTOConfig(**config))
    (tmp_path / R.RESULT_FILE).unlink()  # as if it had run in two processes, and stopped after its last step
    recorded = json.loads((tmp_path / R.SETTINGS_FILE).read_text())
    recorded["settings"]["world_size"] = 2
    (tmp_path / R.SETTINGS_FILE).write_text(json.dumps(recorded))
    state_file = tmp_path / "checkpoints" / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "train_batch_size": 3}))  # one that 2 x 2 cannot keep
    with pytest.raises(R.TrainingMismatch, match="ordered in micro-batches of 3"):
        train_kto(subset, tiny, tmp_path, CATKTOConfig(**config), resume=True)
    state_file.write_text(json.dumps(state))
    result = train_kto(subset, tiny, tmp_path, CATKTOConfig(**config), resume=True)
    assert result.extra["resumed_in_other_processes"] == {"processes_was": 2, "processes_now": 1,
                                                          "gradient_accumulation_steps": 2}
