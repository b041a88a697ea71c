"""Tests for `orchestra_sup.system.cgroups`, against real cgroup v2 directories where available.

Tests that need a writable cgroup v2 hierarchy skip (with the reason) where `cgroup2_root()` is
None; every cgroup a test makes is killed and removed by its fixture, also when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra_sup.shards.shell import run_shell
from orchestra_sup.system import cgroups as cg
from orchestra_sup.system.cgroups import (
    TOP,
    cgroup2_root,
    kill_tree_sync,
    tree_id,
    tree_path,
)
from orchestra_sup.system.lanecgroups import LaneCgroups
from tests.procs import dead as _dead

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
SHARD = "shard-t"


def _alive(pid: int) -> bool:
    return not _dead(pid, timeout_s=0)


def _reap(pids: list[int]) -> None:
    """Reap those of `pids` that were reparented to this process (when it is a subreaper)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _procs(path: Path) -> set[int]:
    """Every pid in the cgroup at `path` and below it."""
    pids: set[int] = set()
    for dirpath, _dirs, _files in os.walk(path):
        pids |= {int(t) for t in (Path(dirpath) / "cgroup.procs").read_text().split()}
    return pids


def _sleeper(cgroup: Path) -> subprocess.Popen[bytes]:
    """A `sleep 300` that is in `cgroup` before it execs."""
    return subprocess.Popen(["sleep", "300"], preexec_fn=LaneCgroups.join_fn(cgroup))


@pytest.fixture
def root() -> Path:
    found = cgroup2_root()
    if found is None:
        pytest.skip(
            "no writable cgroup v2 hierarchy (needs root and a cgroup2 mount, "
            f"and {cg.ENV_SWITCH} not 'off')"
        )
    return found


@pytest.fixture
def cgroups(root: Path, tmp_path: Path) -> Iterator[LaneCgroups]:
    """A `LaneCgroups` for a tree of this test's own; its cgroups are removed afterwards."""
    top_existed = (root / TOP).exists()
    lanes = LaneCgroups(tree_id(tmp_path), SHARD)
    try:
        yield lanes
    finally:
        kill_tree_sync(root / TOP / tree_id(tmp_path))
        if not top_existed:
            with contextlib.suppress(OSError):  # busy: another test or tree uses it
                (root / TOP).rmdir()


# --- real cgroups ----------------------------------------------------------------------------


DAEMONS = """
mkfifo pidpipe
exec 3<>pidpipe
daemon='echo "$0 $$" > pidpipe; exec sleep 300'
setsid sh -c "$daemon" 1setsid </dev/null >/dev/null 2>&1 &
( (sh -c "$daemon" 2double </dev/null >/dev/null 2>&1 &) & )
( (setsid sh -c "$daemon" 3both </dev/null >/dev/null 2>&1 &) & )
read a <&3; read b <&3; read c <&3
echo "pids $(printf '%s\\n' "$a" "$b" "$c" | sort | cut -d' ' -f2 | tr '\\n' ' ')"
"""
"""Starts three `sleep 300`: one setsid'ed, one double-forked, one double-forked and setsid'ed;
each reports its label and pid through a FIFO the command holds open (in whatever order they
get there; the labels sort them back), and the command exits once it has all three (so no sleep
is needed to know they are running)."""


def test_setsid_and_double_fork_die_with_their_lane(cgroups: LaneCgroups, tmp_path: Path) -> None:
    """What escaped the lane's process group is still in its cgroup, and dies with the lane."""

    async def main() -> list[int]:
        path = cgroups.create("lane-1")
        assert path is not None and path.is_dir()
        assert path == cgroups.base / "lane-1"  # type: ignore[operator]
        outcome = await run_shell(
            DAEMONS,
            cwd=tmp_path,
            env=ENV,
            timeout_s=30,
            preexec=LaneCgroups.join_fn(path),
        )
        assert outcome.exit_code == 0, outcome.output_tail
        pids = [int(p) for p in outcome.output_tail.split("pids", 1)[1].split()]
        assert len(pids) == 3
        setsid, _double, setsid_double = pids
        try:
            # run_shell killed the group: the setsid'ed ones outlived it, and the cgroup has them.
            assert _alive(setsid) and _alive(setsid_double)
            assert {setsid, setsid_double} <= _procs(path)
            assert await cgroups.kill("lane-1") is True
            assert all(_dead(pid) for pid in pids)
            assert not path.exists()
            # No other lane: the shard's and the tree's directories went with it.
            assert cgroups.base is not None and not cgroups.base.parent.exists()
        finally:
            _reap(pids)
        return pids

    asyncio.run(main())


