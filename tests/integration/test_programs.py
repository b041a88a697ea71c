"""Lane programs on a real tree: a parked lane answers messages, ends, fails, is cancelled."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.bench.scale import PARKED
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, wait_until

pytestmark = pytest.mark.integration

NOT_A_PROGRAM = "orchestra_sup.shards.program:ProgramError"  # a class with no run()
RAISES = "tests.integration.lane_programs:Raises"
RUNS = "tests.integration.lane_programs:Runs"
HOSTILE = [
    f"tests.integration.lane_programs:{name}"
    for name in ("Interrupted", "NotAnOutcome", "HugeExitCode")
]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def programs(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> Tree:
    cfg = tmp_path / "tree.toml"
    listed = ", ".join(f'"{p}"' for p in (PARKED, NOT_A_PROGRAM, RAISES, RUNS, *HOSTILE))
    cfg.write_text(f"[lanes]\nprograms = [{listed}]\n")
    return tree_factory(workspace=repo, config=cfg, extra_env={"PYTHONPATH": str(REPO)})


def running(tree: Tree, lane: str) -> bool:
    try:
        return tree.call("lane_status", lane=lane)["state"] == "running"
    except RemoteError:
        return False


def test_a_parked_lane_takes_messages_in_order_and_ends_on_stop(programs: Tree) -> None:
    started = programs.call("start_lane", program=PARKED, run="")
    lane = str(started["lane"])
    wait_until(lambda: running(programs, lane), 20, "the parked lane to run")
    shard = psutil_children_of(programs, str(started["shard"]))
    for i in range(3):
        programs.call("message_lane", lane=lane, text=f"m{i}")
    assert psutil_children_of(programs, str(started["shard"])) == shard  # parked: no process
    programs.call("message_lane", lane=lane, text="stop")
    report = programs.wait_plan(str(started["plan"]), timeout_s=20)
    assert report.ok, report
    assert report.tasks[0].output_tail == "m0\nm1\nm2\n"


def test_a_parked_lane_is_cancelled_at_once(programs: Tree) -> None:
    started = programs.call("start_lane", program=PARKED, run="")
    lane = str(started["lane"])
    wait_until(lambda: running(programs, lane), 20, "the parked lane to run")
    programs.call("cancel_lane", lane=lane)
    report = programs.wait_plan(str(started["plan"]), timeout_s=10)
    assert report.tasks[0].status == "cancelled"


def test_a_program_that_cannot_run_fails_its_lane_not_the_shard(programs: Tree) -> None:
    pids = programs.pids()
    plan_id = programs.submit(
        f.PlanSpec(name="bad", tasks=[f.TaskSpec(id="x", run="", program=NOT_A_PROGRAM)])
    )
    report = programs.wait_plan(plan_id, timeout_s=20)
    assert report.tasks[0].status == "failed"
    assert "is not a class with a run method" in str(report.tasks[0].error)
    assert programs.pids() == pids


def test_a_program_that_raises_fails_its_lane_not_the_shard(programs: Tree) -> None:
    pids = programs.pids()
    started = programs.call("start_lane", program=RAISES)
    lane = str(started["lane"])
    wait_until(lambda: running(programs, lane), 20, "the lane to run")
    programs.call("message_lane", lane=lane, text="go")
    report = programs.wait_plan(str(started["plan"]), timeout_s=20)
    assert report.tasks[0].status == "failed"
    assert "RuntimeError('a bug in the program')" in str(report.tasks[0].error)
    assert programs.pids() == pids


def test_a_program_runs_commands_in_its_sandbox_through_exec(programs: Tree) -> None:
    """`exec` runs in the lane's sandbox, with its environment, output into its tail."""
    started = programs.call("start_lane", program=RUNS)
    lane = str(started["lane"])
    wait_until(lambda: running(programs, lane), 20, "the lane to run")
    programs.call("message_lane", lane=lane, text='echo "$ORCHESTRA_LANE in $(pwd)"')
    programs.call("message_lane", lane=lane, text="exit")
    report = programs.wait_plan(str(started["plan"]), timeout_s=20)
    assert report.ok, report
    task = report.tasks[0]
    assert task.output_tail == f"{lane} in {task.sandbox}\n"


