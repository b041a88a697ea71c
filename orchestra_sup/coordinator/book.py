"""The coordinator's plans in memory, and the one path a change to a plan takes (`commit`).

Every change to a plan, whatever made it (a lane's result, a lost shard, a placement, an answer,
a cancel), is committed here and nowhere else, so no caller can forget a step: the lanes a
sibling-group retry took over are cancelled, what changed is written behind
(`coordinator.planstore`), what can no longer run is skipped and a plan that is done is written
durably and its waiters woken, and, when a task left the live statuses (a lane ended or was lost,
a task became ready, waits for a human or ended), the coordinator places what is ready (`pump`).
Several changes in a `batch` place once, at its end.

Big plans (issue 24): a skip cascade longer than `SKIP_BATCH` tasks goes on in slices
(`coordinator.slices`), and nothing of its plan is placed until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from orchestra_sup.coordinator.planstore import PlanStore
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.coordinator.slices import Slicer
from orchestra_sup.errors import OrchestraError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.node import Node

log = logging.getLogger(__name__)

SKIP_BATCH = 64
"""Tasks skipped between two looks at the clock (`Slicer`)."""
FREEZE_TASKS = 1000
"""A plan of at least this many tasks is frozen out of the cyclic garbage collector's view once
it is accepted and again once it is done (`gc.freeze`, with whatever else is alive then): plans
are kept for ever, and a full collection walks every object it tracks, about 70 ms for 33,000
tasks here. (Frozen objects are still freed when their last reference goes; only a reference
cycle among them would stay.)"""
CANCEL_TIMEOUT_S = 10.0
"""How long a `LaneCancel` to a shard waits for its answer."""


class PlanBook:
    """The plans (`plans`: every plan by id; `active`: those not done, in the order they were
    accepted, loaded ones first), and `commit` (see the module docstring). `pump()` places what
    is ready."""

    def __init__(self, node: Node, planstore: PlanStore, *, pump: Callable[[], None]) -> None:
        self.node = node
        self.planstore = planstore
        self._pump = pump
        self.plans: dict[str, PlanRecord] = {}
        self.active: dict[str, PlanRecord] = {}
        """The plans not done, in the order they were accepted (loaded ones first, oldest
        first): all that a pump or a lost shard reads."""
        self.keys: dict[str, str] = {}
        """Idempotency key -> the id of the plan submitted with it."""
        self.settling: set[str] = set()
        """Plans whose skip cascade goes on in slices (`_settle`): nothing of them is placed
        until it ends."""
        self.final: set[str] = set()
        """Plans whose final record is written (or being written) durably."""
        self.waiters: dict[str, list[asyncio.Future[None]]] = {}
        """Plan id -> the futures of the `ctl plan --wait` calls waiting for it to end."""
        self.accepting: dict[str, asyncio.Future[None]] = {}
        """Plan id -> the commit of its record, for plans accepted and not yet durable
        (`Coordinator._submit`): no submitter hears of them before it."""
        self.on_done: Callable[[PlanRecord], None] = lambda plan: None
        """Told of each plan that ends, once its final record is queued (`coordinator.seat`:
        a lane a session started ended)."""
        self._depth = 0
        self._due = False

    def add(self, plan: PlanRecord) -> None:
        """Keep `plan`, accepted or loaded, as one not done."""
        self.plans[plan.id] = plan
        self.active[plan.id] = plan
        if plan.key is not None:
            self.keys[plan.key] = plan.id

    def commit(self, plan: PlanRecord, cancel: Iterable[tuple[str, str]] = ()) -> None:
        """`plan` changed: cancel `cancel` (lanes a sibling-group retry took over: (shard, lane
        id)), write what changed behind, skip and finish what follows, and place what is ready
        if a task left the live statuses (at the end of the `batch`, if in one). A plan pruned
        meanwhile (`kept`) is left as it is: nothing of it is written or placed again."""
        if not self.kept(plan):
            return
        for shard, lane in cancel:
            self.node.spawn(self._cancel_lane(shard, lane))
        if plan.dirty:
            self.planstore.write(plan)
        self.complete(plan)
        if plan.moved:
            plan.moved.clear()
            self.schedule()

    def schedule(self) -> None:
        """Place what is ready: now, or at the end of the `batch` under way."""
        if self._depth:
            self._due = True
        else:
            self._pump()

    @contextlib.contextmanager
    def batch(self, *, pump: bool = True) -> Iterator[None]:
        """Commit several changes, placing once at the end (`pump` False: not at all, for the
        pump's own changes and for an inbox applied again on start). Nothing is placed when
        the body raises."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth:
            due, self._due = self._due, False
            if due and pump:
                self._pump()

    def complete(self, plan: PlanRecord) -> None:
        """Skip what can no longer run (for one slice; a longer cascade goes on in `_settle`);
        once the plan is done, write its final record durably (seeds/003: a failure that
        reaches the root "terminates the session with a durable final snapshot"), then wake
        whoever waits for it (`ctl plan --wait`)."""
        if plan.id in self.settling:
            return
        if plan.blocking:
            slicer = Slicer()
            while plan.skip_blocked(SKIP_BATCH):
                self.planstore.write(plan)
                if slicer.spent:
                    break
            if plan.blocking:
                self.settling.add(plan.id)
                self.node.spawn(self._settle(plan, slicer))
                return
        if plan.done and plan.id not in self.final:
            if plan.finished_at is None:
                plan.finished_at = time.time()
            self.final.add(plan.id)
            self.planstore.events.emit(
                "plan.finished", plan=plan.id, detail="succeeded" if plan.ok else "failed"
            )
            self.active.pop(plan.id, None)
            self.node.retitle()
            self.node.spawn(self._finish(plan))
            self.on_done(plan)

    async def _settle(self, plan: PlanRecord, slicer: Slicer) -> None:
        """Go on skipping what can no longer run in `plan`, a slice at a time, then commit it
        (nothing of the plan is placed meanwhile: a grant is carved from a plan whose skips are
        all counted)."""
        try:
            while plan.blocking:
                await slicer.tick()
                if plan.skip_blocked(SKIP_BATCH):
                    self.planstore.write(plan)
        finally:
            self.settling.discard(plan.id)
        with self.batch():
            self.commit(plan)
            self.schedule()

    def kept(self, plan: PlanRecord) -> bool:
        """Whether `plan` is still kept (not pruned, `coordinator.retention`): a pruned plan's
        records are deleted, and writing them again would leave a head with no spec."""
        return self.plans.get(plan.id) is plan

    async def _finish(self, plan: PlanRecord) -> None:
        try:
            if self.kept(plan):  # pruned at once (plans_s = 0): nothing to write
                await self.planstore.write_durable(plan)
        finally:
            for waiter in self.waiters.pop(plan.id, []):
                if not waiter.done():
                    waiter.set_result(None)
        if len(plan.tasks) >= FREEZE_TASKS:
            gc.freeze()

    async def _cancel_lane(self, shard: str, lane: str) -> None:
        with contextlib.suppress(OrchestraError):
            await self.node.call(shard, f.LaneCancel(lane=lane), timeout_s=CANCEL_TIMEOUT_S)
