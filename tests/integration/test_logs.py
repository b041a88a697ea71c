"""`orchestra-sup ctl logs` against real trees: transcripts of running and finished lanes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration

KEYS = {"seq", "ts", "stream", "data", "lane"}


def ctl_argv(tree: Tree, *args: str) -> list[str]:
    return [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir), *args]


def logs(tree: Tree, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ctl_argv(tree, "logs", *args),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def rows_of(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    for row in rows:
        assert set(row) == KEYS, row
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    return rows


def text(rows: list[dict[str, Any]], stream: str) -> str:
    return "".join(r["data"] for r in rows if r["stream"] == stream)


def running_lane(tree: Tree, plan_id: str) -> str:
    def lane() -> str | None:
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        (t,) = report.tasks
        return t.lane if t.status == "running" else None

    return wait_until(lane, 30, "the lane to run")  # type: ignore[return-value]


class Follower:
    """`ctl logs LANE --follow --json` as a subprocess, its rows read as they come."""

    def __init__(self, tree: Tree, lane: str, *options: str):
        self.proc = subprocess.Popen(
            ctl_argv(tree, "logs", lane, "--follow", "--json", *options),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        self.rows: list[dict[str, Any]] = []
        self._buf = b""

    def until(self, pred: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30) -> None:
        """Read rows until `pred(rows)` holds (or fail at the deadline)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while not pred(self.rows):
            left = deadline - time.monotonic()
            assert left > 0, f"rows so far: {self.rows}"
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            data = os.read(fd, 65536)
            assert data, f"the follower ended early; rows: {self.rows}"
            self._buf += data
            *lines, self._buf = self._buf.split(b"\n")
            self.rows += [json.loads(line) for line in lines]

    def finish(self) -> tuple[int, str]:
        out, err = self.proc.communicate(timeout=30)
        self._buf += out
        self.rows += [json.loads(line) for line in self._buf.splitlines()]
        return self.proc.returncode, err.decode()


def test_logs_json_shows_both_streams_and_events_in_order(tree: Tree) -> None:
    """A finished lane's transcript: rows numbered from 0 with exactly seq/ts/stream/data, its
    stdout and stderr each in order, a `started` event first and its end event last; text mode
    writes stdout to stdout and stderr plus `# event:` lines to stderr."""
    command = (
        "printf 'out1\\n'; printf 'err1\\n' >&2; printf 'out2\\n'; printf 'err2\\n' >&2; exit 3"
    )
    report = tree.wait_plan(tree.submit(plan("p", task("talk", command))))
    lane = report.tasks[0].lane
    assert lane is not None

    rows = rows_of(logs(tree, lane, "--json"))
    assert text(rows, "stdout") == "out1\nout2\n"
    assert text(rows, "stderr") == "err1\nerr2\n"
    assert rows[0]["stream"] == "event" and rows[0]["data"].startswith("started in ")
    assert command in rows[0]["data"] and report.tasks[0].sandbox in rows[0]["data"]
    assert (rows[-1]["stream"], rows[-1]["data"]) == ("event", "failed: exited with status 3")
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)

    plain = logs(tree, lane)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "out1\nout2\n"
    err_lines = plain.stderr.splitlines()
    assert err_lines[0].startswith("# event: started in ")
    assert err_lines[-1] == "# event: failed: exited with status 3"
    assert [line for line in err_lines if not line.startswith("# event:")] == ["err1", "err2"]


