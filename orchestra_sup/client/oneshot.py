"""`orchestra-sup run`: start a private tree, run one plan on it, stop it.

The tree is a real `orchestra-sup start` in a subprocess, with its own run directory and the same
ctl protocol an operator uses; readiness is the tree's own `READY=1` on a private notify socket
(the sd_notify protocol), not a sleep. The tree's log goes to `<state_dir>/tree.log` (0600).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import SupervisionError
from orchestra_sup.protocol import frames as f
from orchestra_sup.state.permissions import private_dir, private_file
from orchestra_sup.supervisor import notify
from orchestra_sup.system import linux

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


@contextmanager
def private_tree(
    *,
    workspace: Path | None,
    state_dir: Path,
    shards: int | None,
    lanes_per_shard: int | None,
    config: Path | None,
    colocated: bool = False,
) -> Iterator[CtlClient]:
    """Start a tree and yield a ctl client to it; stop it (and wait for it) on the way out.
    `colocated` runs every role in the supervisor's process (`start --colocated`).

    Raises `SupervisionError` when the tree exits or is not ready within `READY_TIMEOUT_S`
    seconds; the message points at its log.
    """
    run_dir = Path(tempfile.mkdtemp(prefix="osup-", dir="/tmp"))
    private_dir(state_dir)
    log_path = private_file(state_dir / "tree.log")  # 0600: a lane's uid reads no log
    notify_path = run_dir / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    listener.bind(str(notify_path))
    argv = [
        sys.executable,
        "-m",
        "orchestra_sup",
        "start",
        "--run-dir",
        str(run_dir),
        "--state-dir",
        str(state_dir),
    ]
    if workspace is not None:
        argv += ["--workspace", str(workspace)]
    if shards is not None:
        argv += ["--shards", str(shards)]
    if lanes_per_shard is not None:
        argv += ["--lanes-per-shard", str(lanes_per_shard)]
    if config is not None:
        argv += ["--config", str(config)]
    if colocated:
        argv.append("--colocated")
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_path))
    with open(log_path, "ab") as log:
        # If this process dies however it dies, the tree gets SIGTERM and stops itself: a private
        # tree must never outlive the command that owns it.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            preexec_fn=_die_with_parent,
        )
    try:
        _await_ready(listener, proc, log_path)
        with CtlClient(run_dir) as client:
            yield client
    finally:
        _stop(proc)
        listener.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _die_with_parent() -> None:
    linux.set_parent_death_signal(signal.SIGTERM)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the tree (it stops its children in reverse order), wait for it, and only if it
    does not exit within `STOP_TIMEOUT_S` seconds, SIGKILL it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _await_ready(listener: socket.socket, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    listener.settimeout(0.2)
    waited = 0.0
    while waited < READY_TIMEOUT_S:
        if proc.poll() is not None:
            raise SupervisionError(
                f"the tree exited with status {proc.returncode} before it was ready"
                f"{_last_words(log_path)}; see {log_path}"
            )
        try:
            data = notify.receive(listener)
        except TimeoutError:
            waited += 0.2
            continue
        if b"READY=1" in data.split(b"\n"):
            return
    raise SupervisionError(f"the tree was not ready within {READY_TIMEOUT_S:g} s; see {log_path}")


def _last_words(log_path: Path) -> str:
    """ ": <the log's last line>", so the reason survives a log that is removed with its
    temporary directory (benchmarks), or "" when there is none."""
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:200]}" if lines else ""


def wait_plan(client: CtlClient, plan_id: str, *, timeout_s: float) -> f.PlanReport:
    """Long-poll the plan until it is done; each exchange is bounded by `timeout_s` seconds."""
    while True:
        report = client.request(f.CtlPlan(id=plan_id, wait_s=5.0), timeout_s=5.0 + timeout_s)
        assert isinstance(report, f.PlanReport)
        if report.done:
            return report
