"""The coordinator records a human's answer before it acts on it (ARCHITECTURE.md §11 invariant 9:
"the answer is recorded before it resumes the lane").

A unit test of the ordering inside `Answers.respond` (coordinator/answers.py), with a real LMDB
store: the moment the coordinator hands the answer to its messaging layer (to send it to the
waiting lane), the answer must already be committed. The messaging layer is the one part stood in
for: `Recorder` keeps what the coordinator asks it to send and checks the store at that moment.
Real trees answer pauses in `tests/integration/test_hitl.py`.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec
import pytest

from orchestra_sup.coordinator.placement import AffinityTicket, ShardView
from orchestra_sup.coordinator.planstore import DBS, TASKS, PlanStore, task_key
from orchestra_sup.coordinator.role import Coordinator
from orchestra_sup.coordinator.runner import AnswerError, PlanRecord, TaskRecord, TaskStatus
from orchestra_sup.paths import resolve_paths
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.state.store import Store


class Recorder:
    """The coordinator's node, as far as `Answers.respond` uses it: `args`, `peers`, and `spawn`,
    which here runs nothing and notes, for each coroutine the coordinator starts, whether the
    plan's answer was already committed to LMDB at that moment."""

    def __init__(self, store: Store, plan_id: str) -> None:
        self.args = ChildArgs(
            role="coordinator",
            name="coordinator",
            generation=1,
            run_dir="/nonexistent",
            state_dir="/nonexistent",
            workspace=None,
            lanes_per_shard=8,
            supervisor_pid=1,
        )
        self.peers = {"shard-0": object()}
        self.spawned: list[tuple[str, bool]] = []
        self._store = store
        self._plan_id = plan_id

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        # an `Opener` has no store until `open` made one (it spawns retention's loop then)
        store = self._store
        raw = store.get(TASKS, task_key(self._plan_id, "ask")) if store is not None else None
        committed = raw is not None and bool(msgspec.msgpack.decode(raw, type=TaskRecord).answers)
        self.spawned.append((coro.__qualname__, committed))
        coro.close()


def test_an_answer_is_committed_before_it_is_sent_to_the_lane(tmp_path: Path) -> None:
    async def main() -> list[tuple[str, bool]]:
        store = Store(tmp_path / "coordinator", ["inbox", *DBS])
        store.start()
        try:
            spec = f.PlanSpec(name="p", tasks=[f.TaskSpec(id="ask", run="", program="m:P")])
            plan = PlanRecord.new("p1", spec, submitted_at=0.0)
            start = plan.place(
                spec.tasks[0], AffinityTicket(shard="shard-0", generation=1, boot="")
            )
            plan.set_status("ask", TaskStatus.RUNNING)
            plan.pause_for_question(
                f.HitlPause(
                    lane=start.lane,
                    plan="p1",
                    task="ask",
                    shard="shard-0",
                    key="q1",
                    question="ship it?",
                    asked_at=0.0,
                )
            )
            coordinator = Coordinator()
            node = Recorder(store, plan.id)
            coordinator.attach(node, store)  # type: ignore[arg-type]
            coordinator.book.add(plan)
            coordinator.shards["shard-0"] = ShardView(
                name="shard-0", generation=1, up=True, capacity=8
            )
            await PlanStore(store).write_durable(plan, new=True)
            assert coordinator.answers is not None
            recorded = await coordinator.answers.respond(
                f.HitlRespond(lane=start.lane, verdict="approve", uid=0, responder="root")
            )
            assert isinstance(recorded, f.HitlRecorded)
            assert recorded.outcome == f"approve sent to lane {start.lane}"
            return node.spawned
        finally:
            store.close()

    spawned = asyncio.run(main())
    sends = [committed for name, committed in spawned if name == "Answers._send"]
    assert sends == [True], spawned


class Opener(Recorder):
    """What `Coordinator.open` also uses of its node: where its state lives."""

    def __init__(self, store: Store | None, plan_id: str, state_dir: Path) -> None:
        super().__init__(store, plan_id)  # type: ignore[arg-type]
        self.paths = msgspec.structs.replace(
            resolve_paths(state_dir, state_dir / "run", None), state_dir=state_dir
        )


