"""A language-model head that scores only the labelled positions, for devices without Triton.

TRL's trainers ask the model for per-token log-probabilities through a fused head
(`model(..., labels=labels, fused_lm_head=True)`). With Triton it projects only the positions
whose label counts; without it (CPUs) it projects *every* position onto the vocabulary, in
tiles, so that tile shapes never change. Our sequences are mostly prompt: ~85% of an RFT
sequence and ~95% of a KTO decision carry no label, so on a CPU the tiled head over the whole
vocabulary is a large share of a step (docs/notes/2026-12-02-training-faster-on-a-cpu.md).
This head gathers the labelled hidden states first and projects those alone; it returns the same
`FusedCausalLMOutput` fields the trainers read (log-probabilities, entropy, top-1 hits, mean
logits), zero on unlabelled positions.
"""

from __future__ import annotations

import types
from typing import Any

IGNORE = -100


def use_compact_head(model: Any) -> bool:
    """Give the transformers model under `model` (a PEFT wrapper or the model itself) the
    compact head, unless its device runs TRL's Triton kernels. Returns whether it did."""
    from trl.trainer.utils import _use_triton

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if _use_triton(base.get_output_embeddings().weight.device):
        return False
    fused_forward = base.forward  # TRL's, which keeps the plain forward for calls without fused_lm_head

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head or shift_labels is not None or getattr(self.config, "final_logit_softcapping", None):
            return fused_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                                 num_items_in_batch=num_items_in_batch, **kwargs)
        return _score_labelled(self, args, kwargs, labels, num_items_in_batch)

    base.forward = types.MethodType(forward, base)
    return True


def _score_labelled(model: Any, args: tuple, kwargs: dict[str, Any], labels, num_items_in_batch):
    import torch
    from trl.trainer.utils import FusedCausalLMOutput

    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    mask = targets != IGNORE
    chosen = targets[mask]
    logits = model.get_output_embeddings()(hidden[mask]).float()
    log_z = logits.logsumexp(-1)
    picked = logits.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        probs = (logits - log_z.unsqueeze(-1)).exp()
        entropy = log_z - (probs * logits).sum(-1)
        top1 = logits.argmax(-1) == chosen
        mean_logits = logits.mean(-1)

    def spread(values):
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    log_probs = spread(picked - log_z)
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs, entropy=spread(entropy),
                               is_top1=spread(top1), mean_logits=spread(mean_logits), label_mask=mask)
