"""Requests and refusals for a lane in transit between two generations of its shard (ADR 0009).

Each test runs one `Gated` lane: it appends "<task> start" to a file outside the tree and waits in
a command (no quiet point) for a gate file, so a drain of its shard cannot move it until the test
opens the gate. Meanwhile the roster already points at the new generation, which does not have
the lane yet: that is the window a lane is in transit. The relay's deadline is 1 s, so a request
the new generation holds for the lane comes back to the caller as a timeout, which proves it was
held, before the test lets the lane move.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import RawPeer, Tree, make_release, plan, task, wait_until
from tests.integration.test_logs import logs, rows_of
from tests.integration.test_rollover_shard import REPO, lines, rollover

pytestmark = pytest.mark.integration

GATED = "tests.integration.lane_programs:Gated"
RAISES = "tests.integration.lane_programs:Raises"
DRAIN_S = 30.0
"""Longer than any test needs to open its lane's gate: no lane here is stopped at the timeout."""


def gated_tree(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, shards: int, lanes: int
) -> Tree:
    cfg = tmp_path / "tree.toml"
    cfg.write_text(f'[lanes]\nprograms = ["{GATED}", "{RAISES}"]\n\n[relay]\ndeadline_s = 1.0\n')
    return tree_factory(
        workspace=repo,
        shards=shards,
        lanes=lanes,
        config=cfg,
        extra_env={"PYTHONPATH": str(REPO)},
    )


def start_gated(tree: Tree, name: str, runs: Path, gate: Path) -> tuple[str, str]:
    """Submit plan `name`: one gated program task `t`; wait until its lane has started; returns
    (plan id, lane id)."""
    plan_id = tree.submit(plan(name, task("t", f"{runs} {gate}", program=GATED)))
    lane = running_lane(tree, plan_id, "t")
    wait_until(lambda: lines(runs) == ["t start"], 20, "the lane to start")
    return plan_id, lane


def roll_shard_0(
    tree: Tree, tmp_path: Path, on_event: Callable[[f.RolloverEvent], None]
) -> tuple[f.RolloverReport, list[f.RolloverEvent]]:
    """Roll shard-0 onto a second release, calling `on_event` with each event as it comes."""
    release = make_release(tmp_path / "rel", "python", version="9.0.0")
    return rollover(tree, "shard-0", release, on_event, drain_timeout_s=DRAIN_S)


def running_lane(tree: Tree, plan_id: str, task_id: str, other_than: str = "") -> str:
    """The lane of `task_id` once it runs (and is not `other_than`)."""

    def lane() -> str | None:
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        rec = next(t for t in report.tasks if t.id == task_id)
        ok = rec.status == "running" and rec.lane and rec.lane != other_than
        return rec.lane if ok else None

    return wait_until(lane, 30, f"{task_id} running")  # type: ignore[return-value]


def events_of(tree: Tree, lane: str) -> list[str]:
    """The event rows of `lane`'s transcript, across generations."""
    return [r["data"] for r in rows_of(logs(tree, lane, "--json")) if r["stream"] == "event"]


def moves_of(events: list[f.RolloverEvent]) -> dict[str, str]:
    """Lane id -> how the drain dealt with it ("moved", "lost", ...)."""
    return {
        e.text.split()[1]: e.text.split()[2].rstrip(":")
        for e in events
        if e.text.startswith("lane ")
    }


def held_in_transit(tree: Tree, request: f.Body) -> RemoteError:
    """Send `request` through the ctl socket and the coordinator's relay; its error, which
    must be the relay's timeout: the new generation holds it for a lane that is not there."""
    with pytest.raises(RemoteError) as caught:
        tree.ctl(request, timeout_s=30)
    assert caught.value.code == ErrorCode.TIMEOUT, caught.value
    return caught.value


