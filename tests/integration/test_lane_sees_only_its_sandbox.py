"""A lane sees its own sandbox and nothing of the tree: the matrix of issue 17.

State-directory locations (under /tmp, under /var/lib as systemd's `StateDirectory=` puts it,
a relative `--state-dir`, one reached through a symlink, one that holds the workspace's parent),
each tree started from the directory its state directory lies in (so that directory is first on
the tree's import path, the root cause of issue 17), by isolation:

- "bwrap": bubblewrap's hiding alone (lanes run as the tree's uid);
- "none": a uid of the lane's own and the state's modes alone (no bubblewrap);
- "bwrap+uid": both, what a tree run as root gets by default.

One tree per cell: a neighbour lane leaves a secret in its sandbox, then one probe lane tries
everything at once (`PROBE`): list and read the state directory, an LMDB file, the neighbour's
sandbox, `server.secret` (of `--keys` outside the state directory, and of the default keys
directory inside it), the run directory and its lock; connect to every socket in it. A cell
passes only if every attempt fails, and the probe's own work succeeds (its sandbox read and
written, its inbox read, git reading the object store, and under bubblewrap the tree's
interpreter started): a probe that could do nothing would prove nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestra_sup.config import ISOLATION_ENV, LANE_USER_ENV
from orchestra_sup.system.isolation import bwrap_problem, uid_problem
from tests.integration.harness import Tree, git, make_repo, plan, task

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
"""The probe's interpreter: the system's, which any uid can run (the tree's may be under /root,
0700, which a lane's own uid cannot run in mode none)."""

PROBE = r"""
import json, os, socket, subprocess, sys

targets = json.loads(sys.argv[1])
seen = {"listed": {}, "read": [], "connected": [], "walked": [], "controls": {}}

def listing(path):
    try:
        seen["listed"][path] = sorted(os.listdir(path))
    except OSError:
        pass

def reads(path):
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        seen["read"].append(path)
    except OSError:
        pass

def connects(path):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_UNIX, kind)
        s.settimeout(2)
        try:
            s.connect(path)
            seen["connected"].append(path)
            return
        except OSError:
            pass
        finally:
            s.close()

for path in targets["list"]:
    listing(path)
for path in targets["read"]:
    reads(path)
for path in targets["connect"]:
    connects(path)
here = os.getcwd()
for top, dirs, files in (w for state in targets["states"] for w in os.walk(state)):
    real = os.path.realpath(top)
    if real == here or real.startswith(here + os.sep):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(top, name)
        try:
            with open(path, "rb") as fh:
                fh.read(1)
            seen["walked"].append(path)
        except OSError:
            pass

def control(name, fn):
    try:
        seen["controls"][name] = bool(fn())
    except Exception as exc:
        seen["controls"][name] = repr(exc)

control("read own sandbox", lambda: open("README").read() == "seed\n")
control("read own inbox", lambda: open(os.environ["ORCHESTRA_INBOX"]).read() is not None)
control("git reads the object store", lambda: subprocess.run(
    ["git", "cat-file", "-e", "HEAD:README"], capture_output=True).returncode == 0)
if targets["interpreter"]:
    control("run the tree's interpreter", lambda: subprocess.run(
        [os.environ["ORCHESTRA_PYTHON"], "-c", "pass"], capture_output=True).returncode == 0)
seen["uid"] = os.getuid()
seen["sandbox"] = here
seen["inbox"] = os.environ["ORCHESTRA_INBOX"]
with open("probe-result.json", "w") as out:
    json.dump(seen, out)
print("probed")
"""

ISOLATIONS = {
    "bwrap": {ISOLATION_ENV: "bwrap", LANE_USER_ENV: "tree"},
    "none": {ISOLATION_ENV: "none", LANE_USER_ENV: "dynamic"},
    "bwrap+uid": {ISOLATION_ENV: "bwrap", LANE_USER_ENV: "auto"},
}
LOCATIONS = ("tmp", "var-lib", "relative", "symlink", "holds-workspace-parent")


def _skip_reason(isolation: str) -> str | None:
    if SYSTEM_PYTHON is None:
        return "no python3 in /usr/bin or /bin for the probe"
    if "bwrap" in isolation and bwrap_problem() is not None:
        return f"bubblewrap unusable here: {bwrap_problem()}"
    if isolation != "bwrap" and os.geteuid() != 0:
        return "lanes cannot be dropped to another uid: the tests do not run as root"
    if isolation == "bwrap+uid" and uid_problem() is not None:
        return f"bubblewrap cannot run a lane as another uid here: {uid_problem()}"
    return None


@dataclass
class Site:
    """Where one cell's tree keeps its files, and what it is started with."""

    cwd: Path
    state_arg: Path  # as given to --state-dir
    workspace: Path
    keys: Path  # a `--keys` directory outside the state directory


def _public_dir(parent: str, prefix: str) -> Path:
    """A fresh directory others may pass (a lane's uid must reach the state directory in it)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o755)
    return path


@pytest.fixture
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    location: str = request.param
    made: list[Path] = []

    def fresh(parent: str) -> Path:
        made.append(_public_dir(parent, "osup-i17-"))
        return made[-1]

    base = fresh("/tmp")
    workspace = base / "ws"
    if location == "tmp":
        cwd, state_arg = base, base / "state"
    elif location == "var-lib":
        if not os.access("/var/lib", os.W_OK):
            pytest.skip("/var/lib is not writable here")
        cwd = fresh("/var/lib")
        state_arg = cwd / "state"
    elif location == "relative":
        cwd, state_arg = base, Path("state")
    elif location == "symlink":
        target = fresh("/var/tmp")  # outside /tmp: a /tmp tmpfs would hide it by chance
        (base / "link").symlink_to(target)
        cwd, state_arg = base / "link", base / "link" / "state"
    else:  # the workspace's parent lies inside the state directory
        cwd, state_arg = base, base / "state"
        workspace = base / "state" / "src" / "ws"
    make_repo(workspace)
    (workspace / "probe.py").write_text(PROBE)
    git(workspace, "add", "probe.py")
    git(workspace, "commit", "-q", "-m", "probe")
    keys = base / "keys"
    state = cwd / state_arg
    for where in (keys, state / "keys"):
        done = subprocess.run(
            [sys.executable, "-m", "orchestra_sup", "keys", "init", "--dir", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    try:
        yield Site(cwd=cwd, state_arg=state_arg, workspace=workspace, keys=keys)
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _allowed(state: Path, given: list[str]) -> set[str]:
    """The names a lane may see in the state directory: the first step on the way to each of
    the paths it is given (`given`: its sandbox, its inbox, the object store), those inside it
    (empty directories of the tmpfs under bubblewrap)."""
    inside = [Path(p) for p in given if Path(p).is_relative_to(state)]
    return {p.relative_to(state).parts[0] for p in inside}


@pytest.mark.parametrize("isolation", list(ISOLATIONS))
@pytest.mark.parametrize("site", LOCATIONS, indirect=True)
def test_a_lane_reaches_nothing_of_the_tree(
    site: Site, isolation: str, tree_factory: Callable[..., Tree]
) -> None:
    """Every attempt of the probe lane to reach the tree's state, keys, run directory, sockets
    or another lane's sandbox fails, wherever the state directory is; its own work succeeds."""
    reason = _skip_reason(isolation)
    if reason is not None:
        pytest.skip(reason)
    addr = f"tcp://127.0.0.1:{_free_port()}"
    tree = tree_factory(
        workspace=site.workspace,
        shards=1,
        extra_env=ISOLATIONS[isolation],
        cwd=site.cwd,
        state_dir=site.state_arg,
        base=site.cwd,
        extra_args=["--ctl-tcp", addr, "--keys", str(site.keys)],
    )
    state = Path(os.path.realpath(tree.state_dir))
    neighbour = tree.wait_plan(tree.submit(plan("n", task("n", "echo n3ighbour > secret.txt"))))
    assert neighbour.tasks[0].status == "succeeded", neighbour.tasks[0]
    other = state / "sandboxes" / str(neighbour.tasks[0].lane)
    sockets = sorted(str(p) for p in tree.run_dir.iterdir() if p.is_socket())
    assert any(s.endswith("ctl.ipc") for s in sockets), sockets
    targets = {
        "states": [str(tree.state_dir), str(state)],
        "list": [
            str(tree.state_dir),
            str(state),
            str(other),
            str(tree.run_dir),
            str(site.keys),
            str(state / "keys"),
        ],
        "read": [
            str(state / "coordinator" / "data.mdb"),
            str(state / "shard-0" / "data.mdb"),
            str(state / "tree.lock"),
            str(other / "secret.txt"),
            str(other / "README"),
            str(site.keys / "server.secret"),
            str(state / "keys" / "server.secret"),
            str(tree.run_dir / "supervisor.lock"),
        ],
        "connect": sockets,
        "interpreter": "bwrap" in isolation,
    }
    run = f"{SYSTEM_PYTHON} probe.py {shlex.quote(json.dumps(targets))}"
    report = tree.wait_plan(tree.submit(plan("probe", task("probe", run))))
    (probe,) = report.tasks
    assert probe.status == "succeeded", probe
    seen = json.loads((state / "sandboxes" / str(probe.lane) / "probe-result.json").read_text())

    given = [seen["sandbox"], seen["inbox"], os.path.realpath(site.workspace / ".git" / "objects")]
    allowed = _allowed(state, given)
    leaks = {path: names for path, names in seen["listed"].items() if path != str(other)}
    for path in (str(tree.state_dir), str(state)):
        leaks[path] = sorted(set(leaks.get(path, [])) - allowed)
    walked = [p for p in seen["walked"] if not os.path.realpath(p).startswith(tuple(given))]
    assert {path: names for path, names in leaks.items() if names} == {}
    assert str(other) not in seen["listed"]
    assert seen["read"] == []
    assert walked == []
    assert seen["connected"] == []
    assert all(ok is True for ok in seen["controls"].values()), seen["controls"]
    assert (seen["uid"] == os.geteuid()) == (isolation == "bwrap")


def test_orchestra_sup_run_keeps_its_state_from_its_lanes(tmp_path: Path) -> None:
    """Issue 17 as it was found: `orchestra-sup run` with no `--state-dir` (its state under
    /tmp), started from /tmp itself, and a task that looks around the state
    directory its sandbox lies in: it sees none of it (bubblewrap where it works, its own uid
    where the tree is root), and every file the tree left there is 0600, every directory 0700
    (but the workspace, git's, and the lanes' sandboxes, 0700 each)."""
    if bwrap_problem() is not None and os.geteuid() != 0:
        pytest.skip("neither bubblewrap nor another uid for lanes here")
    look = "(ls -a ../.. ../../coordinator; cat ../../tree.log ../../tree.lock) 2>/dev/null"
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(f'name = "look"\n[[task]]\nid = "look"\nrun = "{look}; echo looked"\n')
    done = subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "run", str(plan_file), "--json"],
        cwd="/tmp",  # first on the tree's import path, which used to be bound back
        env={k: v for k, v in os.environ.items() if k not in (ISOLATION_ENV, LANE_USER_ENV)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    state = Path(outcome["state_dir"])
    try:
        seen = outcome["tasks"][0]["output_tail"]
        assert seen.endswith("looked\n"), seen
        for name in ("coordinator", "shard-0", "tree.lock", "tree.log", "data.mdb", "proc="):
            assert name not in seen, seen
        for top, dirs, files in os.walk(state):
            if top == str(state):  # not into the workspace (git's) nor the sandboxes (lanes')
                dirs[:] = [d for d in dirs if d not in ("workspace", "sandboxes")]
            for name in dirs:
                mode = stat.S_IMODE(os.lstat(os.path.join(top, name)).st_mode)
                assert mode in (0o700, 0o711), (top, name, oct(mode))
            for name in files:
                mode = stat.S_IMODE(os.lstat(os.path.join(top, name)).st_mode)
                assert mode in (0o600, 0o640), (top, name, oct(mode))
    finally:
        shutil.rmtree(state, ignore_errors=True)
