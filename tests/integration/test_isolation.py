"""Hostile lane commands against a real tree: each is stopped or refused by an isolation layer,
and the shards, the rest of the tree and the next task are unaffected.

Each test takes the mode it checks (`ORCHESTRA_SUP_ISOLATION`); its docstring names the layer,
and the mutation that makes it fail (run with that layer off) is in the commit message.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.config import ISOLATION_ENV, LANE_USER_ENV
from orchestra_sup.protocol import frames as f
from orchestra_sup.system.isolation import bwrap_problem
from orchestra_sup.system.v1cgroups import v1_controller
from tests.integration.harness import Tree, plan, task, wait_until

TWICE = "tests.integration.lane_programs:Twice"
needs_bwrap = pytest.mark.skipif(
    bwrap_problem() is not None, reason=f"bubblewrap unusable here: {bwrap_problem()}"
)
needs_pids = pytest.mark.skipif(
    v1_controller("pids") is None, reason="no writable cgroup v1 pids controller here"
)


def _config(tmp_path: Path, **isolation: int) -> Path:
    path = tmp_path / "iso.toml"
    path.write_text("[isolation]\n" + "".join(f"{k} = {v}\n" for k, v in isolation.items()))
    return path


def _tree(
    make: Callable[..., Tree], repo: Path, tmp_path: Path, mode: str = "bwrap", **limits: int
) -> Tree:
    config = _config(tmp_path, **limits) if limits else None
    return make(workspace=repo, shards=2, config=config, extra_env={ISOLATION_ENV: mode})


def _run(tree: Tree, run: str, timeout_s: float = 60.0) -> f.TaskReport:
    """Run `run` as a one-task plan, and check the tree around it: the same pids before and
    after, and a harmless task succeeding after it."""
    before = tree.pids()
    report = tree.wait_plan(tree.submit(plan("hostile", task("hostile", run))), timeout_s)
    after = tree.wait_plan(tree.submit(plan("after", task("fine", "echo fine"))))
    assert [(t.status, t.output_tail.strip()) for t in after.tasks] == [("succeeded", "fine")]
    assert tree.pids() == before
    return report.tasks[0]


@needs_bwrap
def test_isolation_mode_is_reported(tree_factory: Callable[..., Tree], repo: Path) -> None:
    """`ctl status` says which isolation the shards' lanes run under."""
    tree = tree_factory(workspace=repo, extra_env={ISOLATION_ENV: "auto"})
    assert tree.status().isolation == "bwrap"


