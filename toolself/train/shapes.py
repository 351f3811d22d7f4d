"""Random-initialised models of named shapes: training and decoding measured without weights.

Speed and memory depend on a model's shape, not on its weights, and no weights may be
downloaded here; the numbers of `benchmarks/train_gpu.py` and the miniature CAT run of CI come
from these. Every shape uses the default model's tokenizer (SmolLM2's 49,152 tokens), so the
built-in suites render as they do for the embedded model; a real Qwen3 has 151,936 tokens, so
its output head is ~3x larger than these shapes' (~0.47 of 8.2 GFLOP per token at 8B).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (model type, dimensions): the published configurations' sizes.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": ("llama", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "smollm2-135m": ("llama", {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                               "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True,
                               "rope_theta": 100000.0}),
    "qwen3-0.6b": ("qwen3", {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                             "tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen3-8b": ("qwen3", {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                           "tie_word_embeddings": False, "rope_theta": 1000000.0}),
}


def random_model(shape: str, dtype: Any = None, seed: int = 0, tokenizer: str | Path | None = None,
                 device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer): a random-initialised model of `shape` with the default tokenizer (or
    the one in the folder `tokenizer`: a machine without the default model's weights), built on
    `device`, by default the GPU when there is one (an 8B model in bfloat16: ~16 GB, seconds
    there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from toolself.models.weights import default_model_dir
    from toolself.train.merge import default_dtype

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or default_model_dir()))
    kind, dims = SHAPES[shape]
    config = AutoConfig.for_model(kind, vocab_size=len(tokenizer), max_position_embeddings=32768,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, **dims)
    torch.manual_seed(seed)
    with torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or default_dtype())
    return model, tokenizer


def random_model_dir(shape: str, out: str | Path, dtype: Any = None, seed: int = 0,
                     tokenizer: str | Path | None = None) -> Path:
    """Write `random_model(shape, ...)` into `out` (reused when it already holds one); it loads
    and trains like any model directory."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    out = Path(out)
    if (out / "config.json").is_file():
        return out
    model, tokenizer = random_model(shape, dtype, seed, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
