"""The cores this process may compute on: what the engine's threads and the threads that load
a model are sized from; and the name of the CPU they belong to."""

from __future__ import annotations

import os
import platform


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC 7B13"), for benchmark records: the same code runs at
    different speeds on CPUs of one architecture (with AMX or without, say), which
    `platform.processor()` does not tell apart ("x86_64")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
