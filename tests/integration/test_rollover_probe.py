"""A release whose probe leaves a process behind (issue 24, defect 6): the rollover is refused
at the probe's deadline, and nothing the probe started outlives it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.supervisor.helper_cgroup import PREFIX
from orchestra_sup.system.cgroups import tree_path
from tests.integration.harness import Tree, wait_until

pytestmark = pytest.mark.integration

PROBE_TIMEOUT_S = 1.0


def escaping_release(directory: Path, pid_file: Path) -> Path:
    """A release whose probe starts a `setsid` child that keeps the probe's stdout open (it
    leaves the probe's process group and session) and writes its pid to `pid_file`, then hangs;
    every other command runs this interpreter as usual."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "python"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$2" = orchestra_sup.release ]; then\n'
        f"  setsid sh -c 'echo $$ > {pid_file}.new; mv {pid_file}.new {pid_file}; "
        "exec sleep 600' &\n"
        "  exec sleep 600\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path


def exists(pid: int, created: float, *, zombie: bool) -> bool:
    """Whether the process that had `pid` at `created` (psutil's create time) is still there (a
    recycled pid is another process); a zombie counts only when `zombie` is true."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and (zombie or proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("cgroups", ["on", "off"])
def test_a_probe_whose_child_holds_its_output_is_refused_at_its_deadline(
    tree_factory: Callable[..., Tree], tmp_path: Path, cgroups: str
) -> None:
    """The probe's `setsid` child escapes its process group and holds its stdout: the rollover
    is still refused at the probe's deadline (exit 2, one line naming the probe and the
    deadline, well within ctl's timeout), the escaped child is dead by then and reaped soon
    after, the probe's cgroup is gone, and the tree is as it was. With cgroups off
    (`ORCHESTRA_SUP_CGROUP=off`) the supervisor, a subreaper, kills it once it is reparented."""
    config = tmp_path / "tree.toml"
    config.write_text(f"[supervisor]\nprobe_timeout_s = {PROBE_TIMEOUT_S}\n")
    env = {"ORCHESTRA_SUP_CGROUP": "off"} if cgroups == "off" else None
    tree = tree_factory(shards=1, config=config, extra_env=env)
    pid_file = tmp_path / "escaped.pid"
    release = escaping_release(tmp_path / "rel", pid_file)
    before = tree.status()
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    argv += ["rollover", "all", "--release", str(release), "--timeout", "30"]
    ctl = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(pid_file.exists, 20, "the probe's escaped child to start")
        pid = int(pid_file.read_text())
        created = psutil.Process(pid).create_time()
        out, err = ctl.communicate(timeout=60)
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
    assert ctl.returncode == 2, (ctl.returncode, out, err)
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, err
    assert f"release {release}: no answer from its probe within 1 s" in line, line
    assert not exists(pid, created, zombie=False), "the probe's escaped child outlived the refusal"
    wait_until(lambda: not exists(pid, created, zombie=True), 10, "the escaped child reaped")
    tree_cgroups = tree_path(tree.run_dir)
    if tree_cgroups is not None and tree_cgroups.is_dir():
        assert not [p.name for p in tree_cgroups.iterdir() if p.name.startswith(PREFIX)]
    after = tree.status()
    assert after.rollover is None
    assert [(c.name, c.pid, c.generation) for c in after.children] == [
        (c.name, c.pid, c.generation) for c in before.children
    ]
