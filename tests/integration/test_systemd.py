"""The generated unit under a real systemd, booted as PID 1 in private namespaces.

The recipe is /work/shared/notes/isolation.md's: a cgroup v2 directory of the test's own becomes
the container's cgroup root; `unshare` gives systemd its own pid, mount, cgroup, uts, ipc and
net namespaces; `/run` is a tmpfs, `/var/lib` a directory of the test's (the unit's
StateDirectory=), `/etc/systemd/system` holds only the test's units. The unit is the one
`orchestra-sup systemd-unit --config C --workspace W` prints, ExecStart= this venv's
orchestra-sup. Everything is driven through `nsenter`: `systemctl`, and `orchestra-sup ctl`
as an operator on that machine would run it. Pids in `ctl status` and in `systemctl show` are
both the container's.

Needs root, `unshare`, `nsenter`, systemd and a writable cgroup v2 hierarchy; skips with the
reason otherwise. The container is SIGKILLed and its cgroups removed however the tests end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from orchestra_sup.cli.unit import render, unit_name
from orchestra_sup.system.cgroups import cgroup2_root
from orchestra_sup.system.isolation import resolve
from orchestra_sup.system.lanecgroups import LaneCgroups
from tests.integration.harness import make_repo, wait_until
from tests.unit.test_unit import CONFIG as HOSTILE_CONFIG
from tests.unit.test_unit import HOSTILE, hostile_spec
from tests.unit.test_unit import WORKSPACE as HOSTILE_WORKSPACE

pytestmark = pytest.mark.integration

SYSTEMD = Path("/lib/systemd/systemd")
UNIT = "orchestra-sup.service"
RUN_DIR = "/run/orchestra-sup"
ORCHESTRA_SUP = Path(sys.executable).parent / "orchestra-sup"
ISOLATION = resolve("auto")
"""What lanes get on this host ("bwrap" where bubblewrap works); the unit must give them the
same: its config asks for exactly that, and `start` refuses a mode it cannot give."""
PLAN = """name = "sandboxed"

[[task]]
id = "inside"
run = "test \\"$(cat /proc/1/comm)\\" = bwrap"
"""
"""A lane that succeeds only inside bubblewrap's pid namespace (its pid 1 is bwrap)."""

INNER = """set -e
mount --make-rprivate /
mount --bind /sys /sys && mount -o remount,bind,ro /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys
mount --bind /proc/sys/user /proc/sys/user && mount -o remount,bind,rw /proc/sys/user
mount --bind "$UNITDIR" /etc/systemd/system
mount --bind "$VARLIB" /var/lib
mount -t tmpfs -o mode=755 tmpfs /run
mkdir /run/.proc && mount -t proc -o nosuid,nodev,noexec proc /run/.proc
exec env -i container=test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --unit=test.target --log-target=console --show-status=no
"""

TARGET = """[Unit]
Description=the test's whole system
DefaultDependencies=no
"""

DROP_IN = """# Nothing else is started in the container: no network.target to wait for, no journald.
[Unit]
DefaultDependencies=no

[Service]
StandardOutput=append:/var/lib/orchestra-sup.log
StandardError=inherit
"""

CONFIG = """[supervisor]
max_restarts = {max_restarts}
max_seconds = 60.0
shutdown_timeout_s = 2.0
backoff_initial_s = 0.05

[shards]
count = {shards}
lanes_per_shard = 2

[isolation]
mode = "{isolation}"
"""


def config_text(max_restarts: int, shards: int) -> str:
    return CONFIG.format(max_restarts=max_restarts, shards=shards, isolation=ISOLATION)


