"""torchrun as the tests launch it: several processes on this machine, on gloo."""

import sys
from pathlib import Path


def torchrun(processes: int, logs: Path) -> list[str]:
    """The command that runs a script in `processes` processes, with torchrun's logs in `logs`:
    left to itself, torchrun leaves a folder of them in the system's temporary folder per run."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "--log-dir", str(logs)]