def test_follow_prints_rows_as_they_come_and_exits_when_the_lane_ends(
    tree: Tree, tmp_path: Path
) -> None:
    """`--follow` on a running lane prints what it has printed so far, waits (still running)
    while the lane waits, prints the rest when it comes and exits 0 when the lane ends; Ctrl-C
    stops a follower with one line and status 130."""
    gate = tmp_path / "gate"
    command = f"echo first; while [ ! -e {gate} ]; do sleep 0.02; done; echo second"
    plan_id = tree.submit(plan("p", task("gated", command)))
    lane = running_lane(tree, plan_id)

    follower = Follower(tree, lane)
    quitter = Follower(tree, lane)
    try:
        for one in (follower, quitter):
            one.until(lambda rows: "first\n" in text(rows, "stdout"))
        assert follower.proc.poll() is None and quitter.proc.poll() is None

        quitter.proc.send_signal(signal.SIGINT)
        code, err = quitter.finish()
        assert code == 130, err
        assert len(err.strip().splitlines()) == 1 and "interrupted" in err
        assert "Traceback" not in err

        gate.touch()
        code, err = follower.finish()
        assert code == 0, err
    finally:
        for one in (follower, quitter):
            if one.proc.poll() is None:
                one.proc.kill()
                one.proc.communicate()
    rows = follower.rows
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert text(rows, "stdout") == "first\nsecond\n"
    assert rows[-1]["stream"] == "event"
    assert rows[-1]["data"] == "succeeded: exited with status 0"
    assert tree.wait_plan(plan_id).ok