def missing() -> str | None:
    """Why this machine cannot boot the container, or None."""
    if os.geteuid() != 0:
        return "needs root (mount and pid namespaces, cgroups)"
    for tool in ("unshare", "nsenter", "systemctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not SYSTEMD.exists():
        return f"no systemd at {SYSTEMD}"
    if cgroup2_root() is None:
        return "no writable cgroup v2 hierarchy"
    if not ORCHESTRA_SUP.exists():
        return f"no orchestra-sup script beside {sys.executable}"
    return None


class Machine:
    """The container: its systemd's host pid (`pid`), the host cgroup that is its root,
    the test's directory (`base`) and the unit's config file (`config`)."""

    def __init__(self, cgroup: Path, base: Path, config: Path):
        self.cgroup = cgroup
        self.base = base
        self.config = config
        self.pid = 0

    def run(self, *argv: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        prefix = ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-n", "-C", "--"]
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout_s)

    def systemctl(self, *args: str) -> str:
        done = self.run("systemctl", *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr, self.journal())
        return done.stdout.strip()

    def show(self, *props: str) -> dict[str, str]:
        return self.show_unit(UNIT, *props)

    def show_unit(self, unit: str, *props: str) -> dict[str, str]:
        text = self.systemctl("show", "-p", ",".join(props), unit)
        return dict(line.split("=", 1) for line in text.splitlines())

    def status(self, unreachable_ok: bool = False) -> dict[str, Any]:
        """`orchestra-sup ctl status --json` inside the container; with `unreachable_ok`, {}
        when no tree answers (ctl's status 3: one restarting, say)."""
        done = self.run(str(ORCHESTRA_SUP), "ctl", "--run-dir", RUN_DIR, "status", "--json")
        if unreachable_ok and done.returncode == 3:
            return {}
        assert done.returncode == 0, (done.stdout, done.stderr)
        return json.loads(done.stdout)

    def children(self) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in self.status()["children"]}

    def journal(self) -> str:
        """The end of what the unit wrote (no journald inside: the drop-in sends it to a file
        in the test's /var/lib)."""
        with contextlib.suppress(FileNotFoundError):
            return (self.base / "varlib" / "orchestra-sup.log").read_text(errors="replace")[-4000:]
        return ""

    def unit_processes(self) -> list[int]:
        """Host pids in the unit's cgroup and below it."""
        unit = self.cgroup / "system.slice" / UNIT
        pids: list[int] = []
        for procs in unit.rglob("cgroup.procs") if unit.exists() else []:
            pids += [int(p) for p in procs.read_text().split()]
        return pids


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """A systemd booted as PID 1, running (`is-system-running`), with the generated unit
    installed for a git workspace and a config of the test's; torn down whatever happens."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("systemd")
    units, varlib = base / "units", base / "varlib"
    units.mkdir()
    varlib.mkdir()
    (units / "test.target").write_text(TARGET)
    workspace = make_repo(base / "ws")
    config = base / "orchestra-sup.toml"
    config.write_text(config_text(max_restarts=5, shards=2))
    unit = subprocess.run(
        [
            str(ORCHESTRA_SUP),
            "systemd-unit",
            "--config",
            str(config),
            "--workspace",
            str(workspace),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (units / UNIT).write_text(unit)  # as generated; the test's changes are a drop-in
    (units / f"{UNIT}.d").mkdir()
    (units / f"{UNIT}.d" / "test.conf").write_text(DROP_IN)
    root = cgroup2_root()
    assert root is not None
    cgroup = root / f"osup-systemd-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    argv = ["unshare", "--cgroup", "--pid", "--fork", "--kill-child=SIGKILL", "--mount"]
    argv += ["--uts", "--ipc", "--net", "--mount-proc", "sh", "-c", INNER]
    env = dict(os.environ, UNITDIR=str(units), VARLIB=str(varlib))
    console = base / "console.log"  # the mounts' errors, if any
    with open(console, "wb") as out:
        unshare = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            preexec_fn=LaneCgroups.join_fn(cgroup),  # in the cgroup before it unshares
        )
    box = Machine(cgroup, base, config)
    try:

        def booted() -> int | None:
            for child in psutil.Process(unshare.pid).children():
                with contextlib.suppress(psutil.Error):
                    if child.exe() == str(SYSTEMD.resolve()):
                        return child.pid
            assert unshare.poll() is None, console.read_text()
            return None

        box.pid = wait_until(booted, 20, "systemd to start")  # type: ignore[assignment]
        wait_until(
            lambda: box.run("systemctl", "is-system-running").stdout.strip() == "running",
            20,
            "systemd to be running",
        )
        yield box
    finally:
        unshare.send_signal(signal.SIGKILL)  # --kill-child: systemd and all it runs go too
        unshare.wait()
        # `populated 0`: not only no pid listed, but every exiting task gone (until then the
        # cgroups cannot be removed)
        wait_until(
            lambda: "populated 0" in (cgroup / "cgroup.events").read_text(),
            20,
            "the container's processes to be gone",
        )
        for each in sorted(cgroup.rglob("*"), key=lambda p: -len(p.parts)):
            if each.is_dir():
                each.rmdir()
        cgroup.rmdir()


@pytest.fixture
def started(machine: Machine) -> Iterator[Machine]:
    """The unit freshly started with the config's 2 shards (and stopped after the test)."""
    machine.config.write_text(config_text(max_restarts=5, shards=2))
    machine.systemctl("start", UNIT)
    try:
        yield machine
    finally:
        machine.run("systemctl", "stop", UNIT)
        machine.run("systemctl", "reset-failed", UNIT)