def test_a_message_sent_while_its_lane_moves_reaches_the_resumed_program_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A `message_lane` to a lane in transit is held by the new generation and delivered once,
    to the resumed program, when the lane arrives; a re-send with its key is a duplicate."""
    tree = gated_tree(tree_factory, repo, tmp_path, shards=1, lanes=4)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id, lane = start_gated(tree, "transit", runs, gate)
    held: list[RemoteError] = []

    def on_event(event: f.RolloverEvent) -> None:
        if event.text.startswith("draining generation 1"):
            message = f.CtlCall(
                tool="message_lane", params={"lane": lane, "text": "hello", "key": "k1"}
            )
            held.append(held_in_transit(tree, message))
            gate.touch()  # the lane reaches its checkpoint and moves

    report, events = roll_shard_0(tree, tmp_path, on_event)
    assert held, [e.text for e in events]
    assert report.ok, (report.error, [e.text for e in events])
    assert moves_of(events) == {lane: "moved"}, [e.text for e in events]
    wait_until(lambda: lines(runs) == ["t start", "t got hello"], 20, "the held message")
    again = tree.call("message_lane", lane=lane, text="hello", key="k1")
    assert again["duplicate"] and not again["delivered"], again
    tree.call("message_lane", lane=lane, text="done", key="k2")
    final = tree.wait_plan(plan_id, timeout_s=30)
    assert final.ok, final
    (t,) = final.tasks
    assert (t.lane, t.attempts, t.warnings) == (lane, 1, []), t
    assert lines(runs) == ["t start", "t got hello"]
    rows = events_of(tree, lane)
    assert [r for r in rows if r.startswith("message (k1)")] == ["message (k1): hello"], rows
    assert any(r.startswith("resumed from generation 1") for r in rows), rows


def test_a_cancel_sent_while_its_lane_moves_cancels_it_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A cancel for a lane in transit is held by the new generation and cancels the lane once
    it arrives: the task ends cancelled on its only attempt, its program never goes on."""
    tree = gated_tree(tree_factory, repo, tmp_path, shards=1, lanes=4)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id, lane = start_gated(tree, "transit", runs, gate)
    held: list[RemoteError] = []

    def on_event(event: f.RolloverEvent) -> None:
        if event.text.startswith("draining generation 1"):
            held.append(held_in_transit(tree, f.CtlCancel(lane=lane)))
            gate.touch()

    report, events = roll_shard_0(tree, tmp_path, on_event)
    assert held, [e.text for e in events]
    assert report.ok, (report.error, [e.text for e in events])
    assert moves_of(events) == {lane: "moved"}, [e.text for e in events]
    final = tree.wait_plan(plan_id, timeout_s=30)
    (t,) = final.tasks
    assert (t.status, t.lane, t.attempts) == ("cancelled", lane, 1), t
    with pytest.raises(RemoteError) as again:  # cancelled once: there is no lane left to cancel
        tree.ctl(f.CtlCancel(lane=lane), timeout_s=30)
    assert again.value.code == ErrorCode.NOT_FOUND, again.value
    rows = events_of(tree, lane)
    ends = [r for r in rows if r.startswith(("cancelled", "succeeded", "failed", "lost"))]
    assert ends == ["cancelled: cancelled by request"], rows
    assert lines(runs) == ["t start"]


def test_a_hand_over_the_full_successor_refuses_ends_interrupted_and_re_runs_warned(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A lane the next generation refuses (it is full) ends `interrupted` on the old one, which
    says so in its transcript; the rollover reports it lost, and its task runs again on a new
    lane with a partial-work warning: the only second run, and never an unwarned one."""
    tree = gated_tree(tree_factory, repo, tmp_path, shards=2, lanes=1)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id, lane = start_gated(tree, "refused", runs, gate)
    filled: list[f.Body] = []

    def on_event(event: f.RolloverEvent) -> None:
        if not event.text.startswith("draining generation 1"):
            return
        # The coordinator counts a moving lane against the new generation's capacity, so it
        # places nothing there that would leave no room for it. The room is taken instead by a
        # client the coordinator does not know, speaking the shard protocol itself.
        new = tree.child("shard-0")
        assert new.generation == 2, new
        filler = f.LaneStart(
            lane="filler-1",
            plan="elsewhere",
            task=f.TaskSpec(id="filler", run="", program=RAISES),
        )
        with RawPeer(Path(new.endpoint.removeprefix("ipc://")), sender="test") as peer:
            filled.append(peer.ask(filler))
        gate.touch()

    report, events = roll_shard_0(tree, tmp_path, on_event)
    assert filled == [f.Ack()], filled
    texts = [e.text for e in events]
    assert moves_of(events) == {lane: "lost"}, texts
    assert any(f"lane {lane} lost: refused by the next generation" in t for t in texts), texts
    assert not report.ok and report.error and lane in report.error, (report.error, texts)

    again = running_lane(tree, plan_id, "t", other_than=lane)  # re-placed: shard-0 is full
    wait_until(lambda: lines(runs) == ["t start", "t start"], 20, "the re-run")
    tree.call("message_lane", lane=again, text="done", key="done")
    final = tree.wait_plan(plan_id, timeout_s=30)
    assert final.ok, final
    (t,) = final.tasks
    assert (t.lane, t.attempts) == (again, 2), t
    assert any("partial work" in w and lane in w for w in t.warnings), t
    ends = events_of(tree, lane)
    assert ends[-1].startswith("interrupted: it was refused by the next generation"), ends
    assert not any(r.startswith("lost") for r in ends), ends
