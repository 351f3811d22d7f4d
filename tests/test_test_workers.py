"""`make test` runs the tests in pytest-xdist workers, each kept to its own share of the cores
(tests/conftest.py), so that two workers that both compute do not run four torch threads on two
cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")

# Started from every core the machine lets it use, as pytest-xdist starts a worker (the test
# running it may itself be a pinned worker).
AFFINITY_OF_A_WORKER_AND_ITS_CHILD = """
import json, os, subprocess, sys
import conftest
os.sched_setaffinity(0, range(os.cpu_count()))
cores = sorted(os.sched_getaffinity(0))
conftest.keep_to_this_workers_cores()
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout
print(json.dumps({"cores": cores, "worker": sorted(os.sched_getaffinity(0)), "child": json.loads(child)}))
"""



def affinity_of(worker: str, workers: int) -> dict[str, list[int]]:
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": str(workers),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", AFFINITY_OF_A_WORKER_AND_ITS_CHILD], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_two_workers_keep_to_disjoint_shares_of_the_cores_and_so_do_the_processes_they_start():
    first, second = affinity_of("gw0", 2), affinity_of("gw1", 2)
    if len(first["cores"]) < 2:
        pytest.skip("one core: nothing to share out")
    assert first["worker"] == first["child"] and second["worker"] == second["child"]
    assert first["worker"] and second["worker"] and not set(first["worker"]) & set(second["worker"])
    assert sorted(first["worker"] + second["worker"]) == first["cores"]


def test_more_workers_than_cores_are_left_unpinned():
    probe = affinity_of("gw0", 1)
    assert affinity_of("gw0", len(probe["cores"]) + 1)["worker"] == probe["cores"]