def running(children: dict[str, dict[str, Any]]) -> bool:
    return all(c["state"] == "running" and c["pid"] for c in children.values())


def test_start_returns_once_the_tree_is_ready(started: Machine) -> None:
    """`systemctl start` (Type=notify) returns only after READY=1: at once every child runs,
    the unit is active with the supervisor as MainPID, and its STATUS= is the summary."""
    children = started.children()
    assert set(children) == {"custodian", "coordinator", "shard-0", "shard-1"}
    assert running(children), children
    shown = started.show("ActiveState", "SubState", "MainPID", "StatusText")
    assert (shown["ActiveState"], shown["SubState"]) == ("active", "running")
    assert int(shown["MainPID"]) == started.status()["supervisor"]["pid"]
    assert shown["StatusText"].startswith("4/4 children running"), shown
    assert started.status()["supervisor"]["isolation"] == ISOLATION


@pytest.mark.skipif(ISOLATION != "bwrap", reason="bubblewrap does not work on this host")
def test_a_lane_is_sandboxed_under_the_unit(started: Machine) -> None:
    """The unit's hardening leaves bubblewrap working: a lane runs inside its sandbox (its
    pid 1 is bwrap) and the plan succeeds."""
    plan = started.base / "plan.toml"
    plan.write_text(PLAN)
    argv = [str(ORCHESTRA_SUP), "ctl", "--run-dir", RUN_DIR, "submit", str(plan), "--wait"]
    done = started.run(*argv, "--json", "--timeout", "30", timeout_s=60)
    assert done.returncode == 0, (done.stdout, done.stderr, started.journal())
    assert json.loads(done.stdout)["ok"] is True


def test_a_killed_shard_does_not_restart_the_unit(started: Machine) -> None:
    """kill -9 of a shard: the tree restarts the shard; systemd sees nothing (same MainPID,
    NRestarts 0)."""
    before = started.show("MainPID", "NRestarts")
    shard = started.children()["shard-1"]
    started.run("kill", "-9", str(shard["pid"]))

    def back() -> dict[str, Any] | None:
        now = started.children()["shard-1"]
        return now if now["state"] == "running" and now["pid"] != shard["pid"] else None

    again = wait_until(back, 20, "shard-1 to come back")
    assert again["generation"] > shard["generation"]  # type: ignore[index]
    assert started.show("MainPID", "NRestarts") == before
    assert before["NRestarts"] == "0"


