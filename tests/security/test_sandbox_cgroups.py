"""Where an attempt's control group goes and what it is given (issue 25, finding 6).

The machine these tests usually run on offers the cgroup v1 hierarchies, which
test_sandbox_processes.py exercises for real; the choice of a v2 group and the files written
into it are checked here against a hierarchy laid out as the kernel lays out cgroup2.
"""

from pathlib import Path

import pytest

from toolself.tools import cgroups
from toolself.tools.cgroups import AttemptCgroup, Hierarchy

pytestmark = pytest.mark.timeout(30)


def cgroup2(root: Path, own: str, controllers: str, enabled: str = "") -> Path:
    """A cgroup2 mount at `root` whose group `own` offers `controllers` and enables `enabled` below it."""
    for path in (root, root / own.lstrip("/")):
        path.mkdir(parents=True, exist_ok=True)
        (path / "cgroup.controllers").write_text(controllers + "\n")
        (path / "cgroup.subtree_control").write_text(enabled + "\n")
    return root / own.lstrip("/")


def use(monkeypatch, root: Path, own: str) -> None:
    monkeypatch.setattr(cgroups, "mounts", lambda: [(str(root), "cgroup2", {"rw"})])
    monkeypatch.setattr(cgroups, "_own_paths", lambda: {"": own})


def test_a_v2_group_that_offers_memory_and_pids_is_where_attempts_go(tmp_path, monkeypatch):
    own = cgroup2(tmp_path, "/system.slice/host.service", "cpu memory pids")
    use(monkeypatch, tmp_path, "/system.slice/host.service")
    assert cgroups.hierarchies() == [Hierarchy(2, own, frozenset({"memory", "pids"}))]
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_a_v2_group_without_the_pids_controller_gives_no_hierarchy(tmp_path, monkeypatch):
    cgroup2(tmp_path, "/host", "cpu memory")
    use(monkeypatch, tmp_path, "/host")
    assert cgroups.hierarchies() == []


def test_a_v2_attempt_group_gets_the_memory_and_process_limits_and_no_swap(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroups, "hierarchies", lambda: [Hierarchy(2, tmp_path, frozenset({"memory", "pids"}))])
    group = AttemptCgroup.create(512 << 20, 64)
    assert group is not None and group.version == 2
    (folder,) = group.dirs
    assert folder.parent == tmp_path and folder.name.startswith(cgroups.PREFIX)
    written = {name: (folder / name).read_text() for name in ("memory.max", "memory.swap.max", "pids.max")}
    assert written == {"memory.max": str(512 << 20), "memory.swap.max": "0", "pids.max": "64"}
    assert (folder / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert group.session("session-1") == [folder / "session-1"]


def test_a_v2_group_counts_the_attempts_oom_kills_from_its_memory_events(tmp_path):
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert AttemptCgroup([tmp_path], 2).oom_kills() == 2
