"""`ctl rollover` on real trees: each role moves onto a second release built in the test (a
wrapper script re-labelled through the test-only version override), at a quiet point, while a
plan runs; refusals and roll-backs leave the tree as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.errors import RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN
from tests.integration.harness import RawPeer, Tree, git, make_release, plan, task, wait_until

pytestmark = pytest.mark.integration

NEW = "9.0.0"


def lanes_running(tree: Tree, *tasks: str) -> bool:
    reply = tree.ctl(f.CtlLanes())
    assert isinstance(reply, f.LaneList)
    running = {lane.task for lane in reply.lanes if lane.state == "running"}
    return set(tasks) <= running


def gated(runs: Path, gate: Path, name: str) -> str:
    """A command that records that it ran, then waits for `gate`."""
    return f"echo {name} >> {runs}; while [ ! -e {gate} ]; do sleep 0.05; done"


def test_coordinator_moves_mid_plan_and_lanes_keep_running(tree: Tree, tmp_path: Path) -> None:
    """The coordinator is replaced at a quiet point on the new release; the shards (and the
    lanes in them) are untouched, and the new coordinator finishes the plan from its durable
    state: every task ran once."""
    release = make_release(tmp_path / "rel", "python", version=NEW)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id = tree.submit(
        plan(
            "coord",
            task("a", gated(runs, gate, "a")),
            task("b", gated(runs, gate, "b")),
            task("after", f"echo after >> {runs}", needs=["a", "b"]),
        )
    )
    wait_until(lambda: lanes_running(tree, "a", "b"), 20, "both lanes running")
    before = tree.status()
    result = tree.rollover("coordinator", release)
    assert result.returncode == 0, result.stderr
    assert "quiet point" in result.stdout and "generation 2 ready" in result.stdout
    after = {c.name: c for c in tree.status().children}
    for child in before.children:
        if child.name != "coordinator":  # nothing else moved
            assert (after[child.name].pid, after[child.name].generation) == (
                child.pid,
                child.generation,
            )
    coordinator = after["coordinator"]
    assert coordinator.generation == 2 and coordinator.version == NEW
    assert coordinator.release == str(release)
    gate.touch()
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    assert all(t.attempts == 1 for t in report.tasks), report
    assert sorted(runs.read_text().split()) == ["a", "after", "b"]


def test_custodian_moves_with_no_write_lost(tree: Tree, tmp_path: Path, repo: Path) -> None:
    """The custodian hands the workspace over at a quiet point: a lane running in its sandbox
    goes on (the sandbox stays on disk), and every commit lands exactly once."""
    release = make_release(tmp_path / "rel", "python", version=NEW)
    gate = tmp_path / "gate"
    plan_id = tree.submit(
        plan(
            "custodian",
            task(
                "slow",
                f"echo slow > slow.txt; while [ ! -e {gate} ]; do sleep 0.05; done",
                commit=True,
            ),
            *(task(f"w{i}", f"echo {i} > w{i}.txt", commit=True) for i in range(6)),
        )
    )
    wait_until(lambda: lanes_running(tree, "slow"), 20, "the slow lane running")
    result = tree.rollover("custodian", release)
    assert result.returncode == 0, result.stderr
    custodian = tree.child("custodian")
    assert custodian.generation == 2 and custodian.version == NEW
    gate.touch()
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    assert all(t.attempts == 1 and t.commit for t in report.tasks), report
    subjects = git(repo, "log", "--format=%s").splitlines()
    for t in report.tasks:
        assert sum(s.startswith(f"custodian/{t.id}:") for s in subjects) == 1, subjects


def test_an_incompatible_release_is_refused_and_nothing_moves(tree: Tree, tmp_path: Path) -> None:
    """A release whose protocol range does not overlap the tree's is refused before anything
    moves, in one line that names both versions; exit status 2."""
    release = make_release(tmp_path / "rel", "python", version="5.0.0", protocol="5..6")
    before = tree.status()
    result = tree.rollover("all", release)
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert (
        "5.0.0" in line
        and "5..6" in line
        and before.version in line
        and f"{PROTOCOL_MIN}..{PROTOCOL_MAX}" in line
    )
    after = tree.status()
    assert [(c.name, c.pid, c.generation, c.release) for c in after.children] == [
        (c.name, c.pid, c.generation, c.release) for c in before.children
    ]


def test_a_coordinator_whose_release_cannot_start_is_rolled_back(
    tree: Tree, tmp_path: Path
) -> None:
    """The new coordinator exits at once: the rollover rolls back onto the old release, says
    so, and exits 1; the coordinator runs (and answers) on the old release."""
    release = make_release(tmp_path / "rel", "python", crash=True)
    result = tree.rollover("coordinator", release)
    assert result.returncode == 1, result
    assert "rolled back" in result.stdout and "rolled back" in result.stderr
    coordinator = tree.child("coordinator")
    assert coordinator.state == "running" and coordinator.release == tree.status().release
    plan_id = tree.submit(plan("after", task("t", "true")))
    assert tree.wait_plan(plan_id, timeout_s=20).ok


def test_a_shard_whose_release_cannot_start_goes_on_as_before(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The surge's new generation exits at once: the old one goes on as if nothing happened
    (same pid and generation, its lane neither lost nor re-run), and takes new lanes again."""
    tree = tree_factory(workspace=repo, shards=1)
    release = make_release(tmp_path / "rel", "python", crash=True)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id = tree.submit(plan("surge", task("long", gated(runs, gate, "long"))))
    wait_until(lambda: lanes_running(tree, "long"), 20, "the lane running")
    before = tree.child("shard-0")
    result = tree.rollover("shard-0", release)
    assert result.returncode == 1, result
    assert "rolled back" in result.stdout
    after = tree.child("shard-0")
    assert (after.pid, after.generation, after.state) == (before.pid, before.generation, "running")
    assert after.last_exit == before.last_exit  # the failed start is not the worker's exit
    gate.touch()
    report = tree.wait_plan(plan_id, timeout_s=20)
    assert report.ok and report.tasks[0].attempts == 1, report
    assert runs.read_text().split() == ["long"]
    second = tree.submit(plan("again", task("t", "true")))
    assert tree.wait_plan(second, timeout_s=20).ok


