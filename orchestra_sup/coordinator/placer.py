"""The placement of lanes: which ready task starts on which shard, and its `LaneStart`.

A pump (`Placer.pump`) takes every plan not done in the order it was accepted and each ready
task in file order, and places it (`coordinator.placement`: affinity, eligibility, score,
tie-break) until no shard has room; first the tenant's quota and then the budget are checked (a
breach, or a budget with nothing left, is a failure for the task's strategy). A placement is
durable before its `LaneStart` is sent, so a coordinator killed after sending it never starts the
task a second time; one an earlier generation recorded and did not see answered is sent again
(the lane id is the shard's idempotency key). A task backing off before a retry waits on the
monotonic clock (`coordinator.backoff`), and the pump runs again when the earliest backoff ends.

Every change it makes to a plan is committed through `PlanBook.commit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.answers import Answers
from orchestra_sup.coordinator.backoff import Backoffs
from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.fencing import LaneFences
from orchestra_sup.coordinator.placement import (
    AffinityTicket,
    Need,
    need_of,
    place,
    serves,
    tenant_of,
    unplaceable,
)
from orchestra_sup.coordinator.quota import breach
from orchestra_sup.coordinator.roster import Roster
from orchestra_sup.coordinator.runner import LIVE, PlanRecord, TaskStatus
from orchestra_sup.errors import CallTimeout, ErrorCode, OrchestraError, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass
from orchestra_sup.runtime.node import Node
from orchestra_sup.runtime.remote import HOST_SEPARATOR, host_of

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
"""How long a `LaneStart` waits for its shard's answer."""
RECOVERY_EVERY_S = 15.0
"""The least time between two requests to recover one shard (`_ask_recovery`)."""
DEGRADED_PAUSE_S = 1.0
"""How long a placement a shard refused for its full disk waits before it is taken back."""