def test_a_program_not_allowed_is_refused_at_submission(programs: Tree) -> None:
    spec = f.PlanSpec(name="nope", tasks=[f.TaskSpec(id="x", run="", program="os:system")])
    with pytest.raises(RemoteError) as info:
        programs.ctl(f.CtlSubmit(plan=spec))
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert "task x: program 'os:system' is not in [lanes] programs" in str(info.value)


def psutil_children_of(tree: Tree, shard: str) -> set[int]:
    import psutil

    pid = tree.pids()[shard]
    assert pid is not None
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


def test_a_shard_killed_under_a_parked_lane_pauses_it(programs: Tree) -> None:
    """A parked lane is a lane like any: its shard's loss pauses and re-places it."""
    started = programs.call("start_lane", program=PARKED, run="")
    lane = str(started["lane"])
    wait_until(lambda: running(programs, lane), 20, "the parked lane to run")
    os.kill(programs.pids()[str(started["shard"])], signal.SIGKILL)  # type: ignore[arg-type]

    def replaced() -> str | None:
        report = programs.ctl(f.CtlPlan(id=str(started["plan"])))
        assert isinstance(report, f.PlanReport)
        task = report.tasks[0]
        return task.lane if task.attempts == 2 and task.status == "running" else None

    second = str(wait_until(replaced, 30, "the lane to be placed again"))
    wait_until(lambda: running(programs, second), 20, "the second attempt to run")
    programs.call("message_lane", lane=second, text="stop")
    assert programs.wait_plan(str(started["plan"]), timeout_s=20).ok


def test_a_stop_interrupts_a_parked_lane_at_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A lane program with no command running has nothing to wind down: a stop cancels it
    without waiting out the 60 s grace a running command would get, and records it interrupted,
    so the next start runs it again."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text(f'[supervisor]\nshutdown_timeout_s = 60.0\n[lanes]\nprograms = ["{PARKED}"]\n')
    tree = tree_factory(workspace=repo, config=cfg, base=tmp_path / "t")
    started = tree.call("start_lane", program=PARKED)
    lane = str(started["lane"])
    wait_until(lambda: running(tree, lane), 20, "the parked lane to run")
    assert tree.stop(timeout_s=30) == 0  # the grace alone would be 60 s
    again = tree_factory(workspace=repo, config=cfg, base=tmp_path / "t")
    report = again.ctl(f.CtlPlan(id=str(started["plan"])))
    assert isinstance(report, f.PlanReport)
    assert report.tasks[0].attempts >= 1
    assert any("interrupted" in w for w in report.tasks[0].warnings), report.tasks[0]


@pytest.mark.parametrize("program", HOSTILE)
def test_what_a_program_returns_is_checked_before_it_is_stored(
    programs: Tree, program: str
) -> None:
    """A status only the shard may give, something that is not an Outcome, an exit code no
    record can hold: the lane fails, and nothing poisons the shard's durable outbox (its restart
    reads the outbox back)."""
    plan_id = programs.submit(
        f.PlanSpec(name="h", tasks=[f.TaskSpec(id="x", program=program, run="")])
    )
    report = programs.wait_plan(plan_id, timeout_s=20)
    assert report.tasks[0].status == "failed"
    assert f"program {program} returned" in str(report.tasks[0].error)
    shard = str(report.tasks[0].shard)
    assert programs.ctl(f.CtlRestart(name=shard), timeout_s=30) == f.Ack()
    assert programs.wait_running(shard, 2).state == "running"


def test_a_program_lane_is_bounded_by_its_timeout(programs: Tree) -> None:
    started = programs.call("start_lane", program=PARKED, timeout_s="0.5")
    report = programs.wait_plan(str(started["plan"]), timeout_s=20)
    assert report.tasks[0].status == "failed"
    assert report.tasks[0].error == "timed out after 0.5 s"


def test_a_message_over_64_kib_is_refused(programs: Tree) -> None:
    started = programs.call("start_lane", program=PARKED)
    lane = str(started["lane"])
    wait_until(lambda: running(programs, lane), 20, "the parked lane to run")
    with pytest.raises(RemoteError) as info:
        programs.call("message_lane", lane=lane, text="x" * (64 * 1024 + 1))
    assert info.value.code is ErrorCode.BAD_REQUEST and "at most 65536 bytes" in str(info.value)
    programs.call("message_lane", lane=lane, text="x" * (64 * 1024))
    programs.call("message_lane", lane=lane, text="stop")
    assert programs.wait_plan(str(started["plan"]), timeout_s=20).ok