def test_a_finished_lane_is_readable_after_a_full_restart(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The transcript of a finished lane survives stopping the tree and starting a new one on
    the same state directory (whose shards hold nothing of it in memory: it comes from LMDB)."""
    one = tree_factory(workspace=repo, base=tmp_path / "t")
    command = 'i=0; while [ $i -lt 400 ]; do echo "line $i"; echo "warn $i" >&2; i=$((i+1)); done'
    report = one.wait_plan(one.submit(plan("p", task("many", command))))
    lane = report.tasks[0].lane
    assert lane is not None and report.ok
    before = rows_of(logs(one, lane, "--json"))
    assert text(before, "stdout") == "".join(f"line {i}\n" for i in range(400))
    assert one.stop() == 0

    two = tree_factory(workspace=repo, base=tmp_path / "t")  # same state directory
    after = rows_of(logs(two, lane, "--json"))
    assert after == before
    assert after[-1]["data"] == "succeeded: exited with status 0"


def test_an_unknown_lane_is_one_line_exit_2(tree: Tree) -> None:
    """`ctl logs` of a lane no shard knows: bad input, one line naming it, exit 2, with or without
    --follow."""
    for args in (["nope-x-1"], ["nope-x-1", "--follow", "--json"]):
        proc = logs(tree, *args)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "nope-x-1" in lines[0], proc.stderr


FIRST_ATTEMPT_SLOW = (
    'if [ "$ORCHESTRA_ATTEMPT" = 1 ]; then for i in $(seq 300); do echo line $i; sleep 0.2; done; '
    'fi; echo "attempt $ORCHESTRA_ATTEMPT done"'
)
"""A task whose first attempt runs for a minute, printing; any later one ends at once."""


def by_lane(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """`rows` grouped by the lane they name, in the order they came."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for row in rows:
        if not out or out[-1][0] != row["lane"]:
            out.append((row["lane"], []))
        out[-1][1].append(row)
    return out


def test_follow_outlives_the_death_of_the_lanes_shard(tree: Tree) -> None:
    """--follow on a lane whose shard is SIGKILLed waits for the shard's next generation, which
    closes the transcript with a `lost:` event, goes on with the task's next lane from its
    first row (each row names its lane), and exits 0 when that one ends."""
    plan_id = tree.submit(plan("doomed", task("slow", FIRST_ATTEMPT_SLOW)))
    lane = running_lane(tree, plan_id)
    follower = Follower(tree, lane)
    follower.until(lambda rows: any(r["data"].startswith("line 2") for r in rows))
    shard = next(x.shard for x in tree.ctl(f.CtlLanes()).lanes if x.lane == lane)  # type: ignore[union-attr]
    os.kill(tree.pids()[shard], signal.SIGKILL)  # type: ignore[arg-type]
    code, err = follower.finish()
    assert code == 0, err
    (first, rows_1), (second, rows_2) = by_lane(follower.rows)
    assert first == lane and second == f"{plan_id}-slow-2"
    assert rows_1[-1]["stream"] == "event" and rows_1[-1]["data"].startswith("lost:")
    assert [r["seq"] for r in rows_2] == list(range(len(rows_2)))
    assert text(rows_2, "stdout") == "attempt 2 done\n"
    assert rows_2[-1]["data"] == "succeeded: exited with status 0"


def test_follow_goes_on_to_the_next_attempt_after_a_restart(tree: Tree) -> None:
    """`ctl restart` of the lane's shard ends the lane `interrupted`: the follower (text, as a
    person reads it) says which lane the task runs again as and prints that one to its end,
    exit 0, instead of stopping at `interrupted` as if the work were done."""
    plan_id = tree.submit(plan("moved", task("slow", FIRST_ATTEMPT_SLOW)))
    lane = running_lane(tree, plan_id)
    proc = subprocess.Popen(
        ctl_argv(tree, "logs", lane, "--follow"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "line 1\n"  # it follows, the lane runs
        shard = next(x.shard for x in tree.ctl(f.CtlLanes()).lanes if x.lane == lane)  # type: ignore[union-attr]
        tree.ctl(f.CtlRestart(name=shard), timeout_s=30)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.endswith("attempt 2 done\n")
    events = [line for line in err.splitlines() if line.startswith("# ")]
    at = events.index(f"# next attempt: lane {plan_id}-slow-2 (the task of {lane} runs again)")
    assert events[at - 1].startswith("# event: interrupted: ")
    assert events[-1] == "# event: succeeded: exited with status 0"
    assert tree.wait_plan(plan_id).ok


def test_follow_says_so_when_the_tree_dies_before_the_lane_ends(tree: Tree) -> None:
    """The supervisor SIGKILLed under a followed lane: no end event is ever written or sent,
    and the follower ends with status 3 and one line saying the lane's end never reached it and
    that an unfinished lane runs again, not with a 0 and not with a bare timeout."""
    plan_id = tree.submit(plan("killed", task("slow", FIRST_ATTEMPT_SLOW)))
    lane = running_lane(tree, plan_id)
    follower = Follower(tree, lane, "--timeout", "2")
    follower.until(lambda rows: any(r["data"].startswith("line 1") for r in rows))
    assert tree.stop(signal.SIGKILL) == -signal.SIGKILL
    code, err = follower.finish()
    assert code == 3, err
    (line,) = err.strip().splitlines()
    assert f"lane {lane}: the tree stopped answering before its end reached" in line, line
    assert "runs again when a tree starts on its state directory" in line
    assert not any(
        r["stream"] == "event" and r["data"].startswith("interrupted") for r in follower.rows
    )


def test_follow_says_so_when_the_tree_goes_before_the_task_runs_again(tree: Tree) -> None:
    """The whole tree stopped under a followed lane: no next attempt comes, and the follower
    ends with status 3 and one line saying the lane was interrupted and that its task runs
    again on the next start, not with a 0 that says the work is done. The lane prints every
    0.2 s, so the stop may fall between two of the follower's exchanges, after its shard has
    gone (seen in CI): then the line says the lane's end never reached it, and runs again."""
    plan_id = tree.submit(plan("stopped", task("slow", FIRST_ATTEMPT_SLOW)))
    lane = running_lane(tree, plan_id)
    follower = Follower(tree, lane, "--timeout", "2")
    follower.until(lambda rows: any(r["data"].startswith("line 1") for r in rows))
    assert tree.stop() == 0
    code, err = follower.finish()
    assert code == 3, err
    (line,) = err.strip().splitlines()
    assert "runs again when a tree starts on its state directory" in line
    if follower.rows[-1]["data"].startswith("interrupted: "):
        assert f"lane {lane} was interrupted and the tree went away before its task ran" in line
    else:
        assert f"lane {lane}: the tree stopped answering before its end reached" in line
