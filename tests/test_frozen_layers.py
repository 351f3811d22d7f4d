"""The frozen-layer cache: later epochs skip the layers below the adapters and lose nothing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from toolself.train.frozen_layers import cache_frozen_layers, frozen_layer_count  # noqa: E402
from toolself.train.lora import LoraArguments  # noqa: E402


@pytest.fixture
def student():
    from toolself.models.weights import MissingWeightsError, default_model_dir

    try:
        return default_model_dir()
    except MissingWeightsError as exc:
        pytest.skip(str(exc))


def adapted(student, lora_layers: int):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(student), dtype=torch.float32)
    peft = get_peft_model(model, LoraArguments(lora_layers=lora_layers).peft_config(model))
    for name, p in peft.named_parameters():
        if "lora_B" in name:  # as after some training, so that the adapters change the output
            torch.nn.init.normal_(p, std=0.02)
    peft.train()
    return peft


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def batch(seed: int, length: int = 40):
    return torch.randint(0, 5000, (1, length), generator=torch.Generator().manual_seed(seed))


def test_a_second_pass_reuses_the_frozen_layers_and_gives_the_same_loss_and_gradients(student):
    model = adapted(student, lora_layers=3)
    ids = batch(0)
    reference = loss_and_grads(model, ids)
    cache = cache_frozen_layers(model)
    assert cache is not None and cache.frozen == model.config.num_hidden_layers - 3
    first = loss_and_grads(model, ids)
    second = loss_and_grads(model, ids)
    assert (cache.misses, cache.hits, len(cache.outputs)) == (1, 1, 1)
    for loss, grads in (first, second):
        assert torch.equal(loss, reference[0])
        assert all(torch.equal(grads[n], g) for n, g in reference[1].items())


@pytest.mark.slow
def test_the_cache_wraps_compiled_layers_and_replays_what_they_computed(student):
    from toolself.train.compiled_layers import compile_decoder_layers, compiler_missing

    if compiler_missing():
        pytest.skip(compiler_missing())
    model = adapted(student, lora_layers=3)
    ids = batch(0)
    eager = loss_and_grads(model, ids)
    compile_decoder_layers(model)
    cache = cache_frozen_layers(model)
    first = loss_and_grads(model, ids)
    second = loss_and_grads(model, ids)
    assert (cache.misses, cache.hits) == (1, 1)
    assert torch.equal(first[0], second[0]) and all(torch.equal(first[1][n], g) for n, g in second[1].items())
    assert float(first[0]) == pytest.approx(float(eager[0]), rel=1e-4)
    assert all(torch.allclose(first[1][n], g, rtol=1e-3, atol=1e-6) for n, g in eager[1].items())


def test_a_different_sequence_is_computed_not_replayed(student):
    model = adapted(student, lora_layers=3)
    cache = cache_frozen_layers(model)
    loss_and_grads(model, batch(0))
    other = batch(1)
    assert torch.equal(loss_and_grads(model, other)[0], torch.as_tensor(_uncached_loss(student, other)))
    assert (cache.misses, cache.hits) == (2, 0)


def _uncached_loss(student, ids) -> float:
    model = adapted(student, lora_layers=3)
    with torch.no_grad():
        return model(input_ids=ids, labels=ids, use_cache=False).loss


def test_the_adapter_disabled_reference_pass_reuses_the_policys_frozen_layers(student):
    model = adapted(student, lora_layers=3)
    ids = batch(2)
    with torch.no_grad(), model.disable_adapter():
        expected = model(input_ids=ids, use_cache=False).logits
    cache = cache_frozen_layers(model)
    with torch.no_grad():
        policy = model(input_ids=ids, use_cache=False).logits
        with model.disable_adapter():
            reference = model(input_ids=ids, use_cache=False).logits
    assert cache.hits == 1 and torch.equal(reference, expected) and not torch.equal(policy, reference)


def test_decoding_with_a_kv_cache_runs_every_layer(student):
    model = adapted(student, lora_layers=3)
    ids = batch(3, length=12)
    model.eval()
    expected = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    cache = cache_frozen_layers(model)
    model(input_ids=ids, use_cache=False)  # cached ...
    assert torch.equal(model.generate(input_ids=ids, max_new_tokens=4, do_sample=False), expected)  # ... not replayed
    model(input_ids=ids)  # nor for a forward that builds a KV cache by the config's default
    assert cache.hits == 0 and len(cache.outputs) == 1


def test_memory_is_bounded_and_past_the_bound_sequences_are_just_computed(student):
    model = adapted(student, lora_layers=3)
    cache = cache_frozen_layers(model, max_bytes=40 * model.config.hidden_size * 4)  # one 40-token batch
    with torch.no_grad():
        for seed in (0, 1, 0, 1):
            model(input_ids=batch(seed), use_cache=False)
    assert len(cache.outputs) == 1 and (cache.hits, cache.misses) == (1, 3)


def test_nothing_is_cached_when_every_layer_is_adapted(student):
    model = adapted(student, lora_layers=0)
    assert frozen_layer_count(model.get_base_model().get_decoder().layers) == 0
    assert cache_frozen_layers(model) is None


def tiny_adapted(lora_layers: int = 2):
    """A random four-layer llama with adapters on its top layers: no weights to load."""
    from peft import get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    base = LlamaForCausalLM(config)
    model = get_peft_model(base, LoraArguments(lora_layers=lora_layers).peft_config(base))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    model.train()
    return model


def checkpoint_whole_layer_calls(model) -> None:
    """Checkpoint each decoder layer's whole call, its instance `forward` included, as
    transformers did up to 5.17 (`GradientCheckpointingLayer.__call__`); 5.18 moved the
    checkpoint into the class's `forward`, under an instance's own."""
    from functools import partial

    for layer in model.get_base_model().get_decoder().layers:
        cls = type(layer)

        class WholeCallCheckpointed(cls):
            def __call__(self, *args, **kwargs):
                if self.gradient_checkpointing and self.training:
                    return self._gradient_checkpointing_func(partial(torch.nn.Module.__call__, self, **kwargs), *args)
                return torch.nn.Module.__call__(self, *args, **kwargs)

        WholeCallCheckpointed.forward = getattr(cls.forward, "__wrapped__", cls.forward)
        layer.__class__ = WholeCallCheckpointed


def padded_pair():
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, 16:] = 0  # a shorter second sequence, right-padded as TRL's collator pads it
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def padded_loss_and_grads(model, ids, mask, labels):
    model.zero_grad()
    loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("whole_call", [True, False], ids=["transformers-5.17", "installed-transformers"])
def test_under_gradient_checkpointing_the_cache_trains_exactly_as_the_plain_model(whole_call, reentrant):
    batch = padded_pair()
    reference = padded_loss_and_grads(tiny_adapted(), *batch)
    model = tiny_adapted()
    base = model.get_base_model()
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:  # transformers before 5.24
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.enable_input_require_grads()  # as TRL does for PEFT with gradient checkpointing
    if whole_call:
        checkpoint_whole_layer_calls(model)
    cache = cache_frozen_layers(model)
    for _ in range(2):  # the first computes and keeps the frozen block, the second replays it
        loss, grads = padded_loss_and_grads(model, *batch)
        torch.testing.assert_close(loss, reference[0])
        assert grads.keys() == reference[1].keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference[1][name], msg=name)
    assert (cache.misses, cache.hits) == (1, 1)


def test_the_frozen_layers_keep_no_activations_for_a_backward_pass():
    model = tiny_adapted()
    model.enable_input_require_grads()
    cache_frozen_layers(model)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        plain = len(saved)
        model(input_ids=padded_pair()[0], use_cache=False)
    adapted_only = len(saved) - plain
    saved.clear()
    every = tiny_adapted(lora_layers=4)
    every.enable_input_require_grads()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        every(input_ids=padded_pair()[0], use_cache=False)
    assert 0 < adapted_only < len(saved) * 0.6  # two of four layers keep activations, not all four
