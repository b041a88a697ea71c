"""Lane cgroups under systemd's delegation (`system.cgroups.cgroups_base`): a process whose own
cgroup carries systemd's `trusted.delegate` mark makes its tree's cgroups below it, so the
lanes belong to the unit; without the mark they go under the cgroup2 mount as before.

Real cgroups: the test makes a cgroup (the "unit's"), marks it as systemd does, runs a
Python child in it, and asks the child where its lanes would go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra_sup.system.cgroups import TOP, cgroup2_root, kill_tree_sync
from orchestra_sup.system.lanecgroups import LaneCgroups

PROBE = """
import json, sys
from pathlib import Path
from orchestra_sup.system.cgroups import cgroups_base, delegated_cgroup, tree_path
from orchestra_sup.system.lanecgroups import LaneCgroups
lanes = LaneCgroups("t" + "0" * 11, "shard-0")
made = lanes.create("lane-1")
print(json.dumps({
    "delegated": str(delegated_cgroup()),
    "base": str(cgroups_base()),
    "tree": str(tree_path(sys.argv[1])),
    "lane": str(made),
    "killed": lanes.kill_all_sync(),
}))
"""


@pytest.fixture
def unit_cgroup() -> Iterator[Path]:
    """A fresh cgroup directly under the cgroup2 mount, standing for a unit's; removed after."""
    root = cgroup2_root()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy (needs root and a cgroup2 mount)")
    path = root / f"osup-test-unit-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        for below in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
            if below.is_dir():
                below.rmdir()
        path.rmdir()


def mark_delegated(path: Path) -> None:
    try:
        os.setxattr(path, "trusted.delegate", b"1")
    except OSError as exc:
        pytest.skip(f"cannot set trusted.delegate on a cgroup here: {exc.strerror}")


def probe(cgroup: Path, run_dir: Path) -> dict[str, str]:
    """Where a process running in `cgroup` puts its lanes."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(run_dir)],
        preexec_fn=LaneCgroups.join_fn(cgroup),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_lanes_go_below_a_delegated_cgroup(unit_cgroup: Path, tmp_path: Path) -> None:
    """In a cgroup marked delegated, the tree's and lanes' cgroups are made inside it (and the
    shard's kill-all removes them again)."""
    mark_delegated(unit_cgroup)
    where = probe(unit_cgroup, tmp_path)
    assert where["delegated"] == where["base"] == str(unit_cgroup)
    assert Path(where["tree"]).parent == unit_cgroup / TOP
    assert Path(where["lane"]) == unit_cgroup / TOP / ("t" + "0" * 11) / "shard-0" / "lane-1"
    assert where["killed"] is True
    assert kill_tree_sync(Path(where["tree"]))  # accepted as ours below the unit's cgroup


def test_an_unmarked_cgroup_is_not_used(unit_cgroup: Path, tmp_path: Path) -> None:
    """Without systemd's mark the process's own cgroup is not ours to fill: lanes go under the
    cgroup2 mount, as outside systemd."""
    where = probe(unit_cgroup, tmp_path)
    assert where["delegated"] == "None"
    assert where["base"] == str(cgroup2_root())
    assert Path(where["lane"]).is_relative_to(Path(where["base"]) / TOP)
    assert where["killed"] is True
