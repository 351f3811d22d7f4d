"""The trained adapters served by vLLM for the CAT pipeline's on-policy collection and its
evaluations, instead of toolself's own engine: `vllm serve BASE --enable-lora --lora-modules
NAME=ADAPTER --served-model-name BASE_NAME`, reached as `openai:NAME@URL` (and the base as
`openai:BASE_NAME@URL`: a name, not the base's path, which differs where a run resumes with its
student mounted elsewhere).

A vLLM server takes most of its GPU's memory as it starts (`--gpu-memory-utilization`, 0.9) and
keeps it while it runs, so the pipeline runs one server at a time and stops each, waiting until
it has exited, before the next server or a training step starts. A server runs in a session of
its own, so that stopping it stops the engine processes it started; its pid is kept in
`OUT/vllm-NAME.pid` until it is stopped, so that one left behind by a step whose process was
killed is stopped by the pipeline, or by the next server's start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from toolself.interrupts import StoppedEarly


class ServerError(RuntimeError):
    """A server that did not start, or a port another server holds."""


# The values vLLM's --max-lora-rank takes (`MaxLoRARanks` in vllm/config/lora.py): any other
# fails the server's start.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """The --max-lora-rank that serves an adapter of `rank`: the smallest vLLM takes that holds it
    (vLLM sizes its LoRA buffers by it)."""
    for allowed in MAX_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ServerError(f"LoRA rank {rank}: vLLM serves LoRA adapters of rank {MAX_LORA_RANKS[-1]} at most (train "
                      f"with lora_r {MAX_LORA_RANKS[-1]} or less, or serve without --vllm)")


@dataclass
class Served:
    """A running server: its URL, and the name it serves the base model under."""

    url: str
    base_name: str

    def spec(self, name: str) -> str:
        return f"openai:{name}@{self.url}"


@dataclass
class AdapterServer:
    """How to serve an adapter: the vLLM command, the port, how long a start may take."""

    command: str = "vllm"
    port: int = 8001
    startup_seconds: float = 1200.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @contextmanager
    def serving(self, name: str, adapter: Path, folder: Path, base_name: str = "base") -> Iterator[Served]:
        """The server of `adapter`, named `name`, on the base it was trained on (served as
        `base_name`), while the block runs. Its output goes to `folder/vllm-NAME.log`."""
        from toolself.train.merge import adapter_base

        if not (adapter / "adapter_config.json").is_file():
            raise ServerError(f"{adapter} holds no LoRA adapter: vLLM serves adapters here (a full fine-tune is "
                              "served as a model of its own)")
        base = adapter_base(adapter)
        stop_servers(folder)
        if answers(self.url):
            raise ServerError(f"port {self.port} is taken by another server: stop it, or choose another port")
        rank = int(json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8")).get("r", 16))
        command = [self.command, "serve", str(base), "--enable-lora", "--max-lora-rank", str(max_lora_rank(rank)),
                   "--lora-modules", f"{name}={adapter}", "--served-model-name", base_name, "--port", str(self.port)]
        log = folder / f"vllm-{name}.log"
        with open(log, "ab") as output:
            try:
                process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
            except OSError as exc:
                raise ServerError(f"{self.command} cannot be started: {exc}") from None
        (folder / f"vllm-{name}.pid").write_text(str(process.pid))
        try:
            deadline = time.monotonic() + self.startup_seconds
            while not answers(self.url):
                if process.poll() is not None:
                    raise ServerError(f"vLLM exited while starting (exit code {process.returncode}): see {log}")
                if time.monotonic() > deadline:
                    raise ServerError(f"vLLM did not answer on port {self.port} in {self.startup_seconds:.0f} s: "
                                      f"see {log}")
                time.sleep(1)
            try:
                yield Served(self.url, base_name)
            except StoppedEarly as exc:
                if process.poll() is None:
                    raise
                raise type(exc)(f"{exc} The vLLM server of {name} had exited (exit code {process.returncode}): see "
                                f"{log}.") from exc
        finally:
            stop(process.pid)
            process.wait()
            (folder / f"vllm-{name}.pid").unlink(missing_ok=True)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/models", timeout=5):
            return True
    except OSError:
        return False


def stop(pid: int, grace_seconds: float = 120.0) -> None:
    """Stop the session `pid` leads (the server and the processes it started), then wait until
    none of them runs: a GPU's memory comes back only then."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while running(pid):
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.2)


def running(group: int) -> bool:
    """Whether a process of `group` still runs. One that has exited but is not yet reaped (a
    zombie, which a parent that never waits keeps) holds no memory and does not count."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
            return True
        except ProcessLookupError:
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            return True
    return False


def stop_servers(folder: Path) -> None:
    """Stop every server whose pid file is in `folder`: ones a killed step left running."""
    for pid_file in Path(folder).glob("vllm-*.pid"):
        try:
            stop(int(pid_file.read_text()))
        except ValueError:
            pass
        pid_file.unlink(missing_ok=True)
