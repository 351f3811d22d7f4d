"""What a model directory holds, so that a run moved to another node, or resumed with its model
mounted elsewhere, knows the model by more than its path. Training runs know their base by it
(`train.reruns`), evaluations the `local:` models they ran (`evals.runner`) and a CAT run its
student (`train.pipeline`). An adapter names its base by the path it was trained on; where the
base is now mounted elsewhere, `relocate_base` says where (`weights.adapter_base` looks there)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def base_identity(base: Path) -> dict[str, Any]:
    """The base's resolved path, and a digest of what it holds, which decides (`same_base`): for
    an adapter (a few MB), of its files, since a KTO run stands on an RFT adapter that a rerun of
    RFT may replace in the same folder; for a full model (16 GB for 8B), of its config and its
    weight files' names and sizes. A run folder moved or copied to another node, or a model
    mounted elsewhere there, is the same base (`same_base` says when the path matters)."""
    identity: dict[str, Any] = {"path": str(base.resolve())}
    digest = hashlib.sha256()
    if (base / "adapter_config.json").is_file():
        for name in sorted(p.name for p in base.glob("adapter_model.*")) + ["adapter_config.json"]:
            with open(base / name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        identity["adapter"] = digest.hexdigest()
    elif (base / "config.json").is_file():
        digest.update((base / "config.json").read_bytes())
        for weights in sorted(p for p in base.iterdir() if p.suffix in (".safetensors", ".bin")):
            digest.update(f"{weights.name}:{weights.stat().st_size}\n".encode())
        identity["model"] = digest.hexdigest()
    return identity


def local_model_identity(spec: Any) -> dict[str, Any] | None:
    """`base_identity` of the directory a `local:` model spec names; None for any other spec, or
    for a directory that is not there (loading the model says so, with the path)."""
    if getattr(spec, "kind", None) != "local":
        return None
    try:
        return base_identity(spec.weights())
    except FileNotFoundError:
        return None


def same_base(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two recorded bases are one model. An adapter's digest covers every byte, so it
    decides alone. A full model's covers its config and its files' names and sizes, which two
    checkpoints of one shape can share: it decides where the path is the same or the old one is
    gone (a run folder moved, a model mounted elsewhere on another node), and while the old path
    is still there a model at another path is another model. Bases recorded without a digest
    (full models were known by their path alone before) are known by their path."""
    if "adapter" in was and "adapter" in now:
        return was["adapter"] == now["adapter"]
    if "model" in was and "model" in now:
        path = was.get("path")
        return was["model"] == now["model"] and (path == now.get("path") or not path or not Path(path).exists())
    return was.get("path") == now.get("path") and was.get("adapter") == now.get("adapter")


BASE_LOCATION = "base_location.json"


def relocated_base(adapter_dir: Path) -> Path | None:
    """Where `relocate_base` last said the adapter's base is mounted, or None."""
    try:
        return Path(json.loads((Path(adapter_dir) / BASE_LOCATION).read_text(encoding="utf-8"))["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def relocate_base(adapter_dir: Path, base: Path) -> None:
    """Record that the base of the adapter in `adapter_dir` is mounted at `base` now, for a
    command that has checked the base's digest (a CAT run its student's, before any step; a
    rerun of a finished `train rft`, the base it is given). The adapter's own files stay as
    trained, so its digest, which KTO's merge and evaluations recorded, stands; the path it
    names still wins while it is there. Nothing is recorded for a base that is an adapter itself
    (training merged it into the adapter's own `base/`, which `adapter_base` finds), nor for a
    folder that holds no adapter (a full fine-tune)."""
    adapter_dir, base = Path(adapter_dir), Path(base).resolve()
    if (base / "adapter_config.json").is_file():
        return
    try:
        named = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # an adapter cut short while saving: its step trains it again, naming the base as it is now
    if (named and Path(named).resolve() == base) or relocated_base(adapter_dir) == base:
        return
    tmp = adapter_dir / f".{BASE_LOCATION}.{os.getpid()}"
    tmp.write_text(json.dumps({"path": str(base)}) + "\n", encoding="utf-8")
    os.replace(tmp, adapter_dir / BASE_LOCATION)