def test_frames_from_a_retired_generation_are_refused_and_counted(
    tree: Tree, tmp_path: Path
) -> None:
    """After the coordinator moved to generation 2, a frame signed by generation 1 is refused
    with `stale_generation` (typed, answered) and counted in the receiver's status."""
    release = make_release(tmp_path / "rel", "python", version=NEW)
    assert tree.rollover("coordinator", release).returncode == 0
    shard = tree.child("shard-0")
    assert shard.stale_frames == 0
    with RawPeer(tree.run_dir / "shard-0.ipc", b"coordinator.1", "coordinator", 1) as peer:
        reply = peer.ask(f.ListLanes())
    assert isinstance(reply, f.Error) and reply.code == "stale_generation", reply
    assert "generation 1 is retired" in reply.message
    wait_until(lambda: tree.child("shard-0").stale_frames == 1, 10, "the refusal counted")


def test_results_that_arrive_during_a_coordinator_rollover_land_once(
    tree: Tree, tmp_path: Path
) -> None:
    """Lanes keep ending while the coordinator moves: results that reach the old generation at
    its quiet point are committed but left for the new one, later ones wait in the shards'
    outboxes; each lands exactly once, and every task ran once."""
    release = make_release(tmp_path / "rel", "python", version=NEW)
    runs = tmp_path / "runs"
    tasks = [task(f"t{i}", f"sleep 0.{i % 5}; echo t{i} >> {runs}") for i in range(40)]
    plan_id = tree.submit(plan("stream", *tasks))
    wait_until(lambda: runs.exists() and len(runs.read_text().split()) >= 4, 20, "some results")
    result = tree.rollover("coordinator", release)
    assert result.returncode == 0, result.stderr
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok, report
    assert all(t.attempts == 1 for t in report.tasks), report
    assert sorted(runs.read_text().split()) == sorted(f"t{i}" for i in range(40))


