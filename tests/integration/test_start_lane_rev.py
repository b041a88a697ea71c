"""`start_lane rev= commit= feedback=` on real trees (issue 19): the workspace is a real git
repository with three commits of f.txt, and each lane's result is read from its plan's report
as `ctl plan --json` prints it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.cli.exits import EXIT_FAILED
from orchestra_sup.errors import ErrorCode, RemoteError
from tests.integration.harness import Tree, git, make_release, wait_until
from tests.integration.test_rollover_shard import REPO, rollover

pytestmark = pytest.mark.integration

RUNS = "tests.integration.lane_programs:Runs"


@pytest.fixture
def shas(repo: Path) -> list[str]:
    """Three commits of f.txt ("1", "2", "3") on top of the seed; their shas, oldest first."""
    for text in ("1\n", "2\n", "3\n"):
        (repo / "f.txt").write_text(text)
        git(repo, "add", "f.txt")
        git(repo, "commit", "-q", "-m", f"f.txt {text.strip()}")
    return git(repo, "rev-list", "--reverse", "HEAD").split()[1:]


def ctl(tree: Tree, *args: str, exits: tuple[int, ...] = (0,)) -> str:
    """`orchestra-sup ctl ARGS` as a user runs it; its stdout (its exit code one of `exits`)."""
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode in exits, proc.stderr
    return proc.stdout


def lane_result(tree: Tree, *params: str) -> dict[str, object]:
    """`ctl call start_lane PARAMS`, then its one task as `ctl plan PLAN --json` shows it once
    it ended (`--wait`: exit 0 when it succeeded, 1 when not)."""
    started = json.loads(ctl(tree, "call", "start_lane", *params, "--json"))
    wait = ("plan", started["plan"], "--wait", "--timeout", "90", "--json")
    report = json.loads(ctl(tree, *wait, exits=(0, EXIT_FAILED)))
    assert report["done"], report
    (task,) = report["tasks"]
    return task


def test_a_lane_at_a_rev_sees_that_commit_and_reports_its_sha(
    tree: Tree, repo: Path, shas: list[str]
) -> None:
    """At the first commit (by sha, short sha and `HEAD~2`) a lane reads f.txt as it was then,
    and its report's `rev` is the full sha; without rev it is at the head."""
    for rev in (shas[0], shas[0][:10], "HEAD~2"):
        task = lane_result(tree, "run=cat f.txt", f"rev={rev}")
        assert (task["status"], task["exit_code"]) == ("succeeded", 0), task
        assert (task["output_tail"], task["rev"]) == ("1\n", shas[0]), rev
    head = lane_result(tree, "run=echo hi")
    assert (head["status"], head["exit_code"], head["output_tail"]) == ("succeeded", 0, "hi\n")
    assert head["rev"] == shas[2] and head["failure"] is None and head["commit"] is None
    assert git(repo, "rev-parse", "HEAD") == shas[2]  # nothing moved the workspace


def test_a_bad_rev_fails_its_lane_in_one_line_and_the_tree_stays_up(
    tree: Tree, shas: list[str]
) -> None:
    custodian = tree.child("custodian")
    task = lane_result(tree, "run=cat f.txt", "rev=no-such-branch")
    assert task["status"] == "failed" and task["failure"] == "tool_failure", task
    assert task["error"] == "unknown rev 'no-such-branch': no such commit"
    assert task["rev"] is None and task["exit_code"] is None
    after = tree.child("custodian")  # neither crashed nor wedged: it serves the next lane
    assert (after.pid, after.restarts, after.internal_errors) == (custodian.pid, 0, 0)
    assert lane_result(tree, "run=cat f.txt", f"rev={shas[1]}")["output_tail"] == "2\n"


def test_feedback_reaches_the_lanes_environment(tree: Tree, shas: list[str]) -> None:
    task = lane_result(tree, 'run=printf "<%s>" "$ORCHESTRA_FEEDBACK"', "feedback=use tabs")
    assert task["output_tail"] == "<use tabs>", task
    assert lane_result(tree, 'run=printf "<%s>" "${ORCHESTRA_FEEDBACK-unset}"')["output_tail"] == (
        "<unset>"
    )


def test_commit_true_at_an_older_rev_lands_its_change_on_the_head(
    tree: Tree, repo: Path, shas: list[str]
) -> None:
    """The lane's change against the first commit is picked onto the head (whose f.txt stays
    "3"); the report's `commit` is the new head, its `rev` the first commit."""
    task = lane_result(
        tree, 'run=test "$(cat f.txt)" = 1 && echo new > g.txt', f"rev={shas[0]}", "commit=true"
    )
    assert task["status"] == "succeeded" and task["rev"] == shas[0], task
    assert task["commit"] == git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", "HEAD~1") == shas[2]
    assert (repo / "f.txt").read_text() == "3\n" and (repo / "g.txt").read_text() == "new\n"
    assert lane_result(tree, "run=echo new > h.txt", "commit=false")["commit"] is None
    assert not (repo / "h.txt").exists()


def test_a_lane_moved_by_a_shard_rollover_keeps_its_rev(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, shas: list[str]
) -> None:
    """A program lane at the first commit, parked in `recv`, moves to the shard's next
    generation (its sandbox with it, `LaneSnapshot.rev`): its result still says that sha."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text(f'[lanes]\nprograms = ["{RUNS}"]\n')
    tree = tree_factory(
        workspace=repo, shards=1, lanes=2, config=cfg, extra_env={"PYTHONPATH": str(REPO)}
    )
    started = tree.call("start_lane", program=RUNS, rev=shas[0])
    lane_id = f"{started['plan']}-lane-1"

    def running() -> dict[str, str] | None:
        try:
            status = tree.call("lane_status", lane=lane_id)
        except RemoteError as exc:  # not placed yet
            assert exc.code is ErrorCode.NOT_FOUND, exc
            return None
        return status if status["state"] == "running" else None

    wait_until(running, 30, "the lane to run")
    release = make_release(tmp_path / "release-9", "python", version="9.0.0")
    report, events = rollover(tree, "shard-0", release, lambda event: None)
    assert report.ok and any(e.text.endswith(" moved") for e in events), report
    tree.call("message_lane", lane=lane_id, text="cat f.txt")
    tree.call("message_lane", lane=lane_id, text="exit")
    (task,) = tree.wait_plan(started["plan"]).tasks
    assert (task.status, task.rev, task.output_tail) == ("succeeded", shas[0], "1\n"), task
