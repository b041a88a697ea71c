"""A full state disk is a state, not a crash (issue 22, `system.reserve`): a real tree whose state
directory is a small tmpfs, filled past `[state] min_free` while a lane runs. New submissions are
refused in one line, the running lane finishes and its result is kept, `ctl status` and the
metrics say so, and once space is freed the refused plan is accepted and runs; a coordinator
SIGKILL afterwards loses none of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, git, make_repo, plan, task, wait_until
from tests.integration.test_cli import assert_one_line_error, write
from tests.integration.test_ctl_access import cli

pytestmark = pytest.mark.integration

DISK_BYTES = 96 << 20
MIN_FREE = 32 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 MiB tmpfs at `tmp_path/disk`, unmounted after the tree on it stopped (this fixture
    is set up before `tree_factory`, so it is torn down after it)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_to(disk: Path, free_bytes: int) -> Path:
    """Write one file on `disk` so that about `free_bytes` stay free; return it."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    with filler.open("wb") as out:
        out.truncate(0)
        chunk = b"\0" * (1 << 20)
        for _ in range(max(0, (st.f_bavail * st.f_frsize - free_bytes) >> 20)):
            out.write(chunk)
    return filler


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not served")


def test_a_full_state_disk_refuses_new_plans_and_resumes_by_itself(
    small_disk: Path, tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    config = write(
        tmp_path / "tree.toml",
        f"[state]\nmin_free = {MIN_FREE}\n[supervisor]\nmetrics_port = 0\n",
    )
    tree = tree_factory(shards=1, config=config, state_dir=small_disk / "state")
    run_dir = str(tree.run_dir)
    gate = tmp_path / "gate"
    running = tree.submit(
        plan("running", task("a", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo kept"))
    )
    wait_until(lambda: tree.task(running).status == "running", 30, "the lane to run")

    filler = fill_to(small_disk, MIN_FREE // 2)
    new = write(tmp_path / "new.toml", 'name = "new"\n[[task]]\nid = "b"\nrun = "echo b"\n')
    refused = cli("ctl", "--run-dir", run_dir, "submit", str(new))
    assert_one_line_error(refused, 1, "state disk nearly full", "[state] min_free")
    with pytest.raises(RemoteError, match="state disk nearly full") as lane:
        tree.call("start_lane", run="true")
    assert lane.value.code is ErrorCode.STATE_DEGRADED

    status = json.loads(cli("ctl", "--run-dir", run_dir, "status", "--json").stdout)
    assert status["supervisor"]["state_disk"]["free"] < MIN_FREE
    assert "refusing new plans and lanes" in cli("ctl", "--run-dir", run_dir, "status").stdout
    url = tree.status().metrics_url
    assert metric(url, "orchestra_sup_state_disk_short") == 1.0

    gate.touch()  # the running lane finishes, inside the reserve, and its result is kept
    done = tree.wait_plan(running, 30)
    assert done.ok and done.tasks[0].output_tail.strip() == "kept"

    filler.unlink()
    accepted = cli("ctl", "--run-dir", run_dir, "submit", str(new), "--json")
    assert accepted.returncode == 0, accepted.stderr
    second = json.loads(accepted.stdout)["id"]
    assert tree.wait_plan(second, 30).ok
    assert metric(url, "orchestra_sup_state_disk_short") == 0.0

    coordinator = tree.child("coordinator")
    assert coordinator.pid is not None
    os.kill(coordinator.pid, signal.SIGKILL)
    tree.wait_running("coordinator", coordinator.generation + 1)
    for plan_id in (running, second):
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport) and report.ok, report


BIG_BYTES = 24 << 20


def test_an_accepted_task_waits_for_room_for_its_sandbox_and_ended_ones_make_way(
    small_disk: Path, tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """The workspace holds a 24 MiB file, so each sandbox takes 24 MiB of the 96 MiB state
    disk. While a runs, the disk is filled to 12 MiB free (short of its 32 MiB reserve). b,
    which needs a, cannot get a sandbox: it waits instead of failing. The custodian, the disk
    short, removes a's ended sandbox at once (`sandboxes_s` is a day), which makes room for
    b's: the plan succeeds without anyone freeing space."""
    repo = make_repo(tmp_path / "ws")
    (repo / "big").write_bytes(os.urandom(BIG_BYTES))
    git(repo, "add", "big")
    git(repo, "commit", "-q", "-m", "big")
    config = write(
        tmp_path / "tree.toml",
        f"[state]\nmin_free = {MIN_FREE}\n[retention]\nevery_s = 0.5\n",
    )
    tree = tree_factory(workspace=repo, shards=1, config=config, state_dir=small_disk / "state")
    gate = tmp_path / "gate"
    plan_id = tree.submit(
        plan(
            "two",
            task("a", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo a"),
            task("b", "echo b", needs=["a"]),
        )
    )
    wait_until(lambda: tree.task(plan_id, "a").status == "running", 30, "a to run")
    sandbox_a = small_disk / "state" / "sandboxes" / str(tree.task(plan_id, "a").lane)
    wait_until(lambda: (sandbox_a / "big").exists(), 10, "a's sandbox")
    assert (sandbox_a / "big").stat().st_size == BIG_BYTES
    fill_to(small_disk, 12 << 20)
    gate.touch()
    done = tree.wait_plan(plan_id, 60)
    assert done.ok, [(t.id, t.status, t.error) for t in done.tasks]
    assert not sandbox_a.exists()