def test_a_start_the_old_coordinator_never_saw_answered_is_sent_again(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The coordinator records a placement durably before it sends the `LaneStart`. Restarted
    while its shard is stopped (SIGSTOP), it leaves the start unanswered: queued at the shard,
    which then refuses it as coming from a retired generation. The next generation sends it
    again, so the task runs, once, instead of waiting for ever."""
    import os
    import signal

    tree = tree_factory(workspace=repo, shards=1)
    runs = tmp_path / "runs"
    shard = tree.child("shard-0")
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGSTOP)
    try:
        plan_id = tree.submit(plan("resend", task("t", f"echo t >> {runs}")))

        def placed() -> bool:
            report = tree.ctl(f.CtlPlan(id=plan_id))
            return isinstance(report, f.PlanReport) and report.tasks[0].lane is not None

        wait_until(placed, 10, "the task placed")
        tree.ctl(f.CtlRestart(name="coordinator"), timeout_s=20)
    finally:
        os.kill(shard.pid, signal.SIGCONT)
    report = tree.wait_plan(plan_id, timeout_s=20)
    assert report.ok and report.tasks[0].attempts == 1, report
    assert runs.read_text().split() == ["t"]


def test_all_moves_every_process_mid_plan_and_the_plan_completes(
    tree: Tree, tmp_path: Path, repo: Path
) -> None:
    """`rollover all` moves the custodian, the coordinator, both shards (their lanes hand over)
    and the supervisor itself onto the new release while a plan runs: the plan completes, every
    step ran once (a step stopped at the drain timeout re-runs, and says so), the supervisor
    kept its pid, and every process reports the new version."""
    release = make_release(tmp_path / "rel", "python", version=NEW)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    spec = plan(
        "all",
        task("a", gated(runs, gate, "a")),
        task("b", gated(runs, gate, "b")),
        task("quick", f"echo quick >> {runs}"),
        task("commit", f"echo c > c.txt; echo commit >> {runs}", needs=["quick"], commit=True),
        task("last", f"echo last >> {runs}", needs=["a", "b", "commit"]),
    )
    plan_id = tree.submit(spec)
    wait_until(lambda: lanes_running(tree, "a", "b"), 20, "the gated lanes running")
    supervisor_pid = tree.status().supervisor_pid
    result = tree.rollover("all", release, "--drain-timeout", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "re-executed in place" in result.stdout, result.stdout
    status = tree.status()
    assert status.supervisor_pid == supervisor_pid and status.version == NEW
    assert all(c.version == NEW and c.state == "running" for c in status.children), status
    gate.touch()
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok, report
    by_id = {t.id: t for t in report.tasks}
    ran = runs.read_text().split()
    for t in ("quick", "commit", "last"):
        assert ran.count(t) == 1 and by_id[t].attempts == 1, (t, ran, by_id[t])
    for t in ("a", "b"):  # stopped at the drain timeout: re-run once, flagged partial
        assert ran.count(t) == 2 and any("partial work" in w for w in by_id[t].warnings), by_id[t]
    assert git(repo, "log", "--format=%s").count("all/commit:") == 1


def test_the_supervisor_is_not_re_executed_onto_a_release_that_cannot_start(
    tree: Tree, tmp_path: Path
) -> None:
    """A release that answers its probe but cannot run `start`: once exec'd there would be no
    old image to roll back to, so the supervisor runs the release's start command first, and
    refuses; same pid, same version, every child untouched; exit 1."""
    release = make_release(tmp_path / "rel", "python", crash=True)
    before = tree.status()
    result = tree.rollover("supervisor", release)
    assert result.returncode == 1, result
    assert "its start exited 3" in result.stderr and "nothing moved" in result.stderr, result
    after = tree.status()
    assert (after.supervisor_pid, after.version, after.release) == (
        before.supervisor_pid,
        before.version,
        before.release,
    )
    assert [(c.pid, c.generation) for c in after.children] == [
        (c.pid, c.generation) for c in before.children
    ]


def test_a_restart_while_a_rollover_runs_is_refused_at_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The rollover holds the restart lock of what it moves for its whole run: `ctl restart`
    meanwhile is refused at once (busy, naming the rollover) instead of waiting out the drain
    and restarting afterwards what the operator may no longer want restarted."""
    tree = tree_factory(workspace=repo, shards=1)
    release = make_release(tmp_path / "rel", "python", version=NEW)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id = tree.submit(plan("busy", task("long", gated(runs, gate, "long"))))
    wait_until(lambda: lanes_running(tree, "long"), 20, "the lane running")
    first = tree.ctl(f.CtlRollover(name="shard-0", release=str(release), drain_timeout_s=60))
    assert isinstance(first, f.RolloverReport) and not first.done
    with pytest.raises(RemoteError) as refused:
        tree.ctl(f.CtlRestart(name="shard-0"), timeout_s=5)
    assert refused.value.code == "busy" and first.id in refused.value.message
    assert (tree.status().rollover or "").startswith(f"{first.id} of shard-0 for ")
    gate.touch()  # the lane ends: the drain finishes, and so does the rollover

    def done() -> bool:
        report = tree.ctl(f.CtlRolloverStatus(id=first.id, wait_s=1.0), timeout_s=5)
        return isinstance(report, f.RolloverReport) and report.done

    wait_until(done, 30, "the rollover to finish")
    assert tree.child("shard-0").operator_restarts == 0
    assert tree.wait_plan(plan_id, timeout_s=20).ok


def test_a_coordinator_whose_release_hangs_at_start_is_rolled_back(
    tree: Tree, tmp_path: Path
) -> None:
    """The new coordinator never says hello: after the handshake deadline it is killed, and
    only once its exit is handled does the old release start again; the rollover ends rolled
    back (exit 1) rather than wedged, and nothing of the hung start is left."""
    release = make_release(tmp_path / "rel", "python", hang=True)
    result = tree.rollover("coordinator", release)
    assert result.returncode == 1, result
    assert "no handshake" in result.stdout and "rolled back" in result.stderr, result
    coordinator = tree.child("coordinator")
    assert coordinator.state == "running" and coordinator.release == tree.status().release
    plan_id = tree.submit(plan("after", task("t", "true")))
    assert tree.wait_plan(plan_id, timeout_s=20).ok


def test_two_rollovers_asked_at_once_run_one(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Two `ctl rollover`s whose release probes overlap: both pass the first busy check while
    their probes run; the one whose probe ends second finds the first running (held in its
    drain by a lane) and is refused (busy), so only one rollover ever runs. The probes are
    gated, so the overlap is certain rather than a matter of timing."""
    import subprocess
    import sys

    tree = tree_factory(workspace=repo, shards=1)
    gates = tmp_path / "probes"
    release = make_release(tmp_path / "rel", "python", version=NEW, probe_gates=gates)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id = tree.submit(plan("busy", task("long", gated(runs, gate, "long"))))
    wait_until(lambda: lanes_running(tree, "long"), 20, "the lane running")
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    procs = [
        subprocess.Popen(
            [*argv, "rollover", "shard-0", "--release", str(release), "--drain-timeout", "60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        probes = [gates / "probe-0", gates / "probe-1"]
        wait_until(lambda: all(p.exists() for p in probes), 20, "both probes running")
        (gates / "go-0").touch()
        wait_until(lambda: bool(tree.status().rollover), 20, "the first rollover running")
        (gates / "go-1").touch()
        wait_until(lambda: any(p.poll() is not None for p in procs), 30, "one ctl refused")
        refused = next(p for p in procs if p.poll() is not None)
        _, err = refused.communicate(timeout=5)
        assert refused.returncode == 1 and "is still running" in err, (refused.returncode, err)
        gate.touch()  # the lane ends: the first rollover's drain finishes
        (ran,) = [p for p in procs if p is not refused]
        _, err = ran.communicate(timeout=60)
        assert ran.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [c.version for c in tree.status().children if c.name == "shard-0"] == [NEW]
    assert tree.wait_plan(plan_id, timeout_s=20).ok


def test_other_shards_restart_at_once_while_one_drains(tree: Tree, tmp_path: Path) -> None:
    """A shard's drain does not hold its siblings' restarts: shard-1, killed while shard-0
    drains a lane that takes its time, is back at once (its first restart is immediate)."""
    import os
    import signal

    release = make_release(tmp_path / "rel", "python", version=NEW)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    tree.submit(plan("drain", task("long", gated(runs, gate, "long"), requires=[])))
    wait_until(lambda: lanes_running(tree, "long"), 20, "the lane running")
    lane_shard = next(
        lane.shard
        for lane in tree.ctl(f.CtlLanes()).lanes  # type: ignore[attr-defined]
    )
    other = "shard-1" if lane_shard == "shard-0" else "shard-0"
    first = tree.ctl(f.CtlRollover(name=lane_shard, release=str(release), drain_timeout_s=60))
    assert isinstance(first, f.RolloverReport)
    wait_until(lambda: "draining" in (tree.status().rollover or ""), 10, "the drain to have begun")
    victim = tree.child(other)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    tree.wait_running(other, victim.generation + 1, timeout_s=5)
    assert not tree.ctl(f.CtlRolloverStatus(id=first.id)).done  # type: ignore[attr-defined]
    gate.touch()


def test_a_coordinator_away_while_a_drain_ends_asks_before_it_loses(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The coordinator is stopped (SIGSTOP) while a shard rolls over and its parked lane moves,
    then killed and restarted: its durable record still places the lane on the retired
    generation. Before losing it, the new coordinator asks the shard, finds the lane there, and
    the task finishes on its only attempt, each step once."""
    import os
    import signal

    steps = "tests.integration.lane_programs:Steps"
    cfg = tmp_path / "tree.toml"
    cfg.write_text(f'[lanes]\nprograms = ["{steps}"]\n')
    repo_root = Path(__file__).resolve().parents[2]
    tree = tree_factory(
        workspace=repo, shards=1, config=cfg, extra_env={"PYTHONPATH": str(repo_root)}
    )
    release = make_release(tmp_path / "rel", "python", version=NEW)
    runs = tmp_path / "runs"
    plan_id = tree.submit(plan("away", task("t", f"2 {runs}", program=steps)))
    wait_until(lambda: runs.exists() and runs.read_text().split() == ["t", "0"], 20, "step 0")
    coordinator = tree.child("coordinator")
    assert coordinator.pid is not None
    os.kill(coordinator.pid, signal.SIGSTOP)
    try:
        result = tree.rollover("shard-0", release)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "moved" in result.stdout, result.stdout
    finally:
        os.kill(coordinator.pid, signal.SIGKILL)
    tree.wait_running("coordinator", coordinator.generation + 1)
    lane = wait_until(lambda: tree.call("list_lanes")["lanes"], 20, "the moved lane listed")
    tree.call("message_lane", lane=lane[0]["lane"], text="go")  # type: ignore[index]
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    assert (report.tasks[0].attempts, report.tasks[0].warnings) == (1, []), report.tasks[0]
    assert runs.read_text().split() == ["t", "0", "t", "1"]
