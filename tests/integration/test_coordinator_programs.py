"""The built-in coordinator programs (`coordinator.programs`) on real trees.

`bisect` bisects a real 24-commit git repository, the tree's workspace, whose 15th commit breaks
the check (`value` holds "ok" until it and "broken" from it): it names that commit in no more
rounds than k-ary bisection needs, and gives the same answer, starting no revision's lane twice,
when the coordinator is SIGKILLed in its first and second rounds, or rolled over in its second.
The test holds each check lane at a gate of its own (a file it waits for), and moves only on
what the plan's report shows: the lanes the session started. `fanout` reduces its lanes'
outputs read from `$ORCHESTRA_FEEDBACK`; `refine` feeds each check's output back to its next run
until the check passes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.errors import OrchestraError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, git, wait_until

pytestmark = pytest.mark.integration

COMMITS = 24
BREAKS_AT = 15
PARALLEL = 3


def history(path: Path) -> list[str]:
    """A repository at `path` of `COMMITS` commits; commit n (from 1) holds `number` = n and
    `value` = "ok" before `BREAKS_AT`, "broken" from it. Answers their shas, oldest first."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    shas = []
    for n in range(1, COMMITS + 1):
        (path / "value").write_text("ok\n" if n < BREAKS_AT else "broken\n")
        (path / "number").write_text(f"{n}\n")
        git(path, "add", "value", "number")
        git(path, "commit", "-q", "-m", f"commit {n}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def gated_check(gates: Path, runs: Path) -> str:
    """The check: note the commit's number in `runs`, wait for `gates/<number>` or
    `gates/all`, then pass where `value` is "ok"."""
    return (
        f"n=$(cat number); echo $n >> {runs}; "
        f"while [ ! -e {gates}/$n ] && [ ! -e {gates}/all ]; do sleep 0.05; done; "
        "grep -qx ok value"
    )


def session(name: str, coordinator: str, **args: object) -> f.PlanSpec:
    return f.PlanSpec(name=name, tasks=[], coordinator=coordinator, args=dict(args))


def lanes(tree: Tree, plan_id: str) -> list[f.SessionLaneReport] | None:
    """The lanes the session has started, as its plan's report shows them; None while the
    coordinator does not answer (killed, rolling over)."""
    try:
        report = tree.ctl(f.CtlPlan(id=plan_id))
    except OrchestraError:
        return None
    assert isinstance(report, f.PlanReport)
    return list(report.lanes)


def plan_json(tree: Tree, plan_id: str) -> dict:
    """`ctl plan ID --json`, as a user reads it."""
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    shown = subprocess.run(
        [*argv, "plan", plan_id, "--json"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def started(tree: Tree, plan_id: str, count: int) -> list[f.SessionLaneReport]:
    """Wait until the session has started `count` lanes; answer them."""
    return wait_until(  # type: ignore[return-value]
        lambda: (found := lanes(tree, plan_id)) is not None and len(found) >= count and found,
        60,
        f"{count} lanes of session {plan_id}",
    )


def sigkill_coordinator(tree: Tree) -> None:
    pid = tree.pids()["coordinator"]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: tree.pids()["coordinator"] not in (None, pid), 30, "a new coordinator")


@pytest.fixture
def bisected(tmp_path: Path) -> tuple[Path, list[str]]:
    ws = tmp_path / "ws"
    return ws, history(ws)


@pytest.mark.parametrize("interruption", ["none", "sigkill", "rollover"])
def test_bisect_names_the_commit_that_broke_the_check(
    tree_factory: Callable[..., Tree],
    bisected: tuple[Path, list[str]],
    tmp_path: Path,
    interruption: str,
) -> None:
    ws, shas = bisected
    number = {sha: n for n, sha in enumerate(shas, start=1)}
    gates, runs = tmp_path / "gates", tmp_path / "runs"
    gates.mkdir()
    tree = tree_factory(workspace=ws)
    check = gated_check(gates, runs)
    plan_id = tree.submit(
        session("bisect", "bisect", good=shas[0], bad=shas[-1], check=check, parallel=PARALLEL)
    )

    first = started(tree, plan_id, PARALLEL)  # round 1's lanes, each held at its gate
    assert len(first) == PARALLEL
    if interruption == "sigkill":
        sigkill_coordinator(tree)  # mid-round: its starts are replayed after the restart
        started(tree, plan_id, PARALLEL)
    for lane in first:
        assert lane.rev is not None
        (gates / str(number[lane.rev])).touch()
    second = started(tree, plan_id, 2 * PARALLEL)  # round 1 checkpointed, round 2 started
    assert len(second) == 2 * PARALLEL
    if interruption == "sigkill":
        sigkill_coordinator(tree)  # after a checkpoint: the session resumes at round 2
    elif interruption == "rollover":
        done = tree.rollover("coordinator")
        assert done.returncode == 0, done.stdout + done.stderr
    started(tree, plan_id, 2 * PARALLEL)  # the coordinator answers again
    (gates / "all").touch()

    report = tree.wait_plan(plan_id, timeout_s=120)
    assert report.ok, (report.error, tree.log()[-4000:])
    result = report.result
    assert isinstance(result, dict)
    assert result["first_bad"] == shas[BREAKS_AT - 1]
    candidates = COMMITS - 1
    assert result["candidates"] == candidates
    assert result["rounds"] <= math.ceil(math.log(candidates, PARALLEL + 1))
    shown = plan_json(tree, plan_id)
    assert shown["coordinator"] == "bisect" and shown["result"] == result
    revs = [lane["rev"] for lane in shown["lanes"]]
    assert len(revs) == len(set(revs)), revs  # no revision's lane started twice
    assert sorted(revs) == sorted(t["rev"] for t in result["tested"])
    assert all(lane["status"] in ("succeeded", "failed") for lane in shown["lanes"])
    checked = runs.read_text().split()
    assert sorted(checked) == sorted(str(number[rev]) for rev in revs)  # each check ran once


def test_fanout_reduces_the_outputs_of_its_lanes(tree: Tree) -> None:
    script = (
        'import json, os; fed = json.loads(os.environ["ORCHESTRA_FEEDBACK"]); '
        'print(sum(int(o["output_tail"]) for o in fed if o["status"] == "succeeded"))'
    )
    reduce = f"$ORCHESTRA_PYTHON -c '{script}'"
    runs = ["echo 1", "echo 20", "echo 300; exit 3", "echo 4000"]
    plan_id = tree.submit(session("fanout", "fanout", runs=runs, reduce=reduce))
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok, report.error
    result = report.result
    assert isinstance(result, dict)
    assert [o["status"] for o in result["outputs"]] == ["succeeded"] * 2 + ["failed", "succeeded"]
    assert result["outputs"][2]["exit_code"] == 3
    assert result["reduce"]["output_tail"].strip() == "4021"
    assert [lane.run for lane in report.lanes] == [*runs, reduce]


def test_fanout_fails_when_its_reduce_lane_fails(tree: Tree) -> None:
    plan_id = tree.submit(
        session("fanout", "fanout", runs=["echo 1"], reduce="echo cannot reduce; exit 4")
    )
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert not report.ok
    assert report.error is not None
    assert "failed (exit 4): cannot reduce" in report.error


def test_refine_feeds_the_check_back_until_it_passes(tree: Tree, repo: Path) -> None:
    (repo / "count").write_text("0\n")
    git(repo, "add", "count")
    git(repo, "commit", "-q", "-m", "count")
    run = 'echo "${ORCHESTRA_FEEDBACK:-none}" >> fed; echo $(($(cat count) + 1)) > count'
    check = 'test "$(cat count)" -ge 3 || { echo "count is $(cat count), want 3"; exit 1; }'
    plan_id = tree.submit(session("refine", "refine", run=run, check=check, max_rounds=5))
    report = tree.wait_plan(plan_id, timeout_s=90)
    assert report.ok, report.error
    result = report.result
    assert isinstance(result, dict)
    assert result["rounds"] == 3
    assert result["commit"] == git(repo, "rev-parse", "HEAD")
    assert git(repo, "show", "HEAD:count") == "3"
    fed = [line for line in git(repo, "show", "HEAD:fed").splitlines() if line]
    assert fed == [
        "none",
        "count is 1, want 3",
        "count is 2, want 3",
    ]
    checks = [lane for lane in report.lanes if lane.run == check]
    assert len(checks) == 3 and all(lane.rev for lane in checks)


def test_refine_fails_naming_the_last_check_line_when_its_rounds_end(tree: Tree) -> None:
    plan_id = tree.submit(
        session("refine", "refine", run="true", check="echo still wrong; exit 1", max_rounds=2)
    )
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert not report.ok
    assert report.error == "check still fails after 2 rounds: still wrong"
