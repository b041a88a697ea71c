"""Big plans on a real tree: thousands of tasks neither wedge the coordinator nor starve others."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task

pytestmark = pytest.mark.integration

CHAIN = 5000


def goal_first_chain(size: int, first: str) -> f.PlanSpec:
    """A chain of `size` tasks, each needing the one before, listed goal first (the order that
    made skipping quadratic); the first task runs `first`."""
    tasks = [task(f"t{i}", "true", needs=[f"t{i - 1}"]) for i in range(size - 1, 0, -1)]
    return plan("chain", *tasks, task("t0", first))


def test_a_5000_task_chain_whose_first_task_fails_settles_without_a_watchdog_kill(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """watchdog_s = 5 and a 5,000-task chain listed goal first whose first task fails: the
    coordinator keeps its pid, every dependent is skipped, and a plan submitted meanwhile is
    served."""
    config = tmp_path / "tree.toml"
    config.write_text("[supervisor]\nwatchdog_s = 5.0\n")
    tree = tree_factory(workspace=repo, config=config)
    before = tree.child("coordinator")
    big = tree.submit(goal_first_chain(CHAIN, "exit 3"))
    other = tree.submit(plan("other", task("hello", "echo hello")))

    served = tree.wait_plan(other, timeout_s=60)
    assert served.ok, served
    report = tree.wait_plan(big, timeout_s=60)
    by_id = {t.id: t for t in report.tasks}
    assert by_id["t0"].status == "failed" and by_id["t0"].exit_code == 3, by_id["t0"]
    skipped = [t for t in report.tasks if t.status == "skipped"]
    assert len(skipped) == CHAIN - 1, {t.status for t in report.tasks}
    assert by_id["t1"].error == "skipped: t0 did not succeed"
    after = tree.child("coordinator")
    assert (after.pid, after.generation) == (before.pid, before.generation), (
        f"the coordinator was restarted (pid {before.pid} -> {after.pid})"
    )
