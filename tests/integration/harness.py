"""Harness for real trees: `orchestra-sup start` as a subprocess, driven over its real ctl socket.

The test process makes itself a child subreaper, so anything the tree leaves behind (a lane's
grandchild, a daemon that double-forked) is reparented here and `assert_no_leftovers` sees it;
nothing can hide by escaping to PID 1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.supervisor import notify

READY_TIMEOUT_S = 30.0


def osup(*args: str) -> subprocess.CompletedProcess[str]:
    """`orchestra-sup ARGS` as a user runs it (this interpreter), its output captured, stdin
    closed, within 300 s."""
    return subprocess.run(
        [sys.executable, "-m", "orchestra_sup", *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README").write_text("seed\n")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "seed")
    return path


def alive(proc: psutil.Process) -> bool:
    """`proc` runs and is not a zombie; a process reaped between the two questions is gone."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(pred: Callable[[], object], timeout_s: float, what: str) -> object:
    """Re-check `pred` until it is truthy or the deadline passes (then fail naming `what`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)


class Tree:
    """One running tree: its supervisor process, directories and a ctl client."""

    def __init__(
        self,
        base: Path,
        workspace: Path | None,
        shards: int | None,
        lanes: int | None,
        config: Path | None = None,
        extra_env: dict[str, str] | None = None,
        run_dir: Path | None = None,
        extra_args: list[str] | None = None,
        cwd: Path | None = None,
        state_dir: Path | None = None,
    ):
        """`state_dir` (default `base/state`) is passed as given, a relative one too, and the
        tree started in `cwd` (default: this process's)."""
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="osup-t", dir="/tmp"))
        self.state_dir = (cwd or Path.cwd()) / state_dir if state_dir else base / "state"
        self.workspace = workspace
        self.log_path = base / "tree.log"
        base.mkdir(parents=True, exist_ok=True)
        notify_path = self.run_dir / "notify.sock"
        notify_path.unlink(missing_ok=True)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(notify_path))
        argv = [
            sys.executable,
            "-m",
            "orchestra_sup",
            "start",
            "--run-dir",
            str(self.run_dir),
            "--state-dir",
            str(state_dir or self.state_dir),
        ]
        if shards is not None:  # None: as the config file says (it stays reloadable)
            argv += ["--shards", str(shards)]
        if lanes is not None:
            argv += ["--lanes-per-shard", str(lanes)]
        if workspace is not None:
            argv += ["--workspace", str(workspace)]
        if config is not None:
            argv += ["--config", str(config)]
        argv += extra_args or []
        env = dict(os.environ, NOTIFY_SOCKET=str(notify_path), **(extra_env or {}))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL, cwd=cwd
            )
        self._await_ready()

    def _await_ready(self) -> None:
        self.await_notify(b"READY=1")

    def await_notify(self, line: bytes, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Read the tree's sd_notify datagrams until one has `line` (e.g. b"READY=1")."""
        self.notify.settimeout(timeout_s)
        while True:
            try:
                data = notify.receive(self.notify)
            except TimeoutError:
                raise AssertionError(f"no {line!r} from the tree; log:\n{self.log()}") from None
            if line in data.split(b"\n"):
                return

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ctl(self, body: f.Body, timeout_s: float = 10.0) -> f.Body:
        with CtlClient(self.run_dir) as client:
            return client.request(body, timeout_s=timeout_s)

    def rollover(
        self, name: str, release: Path | None = None, *options: str, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """`orchestra-sup ctl rollover NAME [--release R] [options]` as a user runs it."""
        argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(self.run_dir)]
        argv += ["rollover", name, *options]
        if release is not None:
            argv += ["--release", str(release)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)

    def call(self, tool: str, *, ctl_timeout_s: float = 30.0, **params: str) -> Any:
        """A coordinator tool through the real relay (`ctl call`); returns its value."""
        reply = self.ctl(f.CtlCall(tool=tool, params=params), timeout_s=ctl_timeout_s)
        assert isinstance(reply, f.ToolResult)
        return reply.value

    def status(self) -> f.StatusReply:
        reply = self.ctl(f.CtlStatus())
        assert isinstance(reply, f.StatusReply)
        return reply

    def child(self, name: str) -> f.ChildInfo:
        return next(c for c in self.status().children if c.name == name)

    def pids(self) -> dict[str, int | None]:
        return {c.name: c.pid for c in self.status().children}

    def submit(self, plan: f.PlanSpec) -> str:
        reply = self.ctl(f.CtlSubmit(plan=plan))
        assert isinstance(reply, f.PlanAccepted)
        return reply.id

    def task(self, plan_id: str, task_id: str | None = None) -> f.TaskReport:
        """Task `task_id` of plan `plan_id` as the coordinator reports it now (None: the plan's
        first task)."""
        reply = self.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(reply, f.PlanReport), reply
        if task_id is None:
            return reply.tasks[0]
        return next(t for t in reply.tasks if t.id == task_id)

    def wait_plan(self, plan_id: str, timeout_s: float = 60.0) -> f.PlanReport:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"plan {plan_id} not done within {timeout_s:g} s"
            report = self.ctl(f.CtlPlan(id=plan_id, wait_s=min(5.0, left)), timeout_s=left + 5)
            assert isinstance(report, f.PlanReport)
            if report.done:
                return report

    def wait_running(self, name: str, generation: int, timeout_s: float = 20.0) -> f.ChildInfo:
        def check() -> f.ChildInfo | None:
            child = self.child(name)
            ok = child.state == "running" and child.generation >= generation
            return child if ok else None

        return wait_until(check, timeout_s, f"{name} running at generation {generation}")  # type: ignore[return-value]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.notify.close()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def leftovers() -> list[psutil.Process]:
    """Live descendants of the test process (zombies are reaped first)."""
    reap_zombies()
    alive = []
    try:
        procs = psutil.Process().children(recursive=True)
    except (psutil.Error, OSError):  # one vanished mid-walk (psutil can leak FileNotFoundError)
        return leftovers()
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def assert_no_leftovers(timeout_s: float = 10.0) -> None:
    """Every process the tree started is gone (orphans included, thanks to the subreaper)."""
    try:
        wait_until(lambda: not leftovers(), timeout_s, "the tree's processes to exit")
    except AssertionError:
        procs = []
        for p in leftovers():
            with contextlib.suppress(psutil.Error):
                procs.append((p.pid, p.cmdline()))
                p.kill()
        raise AssertionError(f"processes left behind: {procs}") from None


def make_release(
    directory: Path,
    name: str,
    *,
    version: str | None = None,
    protocol: str | None = None,
    crash: bool = False,
    hang: bool = False,
    probe_gates: Path | None = None,
) -> Path:
    """A second release built for a test: a wrapper script that execs this interpreter,
    re-labelled through the test-only overrides (`orchestra_sup.release`). `crash`: it answers
    its probe but every child started on it exits 3 at once (a release that cannot start);
    `hang`: it answers its probe but every child started on it hangs, never saying hello;
    `probe_gates`: the Nth probe of it (from 0) creates `probe_gates/probe-N`, then waits
    for `probe_gates/go-N` before it answers."""
    directory.mkdir(parents=True, exist_ok=True)
    env = ""
    if version is not None:
        env += f"ORCHESTRA_SUP_TEST_VERSION={version} "
    if protocol is not None:
        env += f"ORCHESTRA_SUP_TEST_PROTOCOL={protocol} "
    body = f'exec env {env}{sys.executable} "$@"\n'
    if probe_gates is not None:
        probe_gates.mkdir(parents=True, exist_ok=True)
        body = (
            'if [ "$2" = orchestra_sup.release ]; then\n'
            "  n=0\n"
            f'  while ! mkdir "{probe_gates}/probe-$n" 2>/dev/null; do n=$((n+1)); done\n'
            f'  while [ ! -e "{probe_gates}/go-$n" ]; do sleep 0.02; done\n'
            "fi\n"
        ) + body
    if hang:
        body = (
            'if [ "$2" = orchestra_sup.release ]; then\n'
            f'  exec {sys.executable} "$@"\n'
            "fi\n"
            "exec sleep 600\n"
        )
    if crash:
        body = (
            'if [ "$2" = orchestra_sup.release ]; then\n'
            f'  exec {sys.executable} "$@"\n'
            "fi\n"
            'echo "this release cannot start" >&2; exit 3\n'
        )
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")


def cpu_latency_holdable() -> bool:
    """Whether this process may hold /dev/cpu_dma_latency (`--hold-cpu-latency` would work)."""
    return CPU_DMA_LATENCY.exists() and os.access(CPU_DMA_LATENCY, os.W_OK)


def assert_machine_record(machine: dict[str, Any], *, held: bool) -> None:
    """A bench's `machine` object has every documented field, of its documented type; `held`
    is whether the run was asked to hold /dev/cpu_dma_latency (and so must have held it at 0)."""
    assert isinstance(machine["cpu_count"], int) and machine["cpu_count"] >= 1
    assert 1 <= machine["affinity_cpus"] <= machine["cpu_count"]
    for key in ("cpuidle_driver", "cpuidle_governor"):
        assert isinstance(machine[key], str) and machine[key] and "\n" not in machine[key]
    for key in ("loadavg_start", "loadavg_end"):
        assert len(machine[key]) == 3 and all(x >= 0 for x in machine[key])
    steal = machine["steal_percent"]
    assert steal == "unknown" or 0 <= steal <= 100
    assert machine["hold_cpu_latency"] is held
    target = machine["cpu_dma_latency_us"]
    assert target == "unknown" or isinstance(target, int)
    assert machine["cpu_dma_latency_held"] in (True, False, "unknown")
    if held:
        assert target == 0 and machine["cpu_dma_latency_held"] is True


def settled(tree: Tree, plan: str, timeout_s: float = 90.0) -> f.PlanReport:
    """`plan`'s final report, asked again while the coordinator is down (being restarted)."""

    def report() -> f.PlanReport | None:
        try:
            reply = tree.ctl(f.CtlPlan(id=plan, wait_s=2.0), timeout_s=10)
        except RemoteError as exc:
            if exc.code != ErrorCode.PEER_DOWN:
                raise
            return None
        assert isinstance(reply, f.PlanReport)
        return reply if reply.done else None

    found = wait_until(report, timeout_s, f"plan {plan} to end")
    assert isinstance(found, f.PlanReport)
    return found


def plan(name: str, *tasks: f.TaskSpec) -> f.PlanSpec:
    return f.PlanSpec(name=name, tasks=list(tasks))


def task(id: str, run: str, needs: list[str] | None = None, **kw: object) -> f.TaskSpec:
    return f.TaskSpec(id=id, run=run, needs=needs or [], **kw)  # type: ignore[arg-type]


class RawPeer:
    """A bare DEALER on one of the tree's sockets that speaks frames by hand, for tests that
    play a peer (or a stranger): `send`, `receive`, `ask`; close it with `with`."""

    def __init__(
        self, path: Path, identity: bytes | None = None, sender: str = "test", gen: int = 1
    ):
        import zmq

        from orchestra_sup.protocol.codec import Codec

        self.codec = Codec()
        self.sender = sender
        self.gen = gen
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(f"ipc://{path}")

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        self.ctx.term()

    def send(self, body: f.Body, msg_id: str = "t", ttl_s: float | None = 10.0) -> None:
        env = f.Envelope(
            v=PROTOCOL_VERSION,
            id=msg_id,
            corr=None,
            sender=self.sender,
            gen=self.gen,
            ttl_s=ttl_s,
            dest_gen=None,
            body=body,
        )
        self.sock.send(self.codec.encode(env))

    def receive(self, timeout_s: float = 10.0) -> f.Envelope:
        assert self.sock.poll(int(timeout_s * 1000)), "no answer"
        return self.codec.decode(self.sock.recv())

    def ask(self, body: f.Body, msg_id: str = "t", timeout_s: float = 10.0) -> f.Body:
        self.send(body, msg_id)
        return self.receive(timeout_s).body