def test_kill_reaches_sub_cgroups_and_removes_them(cgroups: LaneCgroups) -> None:
    """A process the lane moved into a cgroup of its own below the lane's is killed too, and the
    lane's cgroups are removed deepest first; the shard's directory stays while another lane has
    a cgroup in it."""
    path, other = cgroups.create("lane-2"), cgroups.create("other")
    assert path is not None and other is not None
    inner = path / "inner" / "deeper"
    inner.mkdir(parents=True)
    procs = [_sleeper(path), _sleeper(inner)]
    try:
        assert {p.pid for p in procs} == _procs(path)
        assert asyncio.run(cgroups.kill("lane-2")) is True
        assert [p.wait(timeout=5) for p in procs] == [-9, -9]
        assert not path.exists()
        assert other.is_dir()  # another lane's cgroup keeps the shard's directory
        assert asyncio.run(cgroups.kill("other")) is True
        assert cgroups.base is not None and not cgroups.base.exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_fallback_without_cgroup_kill(
    cgroups: LaneCgroups, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `cgroup.kill` (Linux < 5.14), the freeze + SIGKILL + thaw path empties the cgroup,
    sub-cgroups included, through both the async and the sync kill."""
    monkeypatch.setattr(cg, "_has_kill_file", lambda _path: False)
    for lane in ("lane-a", "lane-s"):
        path = cgroups.create(lane)
        assert path is not None
        (path / "sub").mkdir()
        procs = [_sleeper(path), _sleeper(path / "sub")]
        try:
            if lane == "lane-a":
                assert asyncio.run(cgroups.kill(lane)) is True
            else:
                assert cgroups.kill_all_sync() is True
            assert [p.wait(timeout=5) for p in procs] == [-9, -9]
            assert not path.exists()
        finally:
            for p in procs:
                p.kill()
                p.wait()


def test_unknown_lane_is_a_no_op_and_bad_names_are_refused(cgroups: LaneCgroups) -> None:
    assert cgroups.available
    assert asyncio.run(cgroups.kill("never-created")) is True
    assert cgroups.base is not None and not (cgroups.base / "never-created").exists()
    for bad in ("", ".", "..", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="lane id"):
            cgroups.create(bad)
        with pytest.raises(ValueError, match="lane id"):
            asyncio.run(cgroups.kill(bad))
    with pytest.raises(ValueError, match="shard name"):
        LaneCgroups("abc", "../etc")
    with pytest.raises(ValueError, match="tree id"):
        LaneCgroups("", SHARD)


def test_kill_tree_sync_kills_every_lane_and_removes_the_tree(
    cgroups: LaneCgroups, root: Path, tmp_path: Path
) -> None:
    """What the supervisor does for a dead shard (or a whole tree): every lane cgroup below the
    path is killed and the whole subtree removed."""
    paths = [cgroups.create("one"), cgroups.create("two")]
    assert all(p is not None for p in paths)
    procs = [_sleeper(p) for p in paths if p is not None]
    try:
        tree = tree_path(tmp_path)
        assert tree == root / TOP / tree_id(tmp_path)
        assert tree is not None and _procs(tree) == {p.pid for p in procs}
        assert kill_tree_sync(tree) is True
        assert [p.wait(timeout=5) for p in procs] == [-9, -9]
        assert not tree.exists()
        assert kill_tree_sync(tree) is True  # gone already: a no-op
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_kill_all_sync_removes_the_shard_and_empty_tree(cgroups: LaneCgroups) -> None:
    assert cgroups.base is not None
    assert cgroups.kill_all_sync() is True  # nothing there yet
    path = cgroups.create("lane-x")
    assert path is not None
    proc = _sleeper(path)
    try:
        assert cgroups.kill_all_sync() is True
        assert proc.wait(timeout=5) == -9
        assert not cgroups.base.exists() and not cgroups.base.parent.exists()
        assert cgroups.create("lane-y") == cgroups.base / "lane-y"  # recreated on demand
    finally:
        proc.kill()
        proc.wait()


def test_kill_tree_sync_refuses_what_is_not_ours(root: Path, cgroups: LaneCgroups) -> None:
    """Only `<cgroup2>/orchestra-sup/<tree>/...` can be killed; a missing path is a no-op."""
    assert cgroups.create("lane-z") is not None  # makes sure <root>/orchestra-sup exists
    with pytest.raises(ValueError, match="not a cgroup of orchestra-sup"):
        kill_tree_sync(root / TOP)
    assert kill_tree_sync(root / TOP / "no-such-tree") is True


@pytest.mark.integration
def test_a_setsid_daemon_dies_with_its_lane_in_a_real_tree(root: Path, tmp_path: Path) -> None:
    """End to end through the shard: a task leaves a setsid'ed daemon behind; by the time the
    task that needs it runs, the daemon is dead (without cgroups it would live on, reparented to
    the supervisor, until the tree stopped). Nothing of the tree's cgroups is left afterwards."""
    pidfile = tmp_path / "daemon.pid"
    daemon = (
        "mkfifo pidpipe; exec 3<>pidpipe; "
        "setsid sh -c 'echo $$ > pidpipe; exec sleep 300' </dev/null >/dev/null 2>&1 & "
        f"read d <&3; echo $d > {pidfile}; grep '^0::' /proc/self/cgroup"
    )
    # Alive means: not gone, not a zombie, and still our sleep (not a recycled pid).
    check = (
        f"p=$(cat {pidfile}); s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); "
        'c=$(cat /proc/$p/comm 2>/dev/null); echo "state=$s comm=$c"; '
        '[ -z "$s" ] || [ "$s" = Z ] || [ "$c" != sleep ]'
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(
        'name = "cg"\n'
        f'[[task]]\nid = "daemon"\nrun = {json.dumps(daemon)}\ntimeout_s = 60\n'
        f'[[task]]\nid = "check"\nrun = {json.dumps(check)}\nneeds = ["daemon"]\n'
    )
    state = ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestra_sup",
            "run",
            str(plan),
            "--shards",
            "1",
            "--json",
            *state,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    tasks = {t["id"]: t for t in json.loads(proc.stdout)["tasks"]}
    lane_cgroup = tasks["daemon"]["output_tail"].strip().removeprefix("0::/")
    tree = root / Path(lane_cgroup).parents[1]  # <top>/<tree id>/<shard>.<generation>/<lane>
    try:
        assert proc.returncode == 0, (tasks, proc.stderr)
        assert Path(lane_cgroup).parts[:3] == (TOP, tree.name, "shard-0.1")
        assert _dead(int(pidfile.read_text()))
        assert not tree.exists()
    finally:
        if Path(lane_cgroup).parts[:1] == (TOP,):
            kill_tree_sync(tree)


# --- without cgroups -------------------------------------------------------------------------


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`ORCHESTRA_SUP_CGROUP=off`: no root, no paths, and every operation is a no-op."""
    monkeypatch.setenv(cg.ENV_SWITCH, "off")
    assert cgroup2_root() is None
    assert tree_path(tmp_path) is None
    lanes = LaneCgroups(tree_id(tmp_path), SHARD)
    assert not lanes.available and lanes.base is None
    assert lanes.path("lane") is None
    assert lanes.create("lane") is None
    assert asyncio.run(lanes.kill("lane")) is True
    assert lanes.kill_all_sync() is True
    assert kill_tree_sync(tmp_path / "missing") is True


def test_kill_tree_sync_refuses_a_plain_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cgroup of orchestra-sup"):
        kill_tree_sync(tmp_path)


def test_root_is_found_in_mountinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The first writable cgroup2 mount wins; octal escapes in mount points are undone; other
    filesystem types (cgroup v1 included) are ignored."""
    mount = tmp_path / "cg two"
    mount.mkdir()
    escaped = str(mount).replace(" ", "\\040")
    info = tmp_path / "mountinfo"
    info.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "40 31 0:40 / /nonexistent/cgroup2 rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
        f"41 31 0:38 / {escaped} rw,relatime shared:10 - cgroup2 cgroup2 rw\n"
    )
    monkeypatch.delenv(cg.ENV_SWITCH, raising=False)
    monkeypatch.setattr(cg, "_MOUNTINFO", info)
    assert cgroup2_root() == mount
    info.write_text("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    assert cgroup2_root() is None


def test_tree_id_is_short_stable_and_spelling_independent(tmp_path: Path) -> None:
    tid = tree_id(tmp_path)
    assert len(tid) == 12 and int(tid, 16) >= 0
    assert tree_id(str(tmp_path)) == tid
    assert tree_id(tmp_path / "x" / "..") == tid
    assert tree_id(tmp_path / "other") != tid


def test_join_failure_is_reported_and_the_command_still_runs(tmp_path: Path) -> None:
    """A cgroup that vanished before the spawn: the command runs untracked and says so."""
    join = LaneCgroups.join_fn(tmp_path / "gone")
    outcome = asyncio.run(run_shell("echo ran", cwd=tmp_path, env=ENV, timeout_s=30, preexec=join))
    assert outcome.exit_code == 0
    assert "not tracked by cgroup" in outcome.output_tail and "ran" in outcome.output_tail