@needs_bwrap
def test_write_outside_the_sandbox_is_refused(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """bwrap: `/` is read-only, the sandbox the only writable host path."""
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = _tree(tree_factory, repo, tmp_path)
    result = _run(tree, f"touch {outside}/escaped; touch inside && test -e inside")
    assert not (outside / "escaped").exists()
    assert result.status == "succeeded"  # the sandbox itself stays writable


@needs_bwrap
def test_state_directory_is_hidden(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """bwrap: the tree's state directory (and the run directory, the home) are under tmpfs."""
    tree = _tree(tree_factory, repo, tmp_path)
    (tree.state_dir / "secret.txt").write_text("s3cret\n")
    result = _run(tree, f"cat {tree.state_dir}/secret.txt; ls {tree.run_dir}")
    assert "s3cret" not in result.output_tail
    assert "supervisor.ipc" not in result.output_tail


@needs_bwrap
def test_no_network(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> None:
    """bwrap --unshare-net: a TCP connect to a listener on the host's 127.0.0.1 fails."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        tree = _tree(tree_factory, repo, tmp_path)
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"
        result = _run(tree, f'$ORCHESTRA_PYTHON -c "{connect}" && echo CONNECTED')
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.status == "failed" and "CONNECTED" not in result.output_tail


@needs_pids
def test_fork_bomb_is_capped(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> None:
    """cgroup v1 pids.max ([isolation] max_processes = 32): forks past it fail, the lane ends
    with its group, the machine never sees more than the cap (the loop itself stops at 200)."""
    tree = _tree(tree_factory, repo, tmp_path, "auto", max_processes=32)
    spawn = "sleep 60 </dev/null >/dev/null 2>&1 &"
    bomb = f"i=0; while [ $i -lt 200 ]; do {spawn} i=$((i+1)); done 2>&1 | tail -n 1"
    result = _run(tree, bomb)
    assert "fork" in result.output_tail.lower(), result.output_tail  # "Cannot fork"


def test_unbounded_allocation_is_stopped(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """RLIMIT_AS ([isolation] max_memory_bytes = 1 GiB): a growing bytearray gets MemoryError
    (bounded at 8 GiB by the test itself)."""
    tree = _tree(tree_factory, repo, tmp_path, "auto", max_memory_bytes=1 << 30)
    grow = "b = bytearray()\nfor _ in range(128): b += bytearray(64 << 20)\nprint('ALLOCATED')"
    result = _run(tree, f'$ORCHESTRA_PYTHON -c "{grow}"')
    assert result.status == "failed" and "MemoryError" in result.output_tail, result.output_tail


@needs_bwrap
def test_setsid_daemon_dies_with_its_lane(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap's pid namespace alone (cgroup tracking off): a setsid'd daemon dies when the
    lane's command ends."""
    monkeypatch.setenv("ORCHESTRA_SUP_CGROUP", "off")
    marker = str(3000 + os.getpid() % 1000)  # `sleep <marker>` is this test's daemon

    def daemons() -> list[psutil.Process]:
        found = psutil.process_iter(["cmdline"])
        return [p for p in found if p.info["cmdline"] == ["sleep", marker]]

    tree = _tree(tree_factory, repo, tmp_path)
    try:
        daemon = f"setsid sleep {marker} </dev/null >/dev/null 2>&1 &"
        running = f'until pgrep -xf "sleep {marker}" >/dev/null; do sleep 0.01; done'
        result = _run(tree, f"{daemon} {running}; echo started")
        assert result.output_tail.strip() == "started"  # it ran, and outlived the command
        wait_until(lambda: not daemons(), 10.0, "the lane's daemon gone")
    finally:
        for proc in daemons():  # only when the layer failed: ours, by its marker
            proc.kill()


@needs_bwrap
def test_a_lane_cannot_unhide_paths_through_its_own_git_alternates(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """bwrap: the object store a sandbox borrows is the workspace's, as the tree knows it; a
    path the lane writes into its own `.git/objects/info/alternates` is never mounted into its
    next command (an attacker read the tree's CURVE secret and reached ctl.ipc that way)."""
    config = tmp_path / "twice.toml"
    config.write_text(f'[lanes]\nprograms = ["{TWICE}"]\n')
    tree = tree_factory(workspace=repo, config=config, extra_env={ISOLATION_ENV: "bwrap"})
    secret = tree.state_dir / "secret"
    secret.write_text("do not read")
    run = (
        f"cat {secret} && exit 0; "
        f"printf '%s\\n' {tree.state_dir} {tree.run_dir} >> .git/objects/info/alternates; "
        "exit 1"
    )
    report = tree.wait_plan(tree.submit(plan("alt", task("alt", run, program=TWICE))), 60)
    (t,) = report.tasks
    assert t.status == "failed" and "do not read" not in t.output_tail, t


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="only a root tree gives lanes uids of their own")
def test_a_lane_of_its_own_uid_reads_no_root_only_file(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """bwrap with `lane_user = "auto"` (a root tree: each sandbox its own uid): a file only root
    may read, outside every hidden directory, stays closed. Under the tree's uid it was open:
    uid 0 mapped into the user namespace is still its owner (/etc/shadow, host keys)."""
    where = Path(tempfile.mkdtemp(prefix="osup-rootonly-", dir="/var/tmp"))  # not under a tmpfs
    try:
        where.chmod(0o755)  # the way there is open (pytest's own tmp_path is 0700); the file not
        secret = where / "root-only"
        secret.write_text("r00t only\n")
        secret.chmod(0o600)
        tree = tree_factory(
            workspace=repo, shards=1, extra_env={ISOLATION_ENV: "bwrap", LANE_USER_ENV: "auto"}
        )
        result = _run(tree, f"cat {secret}; id -u")
    finally:
        shutil.rmtree(where)
    assert "r00t only" not in result.output_tail
    assert result.output_tail.split()[-1] != "0", result.output_tail