def test_reload_adds_a_shard_and_keeps_the_others(started: Machine) -> None:
    """`systemctl reload` after the config's shard count went 2 -> 3: shard-2 runs, every other
    child keeps its pid, and the unit is the same (MainPID)."""
    before = started.children()
    main = started.show("MainPID")
    started.config.write_text(config_text(max_restarts=5, shards=3))
    started.systemctl("reload", UNIT)

    def reloaded() -> dict[str, dict[str, Any]] | None:
        now = started.children() if started.show("SubState")["SubState"] == "running" else {}
        return now if "shard-2" in now and running(now) else None

    after = wait_until(reloaded, 10, "shard-2 to run")
    assert {name: after[name]["pid"] for name in before} == {  # type: ignore[index]
        name: child["pid"] for name, child in before.items()
    }
    assert started.show("MainPID") == main


def test_intensity_exceeded_makes_systemd_restart_it(started: Machine) -> None:
    """More coordinator deaths than [supervisor] max_restarts within max_seconds: the root
    gives up and exits 3, and systemd starts the unit again (NRestarts 1, a new MainPID, the
    tree running again)."""
    started.config.write_text(config_text(max_restarts=1, shards=2))
    started.systemctl("restart", UNIT)  # with max_restarts = 1
    first = started.show("MainPID", "NRestarts")
    assert first["NRestarts"] == "0"

    def kill_coordinator() -> None:
        pid = started.children()["coordinator"]["pid"]
        started.run("kill", "-9", str(pid))

        def settled() -> bool:
            if started.show("MainPID")["MainPID"] != first["MainPID"]:
                return True
            children = started.status(unreachable_ok=True).get("children", [])
            now = next((c for c in children if c["name"] == "coordinator"), {})
            return now.get("state") == "running" and now.get("pid") != pid

        wait_until(settled, 20, "the coordinator back, or the unit restarted")

    kill_coordinator()  # restart 1 of 1: allowed
    assert started.show("MainPID", "NRestarts") == first
    kill_coordinator()  # restart 2 of 1: the root gives up

    def restarted() -> dict[str, str] | None:
        shown = started.show("MainPID", "NRestarts", "SubState")
        fresh = shown["NRestarts"] == "1" and shown["SubState"] == "running"
        return shown if fresh else None

    shown = wait_until(restarted, 30, "systemd to restart the unit")
    assert shown["MainPID"] != first["MainPID"]  # type: ignore[index]
    assert running(started.children())


def test_a_wedged_supervisor_is_restarted_by_the_watchdog(started: Machine) -> None:
    """With WatchdogSec=3 (a drop-in), systemd hears the supervisor's pings (its watchdog
    timestamp moves on); once the supervisor stops (SIGSTOP: a loop that no longer turns)
    the pings stop, and systemd kills the unit and starts it again (NRestarts 1, new
    MainPID, the tree running)."""
    drop_in = started.base / "units" / f"{UNIT}.d" / "watchdog.conf"
    drop_in.write_text("[Service]\nWatchdogSec=3\n")
    try:
        started.systemctl("daemon-reload")
        started.systemctl("restart", UNIT)
        first = started.show("MainPID", "NRestarts", "WatchdogTimestampMonotonic")
        assert first["NRestarts"] == "0"
        stamps: set[str] = set()

        def pinged() -> bool:
            """Two different watchdog timestamps of the same process (a start sets one; a
            restart would set another, but with another MainPID)."""
            now = started.show("MainPID", "NRestarts", "WatchdogTimestampMonotonic")
            assert (now["MainPID"], now["NRestarts"]) == (first["MainPID"], "0"), now
            stamps.add(now["WatchdogTimestampMonotonic"])
            return len(stamps - {"0"}) >= 2

        wait_until(pinged, 10, "WATCHDOG=1 pings from the supervisor")
        assert started.run("kill", "-STOP", first["MainPID"]).returncode == 0

        def restarted() -> dict[str, str] | None:
            shown = started.show("MainPID", "NRestarts", "SubState")
            fresh = shown["NRestarts"] == "1" and shown["SubState"] == "running"
            return shown if fresh else None

        shown = wait_until(restarted, 30, "systemd's watchdog to restart the unit")
        assert shown["MainPID"] != first["MainPID"]  # type: ignore[index]
        assert running(started.children())
    finally:
        drop_in.unlink()
        started.systemctl("daemon-reload")


