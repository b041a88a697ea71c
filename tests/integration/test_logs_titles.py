"""Log lines and process titles on real trees: every process's stderr line carries its name and
generation (JSON with `--log-format json`, `<N>`-prefixed under journald), and `ps` shows each
process's title, kept current as lanes start and end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.logformat import priority
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, make_release, plan, task, wait_until
from tests.unit.test_logformat import parse_logfmt

pytestmark = pytest.mark.integration

PROCS = {"supervisor", "custodian", "coordinator", "shard-0", "shard-1"}
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def title(pid: int | None) -> str:
    """What `ps -o args=` shows for `pid`."""
    assert pid is not None
    done = subprocess.run(
        ["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def json_events(tree: Tree) -> list[dict[str, object]]:
    return [json.loads(line) for line in tree.log().splitlines()]


def test_json_lines_carry_each_process_and_its_new_generation(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """With --log-format json every line of every process is one JSON object with proc and gen;
    a SIGKILLed shard's replacement logs at its new generation, and the supervisor logs the
    exit at its own. (A plan makes the coordinator say something too.)"""
    tree = tree_factory(workspace=repo, extra_args=["--log-format", "json"])
    shard = tree.child("shard-0")
    assert shard.pid is not None and shard.generation == 1
    os.kill(shard.pid, signal.SIGKILL)
    tree.wait_running("shard-0", 2)
    assert tree.wait_plan(tree.submit(plan("p", task("a", "true")))).ok  # the coordinator logs
    wait_until(
        lambda: any(e["proc"] == "shard-0" and e["gen"] == 2 for e in json_events(tree)),
        10,
        "a line from shard-0 at generation 2",
    )
    assert tree.stop() == 0
    events = json_events(tree)  # every line is one JSON object, or this raises
    assert {e["proc"] for e in events} == PROCS
    for event in events:
        assert isinstance(event["gen"], int) and isinstance(event["msg"], str), event
    assert {e["gen"] for e in events if e["proc"] == "shard-0"} == {1, 2}
    assert {e["gen"] for e in events if e["proc"] == "shard-1"} == {1}
    assert {e["gen"] for e in events if e["proc"] == "supervisor"} == {1}
    said = [str(e["msg"]) for e in events if e["proc"] == "supervisor"]
    assert any(f"shard-0 gen=1 pid={shard.pid} exited" in msg for msg in said), said


def test_a_reexecuted_supervisor_keeps_the_format_at_its_next_generation(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """After `ctl rollover supervisor`, the new image writes JSON lines at generation 2 (the
    hand-off carries both), its title is back, and a child it starts writes JSON too."""
    tree = tree_factory(workspace=repo, extra_args=["--log-format", "json"])
    done = tree.rollover("supervisor", make_release(tmp_path, "again", version="9.0.0"))
    assert done.returncode == 0, done.stdout + done.stderr
    tree.await_notify(b"READY=1")
    custodian = tree.child("custodian")
    os.kill(custodian.pid, signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("custodian", 2)
    wait_until(
        lambda: any(e["proc"] == "custodian" and e["gen"] == 2 for e in json_events(tree)),
        10,
        "a line from the custodian at generation 2",
    )
    assert title(tree.proc.pid) == "orchestra-sup: supervisor children=4/4"
    assert tree.stop() == 0
    events = json_events(tree)
    assert {e["gen"] for e in events if e["proc"] == "supervisor"} == {1, 2}
    first_of_two = next(
        i for i, e in enumerate(events) if e["proc"] == "supervisor" and e["gen"] == 2
    )
    assert all(e["gen"] == 2 for e in events[first_of_two:] if e["proc"] == "supervisor")


def test_under_journald_every_text_line_starts_with_its_priority(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """JOURNAL_STREAM naming the tree's stderr (device:inode): every line of every process is
    `<N>` then a logfmt line with proc and gen, N the priority of its level."""
    base = tmp_path / "journal"
    base.mkdir()
    log = base / "tree.log"  # the harness appends the tree's stdout and stderr here
    log.touch()
    st = os.stat(log)
    tree = tree_factory(
        workspace=repo, base=base, extra_env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    )
    os.kill(tree.pids()["shard-1"], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("shard-1", 2)
    assert tree.wait_plan(tree.submit(plan("p", task("a", "true")))).ok  # the coordinator logs
    assert tree.stop() == 0
    seen = set()
    for line in tree.log().splitlines():
        match = re.fullmatch(r"<(\d)>(.*)", line)
        assert match, line
        fields = parse_logfmt(match[2])
        assert fields["gen"].isdigit(), line
        assert int(match[1]) == priority(LEVELS[fields["level"]]), line
        seen.add(fields["proc"])
    assert seen == PROCS


def test_titles_show_each_process_and_a_shards_lanes(tree: Tree, tmp_path: Path) -> None:
    """`ps` shows every process's title; a shard running a gated lane shows lanes=1/8 and the
    coordinator plans=1, then lanes=0/8 and plans=0 once the lane has ended."""
    expected = {
        "custodian": "orchestra-sup: custodian gen=1",
        "coordinator": "orchestra-sup: coordinator gen=1 plans=0",
        "shard-0": "orchestra-sup: shard-0 gen=1 lanes=0/8",
        "shard-1": "orchestra-sup: shard-1 gen=1 lanes=0/8",
    }
    pids = tree.pids()
    for name, want in expected.items():
        wait_until(lambda n=name, w=want: title(pids[n]) == w, 10, f"{name}'s title {want!r}")  # type: ignore[misc]
    assert title(tree.proc.pid) == "orchestra-sup: supervisor children=4/4"

    gate = tmp_path / "gate"
    plan_id = tree.submit(
        plan("gated", task("wait", f"while [ ! -e {gate} ]; do sleep 0.05; done"))
    )

    def running_on() -> str | None:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return next((lane.shard for lane in reply.lanes if lane.state == "running"), None)

    shard = wait_until(running_on, 20, "the gated lane to run")
    assert isinstance(shard, str)
    busy = f"orchestra-sup: {shard} gen=1 lanes=1/8"
    wait_until(lambda: title(pids[shard]) == busy, 10, f"{shard}'s title {busy!r}")
    assert title(pids["coordinator"]) == "orchestra-sup: coordinator gen=1 plans=1"
    gate.touch()
    assert tree.wait_plan(plan_id).ok
    idle = f"orchestra-sup: {shard} gen=1 lanes=0/8"
    wait_until(lambda: title(pids[shard]) == idle, 10, f"{shard}'s title {idle!r}")
    wait_until(
        lambda: title(pids["coordinator"]) == expected["coordinator"],
        10,
        "the coordinator's title to show no plan",
    )


def test_a_bad_log_format_is_one_line_exit_2(tmp_path: Path) -> None:
    """`start --log-format xml` says what is wrong in one line and exits 2, starting nothing."""
    argv = [sys.executable, "-m", "orchestra_sup", "start", "--log-format", "xml"]
    argv += ["--run-dir", str(tmp_path / "r"), "--state-dir", str(tmp_path / "s")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == "orchestra-sup: --log-format 'xml': give text or json\n"
    assert not (tmp_path / "s").exists()