def test_an_answer_acted_on_but_not_sent_is_sent_by_the_next_generation(tmp_path: Path) -> None:
    """A coordinator held at a rollover's quiet point (or killed) records and acts on an answer
    but sends nothing: the next generation, opening the record, sends it to the lane that asked
    (the lane keeps the first answer to a key, so a second send is harmless)."""

    async def first() -> str:
        store = Store(tmp_path / "coordinator", ["inbox", *DBS])
        store.start()
        try:
            spec = f.PlanSpec(name="p", tasks=[f.TaskSpec(id="ask", run="", program="m:P")])
            plan = PlanRecord.new("p1", spec, submitted_at=0.0)
            start = plan.place(
                spec.tasks[0], AffinityTicket(shard="shard-0", generation=1, boot="")
            )
            plan.set_status("ask", TaskStatus.RUNNING)
            pause = f.HitlPause(
                lane=start.lane,
                plan="p1",
                task="ask",
                shard="shard-0",
                key="go",
                question="go?",
                asked_at=0.0,
            )
            assert plan.pause_for_question(pause)
            plan.record_answer("ask", f.Answer(verdict="approve", responder="root", uid=0))
            assert plan.act_on_answer("ask", 0.0).answer is not None  # ... and never sent
            # in the layout before issue 24 (one whole record per plan): the next generation
            # moves it to the new one as it opens it
            await store.put_durable("plans", b"p1", msgspec.msgpack.encode(plan))
            return start.lane
        finally:
            store.close()

    async def second() -> list[tuple[str, bool]]:
        coordinator = Coordinator()
        node = Opener(None, "p1", tmp_path)  # type: ignore[arg-type]
        await coordinator.open(node)  # type: ignore[arg-type]
        node._store = coordinator.store  # type: ignore[assignment]
        try:
            coordinator.shards["shard-0"] = ShardView(
                name="shard-0", generation=1, up=True, capacity=8
            )
            coordinator._pump()
            return node.spawned
        finally:
            await coordinator.close()

    lane = asyncio.run(first())
    try:
        spawned = asyncio.run(second())
    finally:
        gc.unfreeze()  # open() froze what it loaded, this test process's objects with it
    assert [name for name, _ in spawned if name == "Answers._send"] == ["Answers._send"], (
        lane,
        spawned,
    )


def paused(kind: str) -> PlanRecord:
    """A one-task plan whose task `t` waits on a pause of `kind`: "approval", "review" (a
    failed attempt with a retry left), "review-spent" (with none), "question"."""
    task = {
        "approval": f.TaskSpec(id="t", run="x", approve=True),
        "review": f.TaskSpec(id="t", run="x", on_failure="pause", retries=1),
        "review-spent": f.TaskSpec(id="t", run="x", on_failure="pause"),
        "question": f.TaskSpec(id="t", run="", program="m:P"),
    }[kind]
    plan = PlanRecord.new("p1", f.PlanSpec(name="p", tasks=[task]), submitted_at=0.0)
    if kind == "approval":
        assert plan.hold_for_approval(0.0) == ["t"]
        return plan
    start = plan.place(task, AffinityTicket(shard="shard-0", generation=1, boot=""))
    plan.tasks["t"].status = TaskStatus.RUNNING
    if kind == "question":
        pause = f.HitlPause(
            lane=start.lane, plan="p1", task="t", shard="shard-0", key="q", question="?",
            asked_at=0.0,
        )  # fmt: skip
        assert plan.pause_for_question(pause)
    else:
        plan.fail("t", f.FailureClass.TOOL_FAILURE, "exited with status 3", 0.0)
    assert plan.tasks["t"].pending is not None
    return plan


@pytest.mark.parametrize("kind", ["approval", "review", "review-spent", "question"])
def test_the_answers_a_pause_is_said_to_take_are_the_ones_it_takes(kind: str) -> None:
    """`answers_taken` (what `ctl lanes` offers) agrees with `record_answer` (what the pause
    then takes) for every verdict: offered ones are taken, the others refused; an approval said
    to need retries is refused bare and taken with `--retries 1`."""
    accepts, needs_retries = paused(kind).answers_taken("t")
    for verdict in ("approve", "reject", "redirect", "accept_partial"):
        answer = f.Answer(verdict=verdict, text="why" if verdict in ("reject", "redirect") else "")
        offered = verdict in accepts and not (verdict == "approve" and needs_retries)
        try:
            paused(kind).record_answer("t", answer)
        except AnswerError:
            assert not offered, (kind, verdict)
        else:
            assert offered, (kind, verdict)
    if needs_retries:
        paused(kind).record_answer("t", f.Answer(verdict="approve", retries=1))
    assert (kind, needs_retries) != ("review-spent", False)