def test_stop_leaves_no_process(started: Machine) -> None:
    """`systemctl stop`: the unit is inactive (not failed) and its cgroup holds no process;
    every process the tree had is gone."""
    pids = started.unit_processes()
    assert len(pids) >= 5  # supervisor, fork template, custodian, coordinator, shards
    started.systemctl("stop", UNIT)
    assert started.show("ActiveState")["ActiveState"] == "inactive"
    assert started.unit_processes() == []
    assert not [pid for pid in pids if psutil.pid_exists(pid)]


ARGV_DUMP = """#!/usr/bin/python3
import json, os, sys
workspace = sys.argv[sys.argv.index("--workspace") + 1]
try:
    open(os.path.join(workspace, "written"), "w").close()
    writable = "yes"
except OSError as exc:
    writable = exc.strerror
with open(os.path.join(os.environ["STATE_DIRECTORY"], "argv.json"), "w") as out:
    json.dump({"argv": sys.argv, "writable": writable}, out)
sys.exit(2)
"""
"""A program that records the argv systemd gave it and whether the workspace is writable under
ProtectSystem=strict (only ReadWritePaths= makes it so), then exits 2 (bad input: no restart)."""


def test_hostile_values_reach_the_program_as_themselves(machine: Machine) -> None:
    """The template unit rendered from hostile values (spaces, both quotes, backslashes, `%`,
    `$`, `${..}`, `;`, `#`, an empty word, non-ASCII letters; specifiers in the workspace and
    config), run as `orchestra-sup@argv` by the real systemd: the program, in a directory
    with such a name, receives exactly the argv asked for (`%i` made `argv`), and the
    workspace's ReadWritePaths= names exactly that directory (it is writable)."""
    instance = "argv"
    where = machine.base / "bin 100% %i $HOME ${HOME} $$ ü;#="
    where.mkdir()
    program = where / "orchestra-sup"
    program.write_text(ARGV_DUMP)
    program.chmod(0o755)
    workspace = HOSTILE_WORKSPACE.replace("%%", "%").replace("%i", instance)
    config = HOSTILE_CONFIG.replace("%i", instance)
    spec = hostile_spec(str(program))
    spec = msgspec.structs.replace(spec, workspace=str(machine.base) + spec.workspace)
    workspace = str(machine.base) + workspace
    Path(workspace).mkdir(parents=True)
    units = machine.base / "units"
    template = units / unit_name(True)
    template.write_text(render(spec))
    drop_in = units / f"{unit_name(True)}.d"
    drop_in.mkdir()
    (drop_in / "test.conf").write_text(DROP_IN)
    state = machine.base / "varlib" / "orchestra-sup" / instance
    name = f"orchestra-sup@{instance}.service"
    try:
        machine.systemctl("daemon-reload")
        done = machine.run("systemctl", "start", name)  # fails once the program exits 2
        assert done.returncode != 0
        assert machine.show_unit(name, "ExecMainStatus") == {"ExecMainStatus": "2"}
        seen = json.loads((state / "argv.json").read_text())
    finally:
        machine.run("systemctl", "reset-failed", name)
        shutil.rmtree(drop_in)
        template.unlink()
        shutil.rmtree(state, ignore_errors=True)
        machine.systemctl("daemon-reload")
    expected = [str(program), *HOSTILE, "start", "--config", config, "--workspace", workspace]
    assert seen == {"argv": expected, "writable": "yes"}
