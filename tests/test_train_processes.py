"""Training launched as several processes (torchrun, accelerate launch) is one run of several
processes, on a machine without a GPU too (gloo), whatever the precision."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]

WORLD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from toolself.train.kto_config import CATKTOConfig
    from toolself.train.rft_config import RFTConfig

    bf16, out = sys.argv[1] == "bf16", Path(sys.argv[2])
    configs = {"rft": RFTConfig(output_dir="unused", bf16=bf16), "kto": CATKTOConfig(output_dir="unused", bf16=bf16)}
    seen = {stage: [config.process_index, config.world_size] for stage, config in configs.items()}
    (out / f"{configs['rft'].process_index}.json").write_text(json.dumps(seen))
""")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_processes_under_torchrun_form_one_group_of_two(tmp_path, precision):
    script = tmp_path / "world.py"
    script.write_text(WORLD)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), precision, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert seen == {f"{rank}.json": {"rft": [rank, 2], "kto": [rank, 2]} for rank in (0, 1)}
