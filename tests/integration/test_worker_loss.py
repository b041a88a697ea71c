"""Worker-process loss on real trees: a lane whose shard dies is paused and re-placed, never failed
for it (ARCHITECTURE.md §11 invariant 5), until `[lanes] max_worker_loss` losses of one task."""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration

DEFAULT_MAX_WORKER_LOSS = 3


def _lane_of(tree: Tree, task_id: str) -> f.LaneInfo | None:
    reply = tree.ctl(f.CtlLanes())
    assert isinstance(reply, f.LaneList)
    return next((lane for lane in reply.lanes if lane.task == task_id), None)


def _attempts_started(marks: Path) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


def test_lane_of_a_killed_shard_is_replaced_on_the_restarted_shard(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """One shard, SIGKILLed while a lane runs: the lane is re-placed on the restarted shard
    (generation 2) and re-runs its step as attempt 2, which succeeds with a partial-work warning;
    its dependant runs and the plan is ok; the lost lane's command does not outlive its shard."""
    tree = tree_factory(workspace=repo, shards=1)
    marks = tmp_path / "marks"
    marks.mkdir()
    run = (
        f"touch {shlex.quote(str(marks))}/attempt-$ORCHESTRA_ATTEMPT; "
        'if [ "$ORCHESTRA_ATTEMPT" = 1 ]; then sleep 300; fi; echo done'
    )
    plan_id = tree.submit(plan("loss", task("step", run), task("after", "true", ["step"])))
    wait_until(lambda: (marks / "attempt-1").exists(), 20, "the first attempt to start")
    lane = _lane_of(tree, "step")
    assert lane is not None and lane.shard == "shard-0"
    shard_pid = tree.pids()["shard-0"]
    assert shard_pid is not None
    sleeper = wait_until(
        lambda: next(
            (p for p in psutil.Process(shard_pid).children(recursive=True) if p.name() == "sleep"),
            None,
        ),
        10,
        "the first attempt's sleep",
    )
    assert isinstance(sleeper, psutil.Process)
    os.kill(shard_pid, signal.SIGKILL)

    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    step, after = report.tasks
    assert (step.status, step.attempts, step.failure) == ("succeeded", 2, None)
    assert (step.shard, step.lane) == ("shard-0", f"{plan_id}-step-2")
    assert step.exit_code == 0 and "done" in step.output_tail
    assert len(step.warnings) == 1
    assert "partial work" in step.warnings[0]
    assert lane.lane in step.warnings[0] and "shard-0 (generation 1)" in step.warnings[0]
    assert (after.status, after.attempts, after.warnings) == ("succeeded", 1, [])
    assert _attempts_started(marks) == ["attempt-1", "attempt-2"]
    assert tree.child("shard-0").generation == 2
    wait_until(lambda: not sleeper.is_running(), 10, "the lost lane's command to be killed")


@pytest.mark.parametrize("cap", [None, 2], ids=["default", "config-2"])
def test_command_that_kills_its_own_shard_fails_after_max_worker_loss(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, cap: int | None
) -> None:
    """A command that SIGKILLs its own shard on every attempt is re-placed until its
    max_worker_loss-th loss (default 3, or `[lanes] max_worker_loss` from the config file), then
    fails with the failure class worker_process_loss: it cannot loop. The plan completes with
    every task accounted for once, and the tree lives."""
    config = None
    if cap is not None:
        config = tmp_path / "lanes.toml"
        config.write_text(f"[lanes]\nmax_worker_loss = {cap}\n")
    tree = tree_factory(workspace=repo, config=config)
    losses = cap or DEFAULT_MAX_WORKER_LOSS
    marks = tmp_path / "marks"
    marks.mkdir()
    # `/bin/sh -c` is spawned by the shard itself, so the shell's $PPID is the shard process.
    run = f"touch {shlex.quote(str(marks))}/attempt-$ORCHESTRA_ATTEMPT; kill -9 $PPID"
    plan_id = tree.submit(
        plan(
            "suicide",
            task("boom", run),
            task("fine", "true"),
            task("after-boom", "true", ["boom"]),
            task("after-fine", "true", ["fine"]),
        )
    )
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.done and not report.ok
    assert [t.id for t in report.tasks] == ["boom", "fine", "after-boom", "after-fine"]
    by_id = {t.id: t for t in report.tasks}
    boom = by_id["boom"]
    assert (boom.status, boom.failure) == ("failed", "worker_process_loss")
    assert boom.attempts == losses
    assert f"lost {losses} times" in (boom.error or "")
    assert len(boom.warnings) == losses
    assert all(w.startswith("partial work: ") for w in boom.warnings)
    assert _attempts_started(marks) == [f"attempt-{i}" for i in range(1, losses + 1)]
    # `fine` may have shared a shard with `boom` and been re-placed too; it still succeeds.
    assert by_id["fine"].status == "succeeded" and by_id["fine"].failure is None
    assert by_id["after-fine"].status == "succeeded"
    assert (by_id["after-boom"].status, by_id["after-boom"].failure) == ("skipped", None)
    assert tree.proc.poll() is None
    assert tree.wait_plan(tree.submit(plan("after", task("a", "true")))).ok
