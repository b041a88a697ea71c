"""`ctl rollover shard-K` with live lanes: they move to the next generation at quiet points.

One shard runs a plan of checkpointing program lanes (they move), a short shell lane that
finishes during the drain and a long one that hits the drain timeout and re-runs, flagged
partial. Every step appends a line to a file outside the tree, so a step that ran twice shows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, make_release, plan, task, wait_until
from tests.integration.test_logs import logs, rows_of

pytestmark = pytest.mark.integration

STEPS = "tests.integration.lane_programs:Steps"
REPO = Path(__file__).resolve().parents[2]
DRAIN_S = 3.0


def rollover(
    tree: Tree,
    name: str,
    release: Path,
    on_event: Callable[[f.RolloverEvent], None],
    drain_timeout_s: float = DRAIN_S,
) -> tuple[f.RolloverReport, list[f.RolloverEvent]]:
    """Start a rollover (lanes get `drain_timeout_s` seconds to reach a quiet point) and follow
    it to its end, calling `on_event` with each event as it comes; the final report and every
    event."""
    ask = f.CtlRollover(name=name, release=str(release), drain_timeout_s=drain_timeout_s)
    report = tree.ctl(ask, timeout_s=30)
    assert isinstance(report, f.RolloverReport), report
    events: list[f.RolloverEvent] = []
    while True:
        for event in report.events:
            on_event(event)
        events.extend(report.events)
        if report.done:
            return report, events
        after = events[-1].seq if events else -1
        report = tree.ctl(f.CtlRolloverStatus(id=report.id, after_seq=after, wait_s=0.5))
        assert isinstance(report, f.RolloverReport)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_shard_rollover_moves_live_lanes_and_the_plan_completes_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Program lanes move at a quiet point and go on from their checkpoint; a shell lane that
    ends during the drain finishes on the old generation; one still running at the drain
    timeout is stopped and re-run, flagged partial. The plan succeeds, no other step runs
    twice, lane ids stay, each transcript is one run of seqs, the coordinator is untouched."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text(f'[lanes]\nprograms = ["{STEPS}"]\n')
    tree = tree_factory(
        workspace=repo, shards=1, lanes=8, config=cfg, extra_env={"PYTHONPATH": str(REPO)}
    )
    runs = tmp_path / "runs"
    short_gate, long_gate = tmp_path / "short-gate", tmp_path / "long-gate"
    wait_for = "while [ ! -e {} ]; do sleep 0.02; done"
    spec = plan(
        "rolled",
        task("prog-a", f"3 {runs}", program=STEPS),
        task("prog-b", f"3 {runs}", program=STEPS),
        task("short", f"echo short >> {runs}; {wait_for.format(short_gate)}"),
        task("long", f"echo long >> {runs}; {wait_for.format(long_gate)}"),
    )
    coordinator = tree.child("coordinator")
    plan_id = tree.submit(spec)

    def lanes_running() -> dict[str, str] | None:
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        ids = {t.id: t.lane for t in report.tasks if t.status == "running" and t.lane}
        return ids if len(ids) == 4 else None

    lane_ids: dict[str, str] = wait_until(lanes_running, 30, "four running lanes")  # type: ignore[assignment]
    wait_until(lambda: len(lines(runs)) == 4, 20, "each lane's first step")
    for program in ("prog-a", "prog-b"):  # step 1 on the old generation: checkpoint 2, in recv
        tree.call("message_lane", lane=lane_ids[program], text="next", key=f"{program}-1")
    wait_until(lambda: len(lines(runs)) == 6, 20, "the programs' second step")

    during: list[f.LogChunk] = []

    def on_event(event: f.RolloverEvent) -> None:
        if event.text.startswith("draining generation 1"):
            # The new generation answers for the long lane, which the old one still runs: its
            # transcript is neither lost nor done.
            chunk = tree.ctl(f.CtlLogs(lane=lane_ids["long"]))
            assert isinstance(chunk, f.LogChunk)
            during.append(chunk)
            short_gate.touch()  # the short lane ends during the drain

    report, events = rollover(
        tree, "shard-0", make_release(tmp_path / "release-9", "python", version="9.0.0"), on_event
    )
    (chunk,) = during
    assert chunk.found and not chunk.done, chunk
    assert not any(r.data.startswith("lost") for r in chunk.rows), chunk
    texts = [e.text for e in events]
    assert report.ok, (report.error, texts)
    moves = {e.text.split()[1]: e.text.split()[2] for e in events if e.text.startswith("lane ")}
    took = sorted(e.took_s or 0.0 for e in events if e.text.startswith("lane "))
    print(f"per-lane drain times (s): {took}")
    assert moves == {
        lane_ids["prog-a"]: "moved",
        lane_ids["prog-b"]: "moved",
        lane_ids["short"]: "finished",
        lane_ids["long"]: "partial",
    }, texts

    long_gate.touch()  # the re-run of the long lane may end now
    for program in ("prog-a", "prog-b"):
        # The keys moved with the lane: a re-send of a message the old generation took is a
        # duplicate, and does not start the last step.
        again = tree.call("message_lane", lane=lane_ids[program], text="next", key=f"{program}-1")
        assert again["duplicate"], again
    assert len(lines(runs)) <= 8  # the long lane's re-run may have written; no program step
    for program in ("prog-a", "prog-b"):  # the last step runs on the new generation
        tree.call("message_lane", lane=lane_ids[program], text="next", key=f"{program}-2")
    final = tree.wait_plan(plan_id, timeout_s=30)
    assert final.ok, final
    by_id = {t.id: t for t in final.tasks}
    assert {t: by_id[t].lane for t in lane_ids} == lane_ids  # lane ids unchanged
    assert all(t.attempts == 1 for t in final.tasks), final
    assert sorted(lines(runs)) == sorted(
        [
            *("prog-a 0", "prog-a 1", "prog-a 2", "prog-b 0", "prog-b 1", "prog-b 2"),
            *("short", "long", "long"),  # only the interrupted step ran twice
        ]
    )
    assert any("partial work" in w and "rollover" in w for w in by_id["long"].warnings), by_id
    for t in ("prog-a", "prog-b", "short"):
        assert not by_id[t].warnings, by_id[t]

    for t, lane in lane_ids.items():  # one transcript per lane across both generations
        rows = rows_of(logs(tree, lane, "--json"))
        events_of = [r["data"] for r in rows if r["stream"] == "event"]
        if t == "short":
            assert not any("resumed" in e for e in events_of), events_of
        else:
            assert any("resumed from generation 1" in e for e in events_of), events_of
        assert events_of[-1].startswith("succeeded"), events_of
        assert not any(e.startswith("lost") for e in events_of), events_of

    shard = tree.child("shard-0")
    assert shard.generation == 2 and shard.version == "9.0.0"
    after = tree.child("coordinator")
    assert (after.pid, after.generation) == (coordinator.pid, coordinator.generation)
    assert os.path.isdir(tree.state_dir / "shard-0")
