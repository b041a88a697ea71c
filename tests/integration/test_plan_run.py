"""Plans on real trees: real processes, sockets, git and LMDB."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, alive, assert_no_leftovers, git, plan, task, wait_until

pytestmark = pytest.mark.integration


def test_plan_with_chain_failure_commit_and_both_shards(tree: Tree, repo: Path) -> None:
    """A 7-task plan: a dependency chain, a committed change its dependent sees, a failure with
    a skipped dependent, lanes spread over both shards, one sandbox per lane."""
    spec = plan(
        "e2e",
        task("gen", "printf 'v1\\n' > gen.txt", commit=True),
        task("check", 'test "$(cat gen.txt)" = v1 && echo saw-commit', needs=["gen"]),
        task("chain", "echo chained", needs=["check"]),
        # four tasks are ready at once; least-loaded placement alternates between the shards
        task("w1", "echo w1"),
        task("w2", "echo w2"),
        task("bad", "echo failing >&2; exit 7"),
        task("after-bad", "echo never", needs=["bad"]),
    )
    report = tree.wait_plan(tree.submit(spec))
    by_id = {t.id: t for t in report.tasks}
    assert report.done and not report.ok
    for ok in ("gen", "check", "chain", "w1", "w2"):
        assert by_id[ok].status == "succeeded", by_id[ok]
        assert by_id[ok].attempts == 1
    assert "saw-commit" in by_id["check"].output_tail
    assert by_id["bad"].status == "failed" and by_id["bad"].exit_code == 7
    assert "failing" in by_id["bad"].output_tail
    assert by_id["after-bad"].status == "skipped"
    assert "bad" in (by_id["after-bad"].error or "")

    commit = by_id["gen"].commit
    assert commit is not None
    assert git(repo, "rev-parse", "HEAD") == commit
    assert (repo / "gen.txt").read_text() == "v1\n"
    assert "e2e/gen" in git(repo, "log", "-1", "--format=%s")

    ran = [t for t in report.tasks if t.status != "skipped"]
    sandboxes = [t.sandbox for t in ran]
    assert None not in sandboxes and len(set(sandboxes)) == len(ran)
    for sandbox in sandboxes:
        assert not Path(sandbox).is_relative_to(repo)  # type: ignore[arg-type]
    assert {t.shard for t in ran} == {"shard-0", "shard-1"}


def test_task_printing_megabytes_finishes(tree: Tree) -> None:
    """A command printing 20 MB on stdout and 5 MB on stderr neither stalls nor bloats."""
    spec = plan(
        "loud",
        task(
            "loud",
            "head -c 20000000 /dev/zero | tr '\\0' x; head -c 5000000 /dev/zero >&2; "
            "echo; echo done",
        ),
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=90)
    (loud,) = report.tasks
    assert loud.status == "succeeded"
    assert loud.output_tail.rstrip().endswith("done")
    assert len(loud.output_tail) <= 8192


def test_stop_mid_plan_leaves_no_process(tree: Tree) -> None:
    """SIGTERM while lanes run commands with background children: exit 0, nothing left."""
    spec = plan(
        "busy",
        task("a", "sleep 300 & sleep 300"),
        task("b", "(sleep 300 &) ; sleep 300"),
        task("c", "sleep 300"),
    )
    tree.submit(spec)

    def running() -> bool:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return sum(lane.state == "running" for lane in reply.lanes) == 3

    wait_until(running, 20, "three running lanes")
    assert tree.stop() == 0
    assert_no_leftovers()


def test_cancel_stops_the_lane_and_its_group(tree: Tree) -> None:
    """`ctl cancel` kills the lane's whole process group at once; the task is cancelled."""
    spec = plan(
        "cancel",
        task("long", "echo started; sleep 300 & sleep 300"),
        task("dep", "true", ["long"]),
    )
    plan_id = tree.submit(spec)

    def live_lane() -> str | None:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        lanes = [lane for lane in reply.lanes if lane.state == "running"]
        return lanes[0].lane if lanes else None

    lane = wait_until(live_lane, 20, "the lane to run")
    shards = [pid for name, pid in tree.pids().items() if name.startswith("shard")]

    def lane_group() -> list[psutil.Process] | None:
        # "running" can be reported a moment before the command has started both sleeps
        try:
            procs = [p for pid in shards for p in psutil.Process(pid).children(recursive=True)]
            return procs if [p.name() for p in procs].count("sleep") == 2 else None
        except (psutil.Error, OSError):
            return None

    group = wait_until(lane_group, 10, "the lane's two sleeps")
    assert isinstance(group, list)
    assert tree.ctl(f.CtlCancel(lane=lane)) == f.Ack()  # type: ignore[arg-type]
    gone = "every process of the lane's group to be killed"
    wait_until(lambda: not any(alive(p) for p in group), 5, gone)
    report = tree.wait_plan(plan_id, timeout_s=10)
    by_id = {t.id: t for t in report.tasks}
    assert by_id["long"].status == "cancelled"
    assert "started" in by_id["long"].output_tail  # what it printed before the cancel is kept
    assert by_id["dep"].status == "skipped"
    reply = tree.ctl(f.CtlLanes())
    assert isinstance(reply, f.LaneList) and reply.lanes == []
    assert tree.stop() == 0
    assert_no_leftovers()