class Placer:
    """See the module docstring. `roster` keeps the coordinator's view of its shards (`shards`,
    and `moving`: the generations of each shard whose lanes move to its current one) and says
    whether the tree stops (`stopping()`); `held()` says a rollover holds the coordinator at a
    quiet point. While either holds, nothing is placed."""

    def __init__(
        self,
        node: Node,
        book: PlanBook,
        answers: Answers,
        roster: Roster,
        *,
        held: Callable[[], bool],
    ) -> None:
        self.node = node
        self.book = book
        self.answers = answers
        self.roster = roster
        self._held = held
        self.backoffs = Backoffs()
        self.lanes: dict[str, tuple[str, str]] = {}
        """Lane id -> (plan id, task id) of every lane placed since start (pruned on lookup)."""
        self.starting: dict[str, asyncio.Future[None]] = {}
        """Lanes whose `LaneStart` is in flight; resolved when their shard answers (or not)."""
        self._recovery_asked: dict[str, float] = {}
        self._wake: asyncio.TimerHandle | None = None
        """The timer that pumps again when the earliest retry backoff ends."""
        self.fences = LaneFences(node.args.fences) if node.args.fences.etcd else None
        """The lanes' fences, in a tree hosts join (`coordinator.fencing`)."""

    def track(self, plan: PlanRecord) -> None:
        """Know the lanes of `plan`'s live tasks (a plan loaded at start)."""
        for task_id in plan.live_ids():
            lane = plan.tasks[task_id].lane
            if lane is not None:
                self.lanes[lane] = (plan.id, task_id)

    def forget(self, plan: PlanRecord) -> None:
        """`plan` was pruned (`coordinator.retention`): its lanes leave the lane index."""
        for rec in plan.tasks.values():
            for lane in {rec.lane, *(a.lane for a in rec.history)}:
                if lane is not None and self.lanes.get(lane, ("",))[0] == plan.id:
                    del self.lanes[lane]

    async def lane_shard(self, lane: str) -> str | None:
        """The shard running live lane `lane` once that shard has taken it (a lane whose
        `LaneStart` is still in flight is waited for, so a tool never reaches a shard before the
        lane does), or None. O(1): lane tools are the relay's hot path, and a tree may hold
        thousands of plans (one per `start_lane`)."""
        starting = self.starting.get(lane)
        if starting is not None:
            await asyncio.shield(starting)
        where = self.lanes.get(lane)
        if where is None:
            return None
        rec = self.book.plans[where[0]].tasks[where[1]]
        if rec.lane != lane or rec.status not in LIVE:
            del self.lanes[lane]  # that lane has ended: forget it
            return None
        return rec.shard

    def open(self) -> None:
        """Start sweeping the fences of lanes that ended (a tree hosts join)."""
        if self.fences is not None:
            self.node.spawn(self.fences.run(self.live))

    async def close(self) -> None:
        if self.fences is not None:
            await self.fences.close()

    def ended(self, put: f.InboxPut) -> None:
        """`put` is committed: a host's lane's result ends its fence (`LaneFences.release`)."""
        result = put.result
        if self.fences is not None and result is not None and HOST_SEPARATOR in result.shard:
            self.fences.release(result.lane, host_of(result.shard))

    def live(self, lane: str, host: str) -> bool:
        """Whether `lane` is its task's current lane, starting or running on a shard of `host`
        (the fences' sweep keeps its key there)."""
        where = self.lanes.get(lane)
        if where is None or where[0] not in self.book.plans:
            return False
        rec = self.book.plans[where[0]].tasks[where[1]]
        on_host = rec.shard is not None and host_of(rec.shard) == host
        return rec.lane == lane and rec.status in LIVE and on_host

    # --- the pump --------------------------------------------------------------------------------

    def pump(self) -> None:
        """Start every ready task that has a place to go, plans in the order they were accepted,
        each in file order, until no shard has room (nothing once the tree is stopping: what is
        not running then waits for the next start). What it changes is committed as it goes,
        and places nothing more (`PlanBook.batch`)."""
        if self.roster.stopping() or self._held():
            return
        with self.book.batch(pump=False):
            self._pump()

    def _pump(self) -> None:
        self.answers.send()
        self._loads()
        now = time.time()  # stored (a placement's time, a pause's); intervals are monotonic
        clock = self.backoffs.now()  # one reading for every backoff question of this pump
        waits: set[Need] = set()  # needs no shard can take now: their tasks wait
        for plan in list(self.book.active.values()):
            self._resend_starts(plan)
            self.book.complete(plan)
            if plan.id in self.book.settling or plan.done:
                continue
            if plan.hold_for_approval(now):
                self.book.commit(plan)
            for spec in plan.iter_ready():
                retry_at = plan.tasks[spec.id].retry_at
                if retry_at is not None and self.backoffs.holds(plan.id, spec.id, retry_at, clock):
                    continue
                need = need_of(plan.spec, spec)
                if not any(view.open for view in self.roster.shards.values()):
                    # Every shard is full or down: what is ready waits for the next pump, and
                    # a down one that could take it is asked back from its restart backoff.
                    self._ask_recovery(need)
                    break
                if need not in waits and not self._place(plan, spec, need, now):
                    waits.add(need)
        self._wake_in(self.backoffs.wake_in(self.book.active.values(), clock))

    def _wake_in(self, delay: float | None) -> None:
        """Pump again in `delay` seconds (the earliest retry backoff's end), or never."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if delay is not None:
            self._wake = asyncio.get_running_loop().call_later(delay, self.pump)

    def _loads(self) -> None:
        for view in self.roster.shards.values():
            view.load = 0
        for plan in self.book.active.values():
            for task_id in plan.live_ids():
                rec = plan.tasks[task_id]
                view = self.roster.shards.get(rec.shard or "")
                if view is not None:
                    here = rec.shard_gen == view.generation
                    view.load += here or rec.shard_gen in self.roster.moving.get(view.name, ())
        for view in self.roster.shards.values():
            if view.refused:
                view.load = max(view.load, view.capacity)  # it said it is full: believe it

    def _ask_recovery(self, need: Need) -> None:
        """A lane with `need` is waiting and a shard that could take it is down: ask the
        supervisor to end that shard's restart backoff, at most once per `RECOVERY_EVERY_S` per
        shard (seeds/000: "at most every 15 seconds per host"). Nothing waits for the answer."""
        now = time.monotonic()
        for view in self.roster.shards.values():
            last = self._recovery_asked.get(view.name)
            if view.up or not serves(view, need):
                continue
            if last is not None and now - last < RECOVERY_EVERY_S:
                continue
            self._recovery_asked[view.name] = now
            log.info("a lane waits and %s is down: asking the supervisor to recover it", view.name)
            self.node.spawn(self._recover(view.name))

    async def _recover(self, name: str) -> None:
        with contextlib.suppress(OrchestraError):
            await self.node.control.request(f.RecoverChild(name=name), timeout_s=2.0)

    # --- placing one task ------------------------------------------------------------------------

    def _place(self, plan: PlanRecord, spec: f.TaskSpec, need: Need, now: float) -> bool:
        """Place one ready task (placement.py: affinity, eligibility, score, tie-break), fail it
        when no shard of this tree could ever take it, or leave it waiting (False: no shard can
        take a lane with `need` now). In a tree hosts join (`fences`), a need no shard in the
        roster meets waits instead: hosts come and go (a host's agent restarting leaves the
        roster until it reports again), and the task was accepted when one met it. First the
        tenant's quota and then the budget are checked: a breach, or a budget with nothing left
        to carve a lane from, starts nothing and is a failure for the task's strategy."""
        rec = plan.tasks[spec.id]
        views = list(self.roster.shards.values())
        why = unplaceable(views, need)
        if why is not None and self.fences is not None:
            return False  # a host that offers it may join again
        if why is not None:  # the shards' config changed under a stored plan
            plan.set_status(spec.id, TaskStatus.FAILED).error = why
            self.book.commit(plan)
            return True
        tenant = tenant_of(plan.spec, spec)
        quota = None if tenant is None else self.node.args.quotas.get(tenant)
        over = None if quota is None else breach(quota, tenant or "", self.book.plans.values(), now)
        if over is not None:
            self._fail_unstarted(
                plan, spec, FailureClass.QUOTA_BREACH, f"quota breach: {over}", now
            )
            return True
        empty = budget.empty(plan.grant_for(spec))
        if empty is not None:
            self._fail_unstarted(
                plan,
                spec,
                FailureClass.BUDGET_EXHAUSTION,
                f"budget exhausted: nothing left of {empty} for another attempt (task budget "
                f"{budget.describe(spec.budget)}, plan budget {budget.describe(plan.spec.budget)})",
                now,
            )
            return True
        ticket = None
        if rec.ticket is not None:
            with contextlib.suppress(ValueError):
                ticket = AffinityTicket.parse(rec.ticket)
        if rec.avoid is not None:  # a re-acquire: a fresh worker, if another can take it
            others = [v for v in views if v.name != rec.avoid]
            if place(others, need, None, self.node.args.boot) is not None:
                views, ticket = others, None
        shard = place(views, need, ticket, self.node.args.boot)
        if shard is None:
            self._ask_recovery(need)
            return False
        rec.avoid = None
        start = plan.place(
            spec,
            AffinityTicket(
                shard=shard.name,
                generation=shard.generation,
                boot=shard.boot or self.node.args.boot,
            ),
            now,
        )
        shard.load += 1
        self.lanes[start.lane] = (plan.id, spec.id)
        self.starting[start.lane] = asyncio.get_running_loop().create_future()
        self.book.commit(plan)
        self.node.spawn(self._start(plan, spec.id, start, shard.name))
        return True

    def _fail_unstarted(
        self, plan: PlanRecord, spec: f.TaskSpec, failure: FailureClass, error: str, now: float
    ) -> None:
        """A failure raised before any lane started (`quota_breach`, `budget_exhaustion`):
        nothing ran and nothing was spent; the task's strategy decides what follows."""
        log.info("plan %s: task %s: %s", plan.id, spec.id, error)
        kind = "quota.refused" if failure is FailureClass.QUOTA_BREACH else "budget.refused"
        self.book.planstore.events.emit(kind, plan=plan.id, task=spec.id, detail=error)
        cancel = plan.fail(spec.id, failure, error, now, self.node.args.max_worker_loss)
        self.book.commit(plan, cancel)

    # --- starting a lane -------------------------------------------------------------------------

    def _resend_starts(self, plan: PlanRecord) -> None:
        """Send again the `LaneStart` of every placement this process has not sent: one an
        earlier generation recorded (durably, before sending) and then stopped or died before
        its shard answered. A start sent but never acted on (refused as coming from a retired
        generation, or lost with its connection) would otherwise leave the task starting for
        ever; the shard acknowledges a lane it already has without starting it twice."""
        for task_id in plan.live_ids():
            rec = plan.tasks[task_id]
            spec = plan.spec.tasks[plan.progress.position[task_id]]
            if rec.status is not TaskStatus.STARTING or rec.lane in self.starting:
                continue
            view = self.roster.shards.get(rec.shard or "")
            if view is None or not view.up or view.generation != rec.shard_gen or not rec.lane:
                continue  # the roster decides: a lost shard (generation) pauses the task
            self.starting[rec.lane] = asyncio.get_running_loop().create_future()
            self.node.spawn(self._start(plan, spec.id, plan.start_of(spec), view.name))

    async def _start(self, plan: PlanRecord, task_id: str, start: f.LaneStart, shard: str) -> None:
        try:
            await self._send_start(plan, task_id, start, shard)
        finally:
            started = self.starting.pop(start.lane, None)
            if started is not None and not started.done():
                started.set_result(None)

    async def _send_start(
        self, plan: PlanRecord, task_id: str, start: f.LaneStart, shard: str
    ) -> None:
        rec = plan.tasks[task_id]
        start_gen = rec.shard_gen
        if self.fences is not None:
            try:
                start = await self.fences.place(plan, task_id, start, self.roster.shards.get(shard))
            except OrchestraError as exc:  # etcd has no quorum: the lane waits, and no tight loop
                log.warning("plan %s: lane %s waits for its fence: %s", plan.id, start.lane, exc)
                await asyncio.sleep(DEGRADED_PAUSE_S)
                if rec.lane == start.lane and rec.status is TaskStatus.STARTING:
                    self._unplace(plan, task_id, shard)
                    self.book.commit(plan)
                return
        # The placement is durable before the lane can exist: a coordinator killed after sending
        # LaneStart must not come back believing the task pending and start it a second time.
        # (On a full disk this waits: the store keeps the batch and retries until there is room.)
        await self.book.planstore.write_durable(plan)
        moved_on = rec.lane != start.lane or rec.status is not TaskStatus.STARTING
        if moved_on or self.roster.stopping():  # the task went on meanwhile, or the tree stops
            return
        try:
            await self.node.call(shard, start, timeout_s=START_TIMEOUT_S)
        except (PeerDown, RemoteError) as exc:
            if rec.lane != start.lane or rec.status is not TaskStatus.STARTING:
                return  # already resolved (its shard was lost meanwhile)
            if isinstance(exc, RemoteError) and exc.code not in (
                ErrorCode.SHARD_FULL,
                ErrorCode.STATE_DEGRADED,
                ErrorCode.PEER_DOWN,
                ErrorCode.STALE_GENERATION,
            ):
                refused = plan.set_status(task_id, TaskStatus.FAILED)
                refused.error = f"{shard} refused the lane: {exc}"
                plan.close_attempt(task_id, start.lane, time.time(), "refused")
            else:
                self._unplace(plan, task_id, shard)
                if isinstance(exc, RemoteError) and exc.code is ErrorCode.SHARD_FULL:
                    # Its own count is ahead of ours: placement tries the next shard now, and
                    # this one again once it reports a lane's end or changes generation.
                    view = self.roster.shards.get(shard)
                    if view is not None and view.generation == start_gen:
                        view.refused = True
                elif isinstance(exc, RemoteError) and exc.code is ErrorCode.STATE_DEGRADED:
                    await asyncio.sleep(DEGRADED_PAUSE_S)  # its disk is full: no tight loop
            self.book.commit(plan)
            return
        except CallTimeout as exc:  # the lane may or may not exist
            if rec.lane == start.lane and rec.status is TaskStatus.STARTING:
                plan.set_status(task_id, TaskStatus.FAILED)
                rec.error = f"starting lane {start.lane} on {shard}: {exc}"
                plan.close_attempt(task_id, start.lane, time.time(), "unknown")
                self.book.commit(plan)
            return
        if rec.lane == start.lane and rec.status is TaskStatus.STARTING:
            plan.set_status(task_id, TaskStatus.RUNNING)
            self.book.commit(plan)

    def _unplace(self, plan: PlanRecord, task_id: str, shard: str) -> None:
        """Take back task `task_id`'s placement on `shard`, which never started
        (`PlanRecord.unplace`); on a host's shard its key goes too (`LaneFences.release`)."""
        lane = plan.tasks[task_id].lane
        plan.unplace(task_id)
        if self.fences is not None and lane is not None and HOST_SEPARATOR in shard:
            self.fences.release(lane, host_of(shard))
