"""A LoRA adapter with random (non-zero) weights on a model directory: a different model for
each seed, saved with the base's tokenizer as `train rft` saves an adapter."""

from pathlib import Path


def random_lora_adapter(base: Path, folder: Path, seed: int, rank: int = 4) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=rank, target_modules=["q_proj"], init_lora_weights=False)).save_pretrained(
        str(folder))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(folder))
