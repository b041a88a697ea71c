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
from tests.integration.harness import Tree, make_release, plan, task, wait_until
from tests.integration.test_logs import logs, rows_of
from tests.integration.test_rollover_shard import REPO, lines, rollover

pytestmark = pytest.mark.integration

GATED = "tests.integration.lane_programs:Gated"
DRAIN_S = 30.0
"""Longer than any test needs to open its lane's gate: no lane here is stopped at the timeout."""


def gated_tree(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, shards: int, lanes: int
) -> Tree:
    cfg = tmp_path / "tree.toml"
    cfg.write_text(f'[lanes]\nprograms = ["{GATED}"]\n\n[relay]\ndeadline_s = 1.0\n')
    return tree_factory(
        workspace=repo,
        shards=shards,
        lanes=lanes,
        config=cfg,
        extra_env={"PYTHONPATH": str(REPO)},
    )


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


def held_for_transit(call: Callable[[], object]) -> RemoteError:
    """`call`'s error when the new generation holds its request: no answer within the relay's
    deadline."""
    with pytest.raises(RemoteError) as caught:
        call()
    assert caught.value.code == ErrorCode.TIMEOUT, caught.value
    return caught.value


def test_a_cancel_sent_while_its_lane_moves_cancels_it_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A cancel for a lane in transit is held by the new generation and cancels the lane once
    it arrives: the task ends cancelled on its only attempt, its program never goes on."""
    tree = gated_tree(tree_factory, repo, tmp_path, shards=1, lanes=4)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    plan_id = tree.submit(plan("transit", task("t", f"{runs} {gate}", program=GATED)))
    lane = running_lane(tree, plan_id, "t")
    wait_until(lambda: lines(runs) == ["t start"], 20, "the lane to start")
    held: list[RemoteError] = []

    def on_event(event: f.RolloverEvent) -> None:
        if event.text.startswith("draining generation 1"):
            held.append(held_for_transit(lambda: tree.ctl(f.CtlCancel(lane=lane), timeout_s=30)))
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
