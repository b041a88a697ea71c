"""What a person sees of a real tree at an 80- and a 120-column terminal, and piped: `ctl status`,
`ctl top --once` and `ctl lanes` fit the width and cut no name, pid, state or lane id; a piped
status keeps each of its lines whole; `run` says why a task failed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.cli import render
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, make_repo, plan, task, wait_until
from tests.integration.terminal import at_terminal, row_of

pytestmark = pytest.mark.integration

LONG_TASK = "a-long-task-identifier-that-runs"  # its lane id: 47 characters


@pytest.fixture
def busy_tree(tree_factory: Callable[..., Tree], tmp_path: Path) -> tuple[Tree, str, str]:
    """A tree whose state (so every sandbox) is in a deep directory, running a lane with a long
    id and holding a task for approval; returns it, the running lane and the waiting one."""
    deep = tmp_path / "a-deep-temporary-directory" / "for-the-state-of" / "the-tree-under-test"
    tree = tree_factory(workspace=make_repo(tmp_path / "ws"), base=deep)
    tree.submit(
        plan(
            "a-rather-long-plan-name-for-the-test",
            task(LONG_TASK, "sleep 300"),
            task("gate", "true", approve=True),
        )
    )

    def lanes() -> tuple[str, str] | None:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        running = [x.lane for x in reply.lanes if x.state == "running" and x.sandbox]
        waiting = [x.lane for x in reply.lanes if x.state == "awaiting_approval"]
        return (running[0], waiting[0]) if running and waiting else None

    running, waiting = wait_until(lanes, 30, "a running lane and a pause")  # type: ignore[misc]
    return tree, running, waiting


def ctl(tree: Tree, *args: str, columns: int) -> list[str]:
    code, lines = at_terminal("ctl", "--run-dir", str(tree.run_dir), *args, columns=columns)
    assert code == 0, "\n".join(lines)
    too_long = [line for line in lines if len(line) > columns]
    assert not too_long, f"lines over {columns} columns:\n" + "\n".join(too_long)
    return lines


@pytest.mark.parametrize("columns", [80, 120])
def test_status_and_top_fit_and_cut_no_pid_state_or_name(
    busy_tree: tuple[Tree, str, str], columns: int
) -> None:
    """At 80 and 120 columns: no line is longer than the terminal, and every child's row has
    its name, pid and state whole. At 120, status keeps its restarts and loop lag columns."""
    tree, _, _ = busy_tree
    children = tree.status().children
    for command in (["status"], ["top", "--once"]):
        lines = ctl(tree, *command, columns=columns)
        for child in children:
            cells = row_of(lines, child.name)
            assert str(child.pid) in cells and child.state in cells, (command, cells)
    if columns >= 120:
        lines = ctl(tree, "status", columns=columns)
        header = " ".join(line for line in lines if "name" in line or "p50/p99/max" in line)
        assert "restarts" in header and "p50/p99/max" in header
        lag = row_of(lines, "coordinator")
        assert any(cell.count("/") == 2 for cell in lag), lag


@pytest.mark.parametrize("columns", [80, 120])
def test_lanes_fit_and_long_paths_go_to_wide(
    busy_tree: tuple[Tree, str, str], columns: int
) -> None:
    """`ctl lanes` and the lanes of `ctl top`: each lane id whole with its state; the sandbox
    path, too long for the terminal, is left out and named; --wide shows it whole on the
    lane's line."""
    tree, running, waiting = busy_tree
    for command in (["lanes"], ["top", "--once"]):
        lines = ctl(tree, *command, columns=columns)
        assert "running" in row_of(lines, running)
        assert "awaiting_approval" in row_of(lines, waiting)
        assert any(line.startswith("not shown: ") and "sandbox" in line for line in lines)
    code, wide = at_terminal("ctl", "--run-dir", str(tree.run_dir), "lanes", "--wide", columns=80)
    assert code == 0
    sandbox = tree.state_dir / "sandboxes" / running
    assert str(sandbox) in row_of(wide, running)


def test_piped_status_keeps_every_line_whole(busy_tree: tuple[Tree, str, str]) -> None:
    """Piped (no terminal): the supervisor's figures on one line, each path on its own line, and
    the table with every column, a row per child on one line."""
    tree, _, _ = busy_tree
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    proc = subprocess.run(
        [*argv, "status"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"supervisor pid {tree.proc.pid}  orchestra-sup ")
    assert "  loop lag ms p50/p99/max " in lines[0] and "  ctl refused 0  " in lines[0]
    assert " of 32 (refused 0)  cpu other nice 0, cpus " in lines[0]  # ctl connections
    assert lines[0].endswith("  lanes' cpu nice, nice 10")  # the CPU policy, the last fact
    assert f"state dir {tree.state_dir}" in lines
    header = next(line for line in lines if line.startswith("name "))
    assert header.split("  ")[0] == "name" and header.rstrip().endswith("internal  cpu")
    for child in tree.status().children:
        cells = row_of(lines, child.name)
        assert len(cells) == len(render.STATUS_FIELDS) and cells[2] == str(child.pid), cells


def test_run_shows_why_a_task_failed(tmp_path: Path) -> None:
    """`run` at an 80-column terminal: a failed task's last output lines are under the table
    (the tree that ran it is gone by then), and every line fits."""
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(
        'name = "readme-check"\n'
        '[[task]]\nid = "show-readme"\nrun = "echo looking; cat README.md"\n'
        '[[task]]\nid = "fine"\nrun = "echo fine"\n'
    )
    code, lines = at_terminal(
        "run", str(plan_file), "--state-dir", str(tmp_path / "state"), columns=80
    )
    assert code == 1, "\n".join(lines)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "failed" in row_of(lines, "show-readme")
    at = lines.index("show-readme failed; the last 2 lines of its output:")
    assert lines[at + 1 : at + 3] == [
        "  looking",
        "  cat: README.md: No such file or directory",
    ]
