"""The coordinator's seat on real trees: a user's program runs inside the coordinator process,
is refused unless listed, survives SIGKILL with its inbox, and a wedged one is restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.coordinator.seat import MAX_WEDGES
from orchestra_sup.errors import RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, settled, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = "tests.integration.coordinator_programs"
NAMES = (
    "Squares",
    "Inbox",
    "Blocks",
    "Raises",
    "Asks",
    "Wedges",
    "Returns",
    "Waits",
    "Exits",
    "Keys",
    "Overspends",
    "Rereads",
    "Notes",
    "Gathers",
    "Stubborn",
    "Many",
    "Busy",
)
CHATTY = "tests.integration.lane_programs:Chatty"
LISTED = [f"{PROGRAMS}:{name}" for name in NAMES]


@pytest.fixture
def seat(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> Tree:
    cfg = tmp_path / "tree.toml"
    listed = ", ".join(f'"{p}"' for p in LISTED)
    cfg.write_text(
        f"[supervisor]\nwatchdog_s = 2.0\n\n[coordinator]\nprograms = [{listed}]\n\n"
        f'[lanes]\nprograms = ["{CHATTY}"]\n'
    )
    return tree_factory(workspace=repo, config=cfg, extra_env={"PYTHONPATH": str(REPO)})


def session(name: str, program: str, **args: object) -> f.PlanSpec:
    return f.PlanSpec(name=name, tasks=[], coordinator=program, args=dict(args))


def ctl(tree: Tree, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_users_program_starts_lanes_and_returns_a_value_from_their_outputs(seat: Tree) -> None:
    plan = seat.submit(session("squares", f"{PROGRAMS}:Squares", numbers=[1, 2, 3]))
    report = seat.wait_plan(plan, timeout_s=60)
    assert report.ok, report
    assert report.coordinator == f"{PROGRAMS}:Squares"
    assert report.result == {"sum": 14, "lanes": 3}
    assert [lane.status for lane in report.lanes] == ["succeeded"] * 3
    assert [lane.key for lane in report.lanes] == ["0.0", "0.1", "0.2"]
    shown = ctl(seat, "plan", plan, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["result"] == {"sum": 14, "lanes": 3}
    listed = ctl(seat, "plans", "--json")
    assert listed.returncode == 0, listed.stderr
    (line,) = [p for p in json.loads(listed.stdout)["plans"] if p["id"] == plan]
    assert line["done"] and line["ok"] and line["tasks"] == {"succeeded": 3}


def test_a_program_not_listed_is_refused_at_submit(seat: Tree, tmp_path: Path) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text('name = "x"\ncoordinator = "tests.integration.lane_programs:Runs"\n')
    done = ctl(seat, "submit", str(plan))
    assert done.returncode == 2, done
    assert "is not in the tree's [coordinator] programs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_bad_args_are_refused_at_submit_in_one_line(seat: Tree, tmp_path: Path) -> None:
    """The seat builds the program once at submit: its constructor's refusal is the plan's."""
    plan = tmp_path / "p.toml"
    args = 'good = "a"\nbad = "b"\ncheck = "true"\nparallel = 40'
    plan.write_text(f'name = "b"\ncoordinator = "bisect"\n[args]\n{args}\n')
    done = ctl(seat, "submit", str(plan))
    assert done.returncode == 2, done
    assert "coordinator 'bisect' refused its [args]" in done.stderr
    assert "'parallel'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    listed = ctl(seat, "plans", "--json")
    assert listed.returncode == 0 and '"b"' not in listed.stdout  # nothing was accepted


def test_a_raise_fails_only_its_own_plan(seat: Tree) -> None:
    bad = seat.submit(session("raises", f"{PROGRAMS}:Raises"))
    good = seat.submit(session("squares", f"{PROGRAMS}:Squares", numbers=[4]))
    failed = seat.wait_plan(bad)
    assert not failed.ok and failed.error == "RuntimeError: the program gave up"
    assert seat.wait_plan(good).result == {"sum": 16, "lanes": 1}


def test_inbox_events_after_the_checkpoint_are_redelivered_after_sigkill(
    seat: Tree, tmp_path: Path
) -> None:
    marker = tmp_path / "handled"
    plan = seat.submit(session("inbox", f"{PROGRAMS}:Inbox", marker=str(marker)))
    for text in ("a", "b", "c"):
        assert ctl(seat, "message", plan, text).returncode == 0
    wait_until(lambda: marker.exists() and marker.read_text() == "1 a b c\n", 30, "a, b, c")
    pid = seat.pids()["coordinator"]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # "c" was delivered and handled, never checkpointed
    wait_until(lambda: seat.pids()["coordinator"] not in (None, pid), 30, "a new coordinator")
    wait_until(lambda: marker.read_text() == "2 a b c\n", 30, "c again, in run 2")
    assert ctl(seat, "message", plan, "stop").returncode == 0
    report = settled(seat, plan)
    assert report.result == {"handled": ["a", "b"], "runs": 2}
    # "c" was handled twice, but its lane started once: the same effect id answered it
    assert [lane.run for lane in report.lanes] == ["echo a", "echo b", "echo c"]


def test_a_program_that_blocks_the_loop_is_restarted_and_its_plan_resumes(seat: Tree) -> None:
    before = seat.pids()["coordinator"]
    plan = seat.submit(session("blocks", f"{PROGRAMS}:Blocks", block_s=8.0))
    report = settled(seat, plan)
    assert report.result == "resumed", report
    assert seat.pids()["coordinator"] != before  # the watchdog restarted it


def test_a_program_that_wedges_every_run_fails_its_plan_after_max_wedges(
    seat: Tree,
) -> None:
    plan = seat.submit(session("wedges", f"{PROGRAMS}:Wedges", block_s=60.0))
    report = settled(seat, plan, timeout_s=120)
    assert not report.ok
    assert (
        report.error is not None
        and f"died during its program's steps {MAX_WEDGES} times" in report.error
    )
    squares = seat.submit(session("after", f"{PROGRAMS}:Squares", numbers=[2]))
    assert settled(seat, squares).result == {"sum": 4, "lanes": 1}  # the tree serves again


@pytest.mark.parametrize("kind", ["set", "bytes", "nan"])
def test_a_result_that_is_not_json_fails_the_plan(seat: Tree, kind: str) -> None:
    report = seat.wait_plan(seat.submit(session("returns", f"{PROGRAMS}:Returns", kind=kind)))
    assert not report.ok and report.result is None
    assert report.error is not None and report.error.startswith("result is not JSON-able")


@pytest.mark.parametrize("kind", ["sys_exit", "keyboard", "base", "cancelled"])
def test_a_program_raising_past_exception_fails_only_its_plan(seat: Tree, kind: str) -> None:
    pid = seat.pids()["coordinator"]
    report = seat.wait_plan(seat.submit(session("exits", f"{PROGRAMS}:Exits", kind=kind)))
    assert not report.ok and report.error, report
    assert seat.pids()["coordinator"] == pid  # the coordinator kept its process


def test_a_program_that_ends_the_process_is_failed_after_max_wedges(seat: Tree) -> None:
    report = settled(seat, seat.submit(session("exits", f"{PROGRAMS}:Exits", kind="os_exit")))
    assert (
        report.error is not None
        and f"died during its program's steps {MAX_WEDGES} times" in report.error
    )
    assert settled(seat, seat.submit(session("ok", f"{PROGRAMS}:Squares", numbers=[3]))).ok


def test_a_programs_key_has_its_own_namespace_and_asks_the_same(seat: Tree) -> None:
    report = seat.wait_plan(seat.submit(session("keys", f"{PROGRAMS}:Keys")))
    assert report.result["a"] == "A\n" and report.result["b"] == "B\n", report
    assert "a call with the same key must ask the same" in report.result["refused"]
    assert [lane.key for lane in report.lanes] == ["k.0.1", "0.1"]


def test_lanes_running_at_once_hold_the_session_budget(seat: Tree) -> None:
    spec = session("spends", f"{PROGRAMS}:Overspends")
    spec = msgspec.structs.replace(spec, budget=f.Budget(wall_s=3.0))
    report = seat.wait_plan(seat.submit(spec))
    assert report.result["started"] == 1, report
    assert "budget has no wall_s left" in report.result["refused"]


def test_a_new_events_loop_after_break_reads_on(seat: Tree) -> None:
    plan = seat.submit(session("rereads", f"{PROGRAMS}:Rereads"))
    for text in ("one", "two"):
        assert ctl(seat, "message", plan, text).returncode == 0
    assert seat.wait_plan(plan).result == ["one", "two"]


def test_a_lanes_note_arrives_in_its_sessions_inbox(seat: Tree) -> None:
    report = seat.wait_plan(seat.submit(session("notes", f"{PROGRAMS}:Notes", lane_program=CHATTY)))
    assert report.ok, report
    assert report.result == {"text": "nnn", "lane": report.lanes[0].lane}


def test_starts_made_at_once_hold_the_session_budget_while_in_flight(seat: Tree) -> None:
    spec = msgspec.structs.replace(
        session("gathers", f"{PROGRAMS}:Gathers"), budget=f.Budget(wall_s=3.0)
    )
    report = seat.wait_plan(seat.submit(spec))
    assert report.result["started"] == 1, report
    assert all("budget has no wall_s left" in r for r in report.result["refused"])


def test_a_program_that_swallows_its_cancel_stays_cancelled(seat: Tree, tmp_path: Path) -> None:
    marker = tmp_path / "returned"
    plan = seat.submit(session("stubborn", f"{PROGRAMS}:Stubborn", marker=str(marker)))
    wait_until(lambda: lanes_of(seat, plan), 30, "its lane")
    assert ctl(seat, "cancel", plan).returncode == 0
    wait_until(marker.exists, 30, "the program to return after swallowing the cancel")
    report = seat.wait_plan(plan)
    assert not report.ok and report.error == "cancelled" and report.result is None


def test_ctl_cancel_of_a_session_cancels_its_lanes_not_yet_placed(seat: Tree) -> None:
    plan = seat.submit(session("many", f"{PROGRAMS}:Many", n=20))  # 16 run, 4 wait for a slot
    wait_until(lambda: len(lanes_of(seat, plan)) == 20, 30, "its 20 lanes")
    assert ctl(seat, "cancel", plan).returncode == 0
    report = seat.wait_plan(plan)
    for lane in report.lanes:
        child = seat.wait_plan(lane.plan)
        assert child.tasks[0].status == "cancelled", child


def test_operators_sigkills_blame_no_session(seat: Tree, tmp_path: Path) -> None:
    """A busy program is mid-step most of the time; SIGKILLs from outside are not its doing."""
    stop = tmp_path / "stop"
    plan = seat.submit(session("busy", f"{PROGRAMS}:Busy", stop=str(stop)))
    wait_until(lambda: lanes_of(seat, plan), 30, "its lane")
    for _ in range(MAX_WEDGES + 1):
        pid = seat.pids()["coordinator"]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda old=pid: seat.pids()["coordinator"] not in (None, old), 30, "a new one")
        wait_until(lambda: answers_again(seat, plan), 30, "the session's plan again")
    stop.touch()
    assert settled(seat, plan).ok


def lanes_of(tree: Tree, plan: str) -> list[f.SessionLaneReport]:
    try:
        report = tree.ctl(f.CtlPlan(id=plan), timeout_s=10)
    except RemoteError:
        return []
    assert isinstance(report, f.PlanReport)
    return report.lanes


def answers_again(tree: Tree, plan: str) -> bool:
    """The new coordinator answers for the session (its lanes are loaded)."""
    return bool(lanes_of(tree, plan))


def test_ctl_cancel_of_a_session_stops_it_and_its_lanes(seat: Tree) -> None:
    plan = seat.submit(session("waits", f"{PROGRAMS}:Waits"))

    def lane() -> str | None:
        report = seat.ctl(f.CtlPlan(id=plan))
        assert isinstance(report, f.PlanReport)
        return report.lanes[0].lane if report.lanes and report.lanes[0].lane else None

    started = str(wait_until(lane, 30, "the session's lane"))
    done = ctl(seat, "cancel", plan)
    assert done.returncode == 0, done.stderr
    report = seat.wait_plan(plan)
    assert not report.ok and report.error == "cancelled"
    child = seat.wait_plan(report.lanes[0].plan)
    assert child.tasks[0].status == "cancelled" and child.tasks[0].lane == started


def test_a_session_question_is_answered_with_ctl(seat: Tree) -> None:
    plan = seat.submit(session("asks", f"{PROGRAMS}:Asks"))

    def asked() -> str | None:
        lanes = seat.ctl(f.CtlLanes())  # what `ctl lanes` shows: pending questions included
        assert isinstance(lanes, f.LaneList)
        return next((p.lane for p in lanes.lanes if p.plan == plan), None)

    handle = str(wait_until(asked, 30, "the question in ctl lanes"))
    refused = ctl(seat, "accept-partial", handle)  # a session's question has no step to end
    assert refused.returncode == 2 and "takes approve, reject, redirect" in refused.stderr
    done = ctl(seat, "reject", handle, "--reason", "not yet")
    assert done.returncode == 0, done.stderr
    assert seat.wait_plan(plan).result == {"verdict": "reject", "text": "not yet"}
