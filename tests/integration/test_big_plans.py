"""Big plans on a real tree: thousands of tasks neither wedge the coordinator nor starve others."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.coordinator.plan import MAX_TASKS
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, osup, plan, task

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


def limit_plan_file(path: Path, tasks: int) -> Path:
    """A plan file of `tasks` independent tasks."""
    path.write_text(
        'name = "huge"\n' + "".join(f'[[task]]\nid = "t{i}"\nrun = "true"\n' for i in range(tasks))
    )
    return path


def test_a_plan_over_the_task_limit_is_refused_in_one_line(tree: Tree, tmp_path: Path) -> None:
    """A plan file of MAX_TASKS + 1 tasks: `ctl submit` and `run` exit 2 with one line naming
    the limit; sent to the coordinator by hand it is refused (bad_request, the same words) and
    nothing of it is kept."""
    over = limit_plan_file(tmp_path / "over.toml", MAX_TASKS + 1)
    expected = f"{MAX_TASKS + 1:,} tasks: a plan holds at most {MAX_TASKS:,}"
    run_dir = str(tree.run_dir)
    for argv in (("ctl", "--run-dir", run_dir, "submit", str(over)), ("run", str(over))):
        proc = osup(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], proc.stderr
    spec = plan("huge", *(task(f"t{i}", "true") for i in range(MAX_TASKS + 1)))
    with pytest.raises(RemoteError) as info:
        tree.ctl(f.CtlSubmit(plan=spec), timeout_s=60)
    assert info.value.code is ErrorCode.BAD_REQUEST and expected in str(info.value)
    listed = tree.ctl(f.CtlPlans())
    assert isinstance(listed, f.PlanList) and listed.plans == []


def test_a_plan_at_the_task_limit_is_accepted_and_settles(tree: Tree) -> None:
    """MAX_TASKS tasks that all need a first one that fails: accepted, every other task is
    skipped, and the coordinator keeps its pid."""
    before = tree.child("coordinator")
    root = task("root", "exit 1")
    spec = plan(
        "wide", root, *(task(f"t{i}", "true", needs=["root"]) for i in range(MAX_TASKS - 1))
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=120)
    assert report.done and len(report.tasks) == MAX_TASKS
    assert {t.status for t in report.tasks[1:]} == {"skipped"}
    assert tree.child("coordinator").pid == before.pid