def test_timeout_kills_the_group_and_fails_the_task(tree: Tree) -> None:
    """`timeout_s` kills the command's whole process group and fails the task, saying so."""
    spec = plan("slow", task("slow", "sleep 300 & sleep 300", timeout_s=0.5))
    report = tree.wait_plan(tree.submit(spec), timeout_s=20)
    (slow,) = report.tasks
    assert slow.status == "failed"
    assert "timed out" in (slow.error or "")
    assert tree.stop() == 0
    assert_no_leftovers()


def test_conflicting_commit_is_the_task_error(tree: Tree, repo: Path) -> None:
    """Two lanes from the same head edit the same line: the first lands, the second fails with
    a conflict, and the workspace holds exactly the first."""
    spec = plan(
        "clash",
        task("one", "echo one > README", commit=True),
        task("two", "sleep 0.5; echo two > README", commit=True),
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=30)
    by_id = {t.id: t for t in report.tasks}
    assert by_id["one"].status == "succeeded" and by_id["one"].commit
    assert by_id["two"].status == "failed"
    assert "conflict" in (by_id["two"].error or "")
    assert (repo / "README").read_text() == "one\n"
    assert git(repo, "status", "--porcelain") == ""


def test_lane_bound_is_respected(tree_factory: Callable[..., Tree], repo: Path) -> None:
    """With one shard of one lane, four independent tasks run one at a time and all succeed."""
    tree = tree_factory(workspace=repo, shards=1, lanes=1)
    marker = repo.parent / "concurrency"
    marker.mkdir()
    # each task holds a directory entry while it runs; a second concurrent lane would see it
    mine = f"{marker}/$ORCHESTRA_TASK"
    body = f'test -z "$(ls {marker})" && touch {mine} && sleep 0.2 && rm {mine}'
    spec = plan("bound", *(task(f"t{i}", body) for i in range(4)))
    report = tree.wait_plan(tree.submit(spec), timeout_s=30)
    assert report.ok, report


@pytest.mark.parametrize(("config", "added"), [("", 10), ("[lanes]\nnice = 3\n", 3)])
def test_lane_commands_run_at_the_configured_niceness(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, config: str, added: int
) -> None:
    """Lanes yield the CPU to the tree's own processes: `[lanes] nice` (default 10) is added to
    every lane command's niceness, and not to the shard's own."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text(config)
    tree = tree_factory(workspace=repo, config=cfg)
    report = tree.wait_plan(tree.submit(plan("nice", task("stat", "cat /proc/self/stat"))))
    assert report.ok
    lane_nice = int(report.tasks[0].output_tail.rsplit(")", 1)[1].split()[16])
    shard = psutil.Process(tree.pids()[report.tasks[0].shard or ""])
    assert lane_nice == min(19, shard.nice() + added)
