"""Merging a LoRA adapter into its base: for serving without `--enable-lora`, and for training
KTO on top of the RFT model (the merged model is then both the starting point and, with the new
adapter disabled, the reference)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any


def adapter_base(adapter_dir: str | Path) -> Path:
    """The base model directory an adapter was trained on (see `weights.adapter_base`)."""
    from toolself.models.base import ModelError
    from toolself.models.weights import adapter_base as find_base

    try:
        return find_base(adapter_dir)
    except ModelError as exc:
        raise FileNotFoundError(str(exc)) from None


def default_dtype():
    """bfloat16 on a GPU that multiplies in it (not one that emulates it), float32 elsewhere.
    Never "auto": transformers may then pick a 16-bit type for a float32 checkpoint, and a merge
    would round the base's weights."""
    import torch

    from toolself.models.weights import gpu_has_bfloat16

    return torch.bfloat16 if gpu_has_bfloat16() else torch.float32


def merged_model(adapter_dir: str | Path, dtype: Any = None):
    """(model with the adapter merged in, tokenizer)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolself.models.weights import ignore_library_deprecations

    ignore_library_deprecations()
    adapter_dir = Path(adapter_dir)
    base = adapter_base(adapter_dir)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype or default_dtype())
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    own_tokenizer = (adapter_dir / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir if own_tokenizer else base))
    return model, tokenizer


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, dtype: Any = None) -> Path:
    """Write adapter + base as one plain transformers directory (written aside, then renamed
    into place, so an interrupted merge never leaves a half-written model behind)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        raise FileExistsError(f"{out_dir} already holds a model")
    model, tokenizer = merged_model(adapter_dir, dtype)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


MERGED_FROM = "merged_from.json"


def prepare_base(path: str | Path, out_dir: str | Path) -> Path:
    """The directory to train from: `path` itself when it is a full model, else its adapter
    merged into `out_dir/base` (kept: a new adapter names it as its base). A merge is reused
    only for the adapter it was made from (`merged_from.json`): RFT retrained into the same
    folder leaves another adapter there, and KTO would otherwise start from the old one."""
    from toolself.models.digests import base_identity, same_base
    from toolself.train.reruns import read_json

    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        return path
    target = Path(out_dir) / "base"
    source = base_identity(path)
    if not same_base(read_json(target / MERGED_FROM) or {}, source) or not (target / "config.json").is_file():
        shutil.rmtree(target, ignore_errors=True)
        merge_adapter(path, target)
        (target / MERGED_FROM).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return target.resolve()
