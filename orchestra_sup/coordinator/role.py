"""The coordinator: decides which task runs where, and records what happened.

It holds no sandbox, no tree and no lane (ARCHITECTURE.md §11.6): it places each ready task's lane
on a shard (`placement.place`), and learns the outcome from its durable inbox. Its default policy
is the plan runner (`runner.PlanRecord`).

State (LMDB, `<state_dir>/coordinator`): the plans (`coordinator.planstore`: a spec once, a head
and one record per task, what changed written behind on every change, awaited on submission) and
`inbox` (every `InboxPut` ever committed, keyed by message id: acknowledged only after commit, so a
shard re-sends until it lands, and de-duplicated by id, so it lands once). On start every inbox
entry is applied again, which is idempotent, so a crash between committing a result and recording
its plan loses nothing.

Big plans (issue 24): every step costs what it changes, not the size of the plan
(`runner.PlanRecord.progress`), and what must touch a whole plan is sliced (`coordinator.slices`:
a skip cascade, a report) or done off the loop (`coordinator.accept`: checking a submission).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from typing import Any, assert_never

import msgspec

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.accept import accept_off_loop
from orchestra_sup.coordinator.answers import Answers
from orchestra_sup.coordinator.placement import (
    AffinityTicket,
    Need,
    ShardView,
    need_of,
    place,
    serves,
    tenant_of,
    unplaceable,
)
from orchestra_sup.coordinator.planstore import DBS, PlanStore
from orchestra_sup.coordinator.quota import breach
from orchestra_sup.coordinator.report import plan_summary, sliced_report
from orchestra_sup.coordinator.runner import (
    LIVE,
    PlanRecord,
    TaskStatus,
)
from orchestra_sup.coordinator.slices import Slicer
from orchestra_sup.coordinator.toolkit import Toolkit
from orchestra_sup.errors import (
    CallTimeout,
    ErrorCode,
    OrchestraError,
    PeerDown,
    RemoteError,
    StateError,
)
from orchestra_sup.histogram import RELAY_BOUNDS_S, Buckets
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.protocol.channel import Channel
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.protocol.frames import FailureClass
from orchestra_sup.protocol.patterns import SHELL
from orchestra_sup.runtime.node import Node
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

Serves = (
    f.InboxPut
    | f.TreeStopping
    | f.Quiesce
    | f.Resume
    | f.CtlSubmit
    | f.CtlPlan
    | f.CtlPlans
    | f.CtlCall
    | f.CtlBenchRelay
    | f.CtlCancel
    | f.HitlRespond
    | f.ListPending
    | f.SandboxCreate
)
"""What the coordinator's `handle` takes, from shards (`InboxPut`), the supervisor (control and
forwarded ctl requests) and peers (a `SandboxCreate`, refused)."""
SERVES = Channel[Serves](Serves, "the coordinator does not serve {}")

MSG_ID_MAX_BYTES = 256
"""The longest inbox message id (UTF-8 bytes): it is an LMDB key (`state.store.check_key`)."""
START_TIMEOUT_S = 10.0
RECOVERY_EVERY_S = 15.0
SKIP_BATCH = 64
"""Tasks skipped between two looks at the clock (`Slicer`)."""
FREEZE_TASKS = 1000
"""A plan of at least this many tasks is frozen out of the cyclic garbage collector's view once
it is accepted and again once it is done (`gc.freeze`, with whatever else is alive then): plans
are kept for ever, and a full collection walks every object it tracks, about 70 ms for 33,000
tasks here. (Frozen objects are still freed when their last reference goes; only a reference
cycle among them would stay.)"""


class Coordinator:
    """The `coordinator` role. See the module docstring."""

    serves = SERVES

    def __init__(self) -> None:
        self.node: Node | None = None
        self.store: Store | None = None
        self.planstore: PlanStore | None = None
        self.plans: dict[str, PlanRecord] = {}
        self._active: dict[str, PlanRecord] = {}
        """The plans not done, in the order they were accepted (loaded ones first, oldest first):
        all that a pump or a lost shard reads."""
        self._keys: dict[str, str] = {}
        """Idempotency key -> the id of the plan submitted with it."""
        self._settling: set[str] = set()
        """Plans whose skip cascade goes on in slices (`_settle`): nothing of them is placed
        until it ends."""
        self.inbox_ids: set[str] = set()
        self._committing: dict[str, asyncio.Future[None]] = {}
        self._refused: dict[str, int] = {}
        self._recovery_asked: dict[str, float] = {}
        self.stopping = False
        self.held = False
        """At a quiet point for a rollover (`Quiesce`): no turn is taken, nothing is placed."""
        self._unread: list[f.InboxPut] = []
        """Inbox messages committed while held, to apply on `Resume`."""
        self.answers: Answers | None = None
        self._wake: asyncio.TimerHandle | None = None
        """The timer that pumps again when the earliest retry backoff ends."""
        self.toolkit: Toolkit | None = None
        self.shards: dict[str, ShardView] = {}
        self.lanes: dict[str, tuple[str, str]] = {}
        """Lane id -> (plan id, task id) of every lane placed since start (pruned on lookup)."""
        self._starting: dict[str, asyncio.Future[None]] = {}
        """Lanes whose `LaneStart` is in flight; resolved when their shard answers (or not)."""
        self._moving: dict[str, frozenset[int]] = {}
        """Per shard, its generations whose lanes are moving to the current one: draining, or
        retired and not yet settled (`_settle_moved`)."""
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._final: set[str] = set()
        """Plans whose final record is written (or being written) durably."""
        self._enc = msgspec.msgpack.Encoder()
        self._put_dec = msgspec.msgpack.Decoder(f.InboxPut)

    async def open(self, node: Node) -> None:
        self.node = node
        node.relay = Buckets(RELAY_BOUNDS_S)  # its calls to peers are the relay: time them
        self.toolkit = Toolkit(
            node,
            start_lane=self._start_lane,
            shards=lambda: [s.name for s in self.shards.values() if s.up],
            lane_shard=self._lane_shard,
            deadline_s=node.args.relay_deadline_s,
        )
        store = Store(node.paths.state_dir / "coordinator", ["inbox", *DBS])
        store.start()
        self.attach(node, store)
        assert self.planstore is not None and self.answers is not None
        for plan in self.planstore.load():
            self._add(plan)
            for task_id in plan.live_ids():
                lane = plan.tasks[task_id].lane
                if lane is not None:
                    self.lanes[lane] = (plan.id, task_id)
            if plan.done:
                self._final.add(plan.id)
                self._active.pop(plan.id, None)
        gc.freeze()  # what was loaded stays: keep it out of every full collection
        for key, value in self.store.items("inbox"):
            self.inbox_ids.add(key.decode())
            try:
                self._apply_put(self._put_dec.decode(value), pump=False)
            except msgspec.DecodeError as exc:
                log.error("inbox %r: unreadable entry skipped: %s", key, exc)
        # An answer recorded by an earlier generation that stopped before acting on it, or
        # acted on and not delivered (`Answers.recover`).
        for plan in list(self._active.values()):
            self.answers.recover(plan)

    def attach(self, node: Node, store: Store) -> None:
        """Serve through `node`, keeping state in `store` (started, opened with "inbox" and
        `planstore.DBS`)."""
        self.node, self.store = node, store
        self.planstore = PlanStore(store)
        self.answers = Answers(
            node,
            plans=self._active.values,
            shards=self.shards,
            check_writable=store.check_writable,
            write_durable=self.planstore.write_durable,
            settle=self._answered,
        )

    @property
    def max_worker_loss(self) -> int:
        """Losses of its worker process after which a task fails (`[lanes] max_worker_loss`)."""
        assert self.node is not None
        return self.node.args.max_worker_loss

    def _add(self, plan: PlanRecord) -> None:
        self.plans[plan.id] = plan
        self._active[plan.id] = plan
        if plan.key is not None:
            self._keys[plan.key] = plan.id

    def load(self) -> int:
        return len(self._active)

    def lanes_by_state(self) -> dict[str, int]:
        return {}  # it holds no lane (ARCHITECTURE.md §11.6); the shards say theirs

    def inbox_depth(self) -> int:
        """Inbox messages received and not yet acted on: being committed, or committed while
        held at a quiet point (`_unread`, applied on `Resume`)."""
        return len(self._committing) + len(self._unread)

    def outbox_depth(self) -> int:
        return 0  # it is where outboxes deliver

    def persistence(self) -> Store | None:
        return self.store

    async def close(self) -> None:
        assert self.store is not None
        self.store.close()

    # --- roster ----------------------------------------------------------------------------------

    def on_roster(self, changed: list[f.PeerState]) -> None:
        assert self.node is not None
        for name in [n for n in self.shards if n not in self.node.peers]:
            # taken out of the tree (a reload retired it): never placed on, never waited for;
            # its live tasks are lost below (`_lose_unknown_shards`) and run elsewhere
            del self.shards[name]
            self._refused.pop(name, None)
            self._moving.pop(name, None)
        for peer in changed:
            if peer.role != "shard":
                continue
            self.shards[peer.name] = ShardView(
                name=peer.name,
                generation=peer.generation,
                up=peer.up,
                capacity=peer.capacity,
                capabilities=frozenset(peer.capabilities),
                tenants=frozenset(peer.tenants),
                stopping=peer.stopping,
            )
            self._refused.pop(peer.name, None)
            # Rollover: lanes of a draining generation are moving here, not lost; those of one
            # that retired are kept until the shard says which it has (`_settle_moved`). So are
            # those of any older generation of a shard that is up: this coordinator may have been
            # away while a drain ended (lanes a crashed generation ran are simply not there).
            keep = self._moving.pop(peer.name, frozenset())
            if peer.up:
                older = self._older_generations(peer.name, peer.generation)
                retired = (keep | older) - set(peer.draining)
                keep = self._moving[peer.name] = keep | older | set(peer.draining)
                if retired:
                    assert self.node is not None
                    self.node.spawn(self._settle_moved(peer.name, peer.generation, retired))
            else:
                keep = frozenset()
            for plan in list(self._active.values()):
                if self.stopping and not peer.up:
                    lost = plan.interrupt_shard(peer.name)
                else:
                    lost = plan.lose_shard(
                        peer.name,
                        peer.generation if peer.up else None,
                        self.max_worker_loss,
                        keep,
                        time.time(),
                    )
                if lost:
                    log.warning(
                        "plan %s: %s lost with %s: %s",
                        plan.id,
                        ", ".join(lost),
                        peer.name,
                        ", ".join(f"{t} {plan.tasks[t].status}" for t in lost),
                    )
                    self._persist(plan)
                    self._maybe_done(plan)
        self._lose_unknown_shards()
        self._pump()

    def _older_generations(self, shard: str, generation: int) -> frozenset[int]:
        """Generations of `shard` older than `generation` that live tasks were placed on."""
        return frozenset(
            rec.shard_gen
            for plan in self._active.values()
            for task_id in plan.live_ids()
            for rec in (plan.tasks[task_id],)
            if rec.shard == shard and rec.shard_gen is not None and rec.shard_gen < generation
        )

    async def _settle_moved(self, shard: str, generation: int, retired: frozenset[int]) -> None:
        """Generations `retired` of `shard` drained and are gone: ask generation `generation`
        which lanes it has (live, or with a result in its outbox) and move their tasks on to it;
        the rest are lost (`PlanRecord.settle_moved`). A shard that cannot say loses them all."""
        assert self.node is not None
        try:
            reply: object = await self.node.call(
                shard, f.ListLanes(results=True), timeout_s=START_TIMEOUT_S
            )
        except OrchestraError as exc:
            reply = exc
        there: set[str] = set()
        if isinstance(reply, f.LaneList):
            there = {lane.lane for lane in reply.lanes} | set(reply.results)
        else:
            log.warning("%s: which lanes moved is unknown (%s): they are lost", shard, reply)
        moving = self._moving.get(shard)
        if moving is not None:
            self._moving[shard] = moving - retired
        for plan in list(self._active.values()):
            moved, lost = plan.settle_moved(
                shard, retired, generation, there, self.max_worker_loss, time.time()
            )
            if moved or lost:
                log.info("plan %s: moved to %s: %s; lost: %s", plan.id, shard, moved, lost)
                self._persist(plan)
                self._maybe_done(plan)
        self._pump()

    def _lose_unknown_shards(self) -> None:
        """A live task on a shard the roster does not have (the tree came back with fewer
        shards after a crash) is lost with it, as if that shard had died."""
        assert self.node is not None
        if not self.node.peers:
            return
        for plan in list(self._active.values()):
            gone = {
                rec.shard
                for task_id in plan.live_ids()
                for rec in (plan.tasks[task_id],)
                if rec.shard is not None and rec.shard not in self.node.peers
            }
            for shard in gone:
                lost = plan.lose_shard(shard, None, self.max_worker_loss, now=time.time())
                log.warning("plan %s: %s lost: %s is no longer in the tree", plan.id, lost, shard)
                self._persist(plan)
                self._maybe_done(plan)

    # --- requests --------------------------------------------------------------------------------

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope[Serves]) -> None:
        assert self.node is not None
        body = env.body
        match body:
            case f.InboxPut() if (
                sum(part is not None for part in (body.result, body.pause, body.note)) != 1
            ):
                message = "an InboxPut carries exactly one of result, pause and note"
                ep.reply(env, peer, f.Error(code=ErrorCode.BAD_REQUEST, message=message))
            case f.InboxPut() if not 0 < len(body.msg_id.encode()) <= MSG_ID_MAX_BYTES:
                message = f"an InboxPut's msg_id is 1 to {MSG_ID_MAX_BYTES} bytes"
                ep.reply(env, peer, f.Error(code=ErrorCode.BAD_REQUEST, message=message))
            case f.InboxPut():
                if body.msg_id in self.inbox_ids:
                    ep.reply(env, peer, f.InboxAck(msg_id=body.msg_id))
                else:
                    self.node.answer(ep, peer, env, self._commit_inbox(body))
            case f.TreeStopping():
                self.stopping = True
                ep.reply(env, peer, f.Ack())
            case f.Quiesce():
                self.node.answer(ep, peer, env, self._quiesce(body.timeout_s))
            case f.Resume():
                self._resume()
                ep.reply(env, peer, f.Ack())
            case f.CtlSubmit():
                self.node.answer(ep, peer, env, self._submit(body.plan))
            case f.CtlPlan():
                self.node.answer(ep, peer, env, self._plan(body))
            case f.CtlPlans():
                newest = sorted(self.plans.values(), key=lambda p: p.submitted_at, reverse=True)
                ep.reply(env, peer, f.PlanList(plans=[plan_summary(p) for p in newest]))
            case f.CtlCall():
                self.node.answer(ep, peer, env, self._call(body))
            case f.CtlBenchRelay():
                self.node.answer(ep, peer, env, self._bench(body))
            case f.CtlCancel():
                self.node.answer(ep, peer, env, self._cancel(body.lane))
            case f.HitlRespond() if self.answers is not None:
                self.node.answer(ep, peer, env, self.answers.respond(body))
            case f.ListPending() if self.answers is not None:
                ep.reply(env, peer, self.answers.pending())
            case f.SandboxCreate():
                message = "the coordinator never holds a sandbox"
                ep.reply(env, peer, f.Error(code=ErrorCode.FORBIDDEN, message=message))
            case f.HitlRespond() | f.ListPending():  # no answers store: not served here
                ep.reply(env, peer, SERVES.unsupported(body))
            case _:
                assert_never(body)

    async def _commit_inbox(self, put: f.InboxPut) -> f.Body:
        """Commit, then acknowledge, then act (never acknowledge what could still be lost)."""
        assert self.store is not None
        pending = self._committing.get(put.msg_id)
        if pending is None:
            pending = self.store.put_durable("inbox", put.msg_id.encode(), self._enc.encode(put))
            self._committing[put.msg_id] = pending
            try:
                await pending
            finally:
                self._committing.pop(put.msg_id, None)
            self.inbox_ids.add(put.msg_id)
            if self.held:  # committed and acknowledged; the next generation applies it
                self._unread.append(put)
            else:
                self._apply_put(put, pump=True)
        else:
            await asyncio.shield(pending)
        return f.InboxAck(msg_id=put.msg_id)

    async def _submit(
        self, spec: f.PlanSpec, key: str | None = None, ticket: str | None = None
    ) -> f.Body:
        """Validate and durably record a plan, then start what is ready. With an idempotency
        `key` already used, nothing new happens and the earlier plan's id is the answer. A
        `ticket` is every task's first affinity ticket (`start_lane ticket=`). A big plan is
        checked off the loop (`coordinator.accept`)."""
        assert self.store is not None and self.planstore is not None and self.node is not None
        if key is not None and key in self._keys:
            return f.PlanAccepted(id=self._keys[key])
        try:
            self.store.check_writable()  # a full disk refuses new work, in one clear line
        except StateError as exc:
            raise RemoteError(ErrorCode.STATE_DEGRADED, str(exc)) from exc
        plan = await accept_off_loop(
            spec,
            plan_id=uuid.uuid4().hex[:12],
            submitted_at=time.time(),
            shards=list(self.shards.values()),
            programs=frozenset({SHELL, *self.node.args.lane_programs}),
            key=key,
            ticket=ticket,
        )
        if key is not None and key in self._keys:  # the same key, accepted meanwhile
            return f.PlanAccepted(id=self._keys[key])
        await self.planstore.write_durable(plan, new=True)
        self._add(plan)
        if len(plan.tasks) >= FREEZE_TASKS:
            gc.freeze()
        self.node.retitle()
        log.info("plan %s (%s): %d tasks accepted", plan.id, spec.name, len(spec.tasks))
        self._pump()
        return f.PlanAccepted(id=plan.id)

    async def _plan(self, req: f.CtlPlan) -> f.Body:
        plan = self.plans.get(req.id)
        if plan is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no plan {req.id!r}")
        if not plan.done and req.wait_s > 0:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(plan.id, []).append(waiter)
            try:
                async with asyncio.timeout(req.wait_s):
                    await waiter
            except TimeoutError:
                pass
            finally:
                waiters = self._waiters.get(plan.id, [])
                if waiter in waiters:
                    waiters.remove(waiter)
        return await sliced_report(plan)

    async def _start_lane(self, params: tools.StartLane) -> Any:
        """`start_lane run=CMD [name=] [timeout_s=] [requires=CAP,CAP] [tenant=] [ticket=]
        [program=] [key=]`: a one-task plan, placed like any. The key makes a re-sent start
        harmless (the same plan and lane are answered); a `ticket` from an earlier answer sends
        the lane back to that shard while its generation lives (`placement.AffinityTicket`).

        Answers {"plan", "lane", "status", "shard", "ticket", "duplicate"}; lane, shard and
        ticket are null while the lane waits for a shard. Raises `RemoteError(bad_request)` for
        a bad parameter or a need no shard could meet."""
        run = params.run
        program = params.program or SHELL
        if not run and program == SHELL:
            raise RemoteError(ErrorCode.BAD_REQUEST, "missing parameter 'run'")
        try:
            timeout = float(params.timeout_s) if params.timeout_s is not None else None
        except ValueError as exc:
            raise RemoteError(ErrorCode.BAD_REQUEST, f"timeout_s: {exc}") from exc
        if params.ticket:
            try:
                AffinityTicket.parse(params.ticket)
            except ValueError as exc:
                raise RemoteError(ErrorCode.BAD_REQUEST, str(exc)) from exc
        requires = [c for c in params.requires.split(",") if c]
        task = f.TaskSpec(
            id="lane",
            run=run,
            timeout_s=timeout,
            requires=requires,
            program=program,
        )
        spec = f.PlanSpec(name=params.name, tasks=[task], tenant=params.tenant)
        key = params.key
        known = {p.id for p in self.plans.values()}
        accepted = await self._submit(spec, key=key, ticket=params.ticket or None)
        assert isinstance(accepted, f.PlanAccepted)
        rec = self.plans[accepted.id].tasks["lane"]
        return {
            "plan": accepted.id,
            "lane": rec.lane,
            "status": str(rec.status),
            "shard": rec.shard,
            "ticket": rec.ticket,
            "duplicate": accepted.id in known,
        }

    async def _call(self, call: f.CtlCall) -> f.Body:
        assert self.toolkit is not None
        return f.ToolResult(value=await self.toolkit.call(call.tool, call.params))

    async def _bench(self, req: f.CtlBenchRelay) -> f.Body:
        """Time `req.tool` through the relay, sequentially, from inside the coordinator."""
        assert self.toolkit is not None
        samples: list[float] = []
        for i in range(req.warmup + req.iterations):
            t0 = time.perf_counter_ns()
            await self.toolkit.call(req.tool, req.params)
            if i >= req.warmup:
                samples.append((time.perf_counter_ns() - t0) / 1000)
        return f.BenchSamples(samples_us=samples)

    async def _lane_shard(self, lane: str) -> str | None:
        """The shard running live lane `lane` once that shard has taken it (a lane whose
        `LaneStart` is still in flight is waited for, so a tool never reaches a shard before the
        lane does), or None. O(1): lane tools are the relay's hot path, and a tree may hold
        thousands of plans (one per `start_lane`)."""
        starting = self._starting.get(lane)
        if starting is not None:
            await asyncio.shield(starting)
        where = self.lanes.get(lane)
        if where is None:
            return None
        rec = self.plans[where[0]].tasks[where[1]]
        if rec.lane != lane or rec.status not in LIVE:
            del self.lanes[lane]  # that lane has ended: forget it
            return None
        return rec.shard

    async def _cancel(self, lane: str) -> f.Body:
        """`ctl cancel`: the `cancel_lane` tool, so operators and policies share one path; a
        task that waits for a human with no lane (an approval, a review) is cancelled here."""
        assert self.toolkit is not None
        for plan in list(self._active.values()):
            task_id = plan.waiting_on(lane)
            if task_id is not None and plan.tasks[task_id].status is TaskStatus.AWAITING_APPROVAL:
                rec = plan.set_status(task_id, TaskStatus.CANCELLED)
                rec.error, rec.pending = "cancelled", None
                self._persist(plan)
                self._maybe_done(plan)
                self._pump()
                return f.Ack()
        await self.toolkit.call("cancel_lane", {"lane": lane})
        return f.Ack()

    def _answered(self, plan: PlanRecord, cancel: list[tuple[str, str]]) -> None:
        """An answer changed `plan` (`Answers.settle`): cancel the lanes a sibling-group retry
        took over, write it, skip and finish what follows, place what became ready."""
        self._cancel_lanes(cancel)
        self._persist(plan)
        self._maybe_done(plan)
        if self.node is not None and self.node.peers:
            self._pump()

    def _cancel_lanes(self, lanes: list[tuple[str, str]]) -> None:
        """Cancel lanes a sibling-group retry took over (their results are stale now)."""
        assert self.node is not None or not lanes
        for shard, lane in lanes:
            assert self.node is not None
            self.node.spawn(self._cancel_lane(shard, lane))

    async def _cancel_lane(self, shard: str, lane: str) -> None:
        assert self.node is not None
        with contextlib.suppress(OrchestraError):
            await self.node.call(shard, f.LaneCancel(lane=lane), timeout_s=START_TIMEOUT_S)

    # --- rollover --------------------------------------------------------------------------------

    async def _quiesce(self, timeout_s: float) -> f.Body:
        """Reach a quiet point and hold it (seeds/000: "no coordinator turn is open, no stop is
        in progress, no turn's actions are still waiting to be applied"): from now on nothing
        is placed and results are committed and acknowledged but not applied; then wait, at
        most `timeout_s` seconds, until no lane start and no inbox commit is in flight.

        Answers `Quiesced`. Raises `RemoteError`: `busy` when the tree is stopping, `timeout`
        (and holds no more) when starts or commits were still in flight at the deadline."""
        if self.stopping:
            raise RemoteError(ErrorCode.BUSY, "the tree is stopping")
        self.held = True
        try:
            async with asyncio.timeout(timeout_s):
                while self._starting or self._committing:
                    await asyncio.wait([*self._starting.values(), *self._committing.values()])
        except TimeoutError:
            self._resume()
            raise RemoteError(
                ErrorCode.TIMEOUT,
                f"{len(self._starting)} lane start(s) and {len(self._committing)} inbox "
                f"commit(s) still in flight after {timeout_s:g} s",
            ) from None
        waiting = sum(len(plan.ready()) for plan in self._active.values())
        return f.Quiesced(held=f"turns held, {waiting} ready task(s) wait for the next generation")

    def _resume(self) -> None:
        """Leave the quiet point (a rollover rolled back): apply what came in, then place."""
        self.held = False
        unread, self._unread = self._unread, []
        for put in unread:
            self._apply_put(put, pump=False)
        self._pump()

    # --- the plan runner -------------------------------------------------------------------------

    def _apply_put(self, put: f.InboxPut, *, pump: bool) -> None:
        """Act on one committed inbox message: a lane's result, a question its program asks a
        human, or a note it tells the coordinator. Idempotent: every start applies the whole
        inbox again."""
        if put.result is not None:
            self._apply(put.result, pump=pump)
        elif put.pause is not None:
            plan = self.plans.get(put.pause.plan)
            if plan is not None and plan.pause_for_question(put.pause):
                log.info(
                    "plan %s: task %s asks a human: %s", plan.id, put.pause.task, put.pause.question
                )
                self._persist(plan)
        elif put.note is not None:
            plan = self.plans.get(put.note.plan)
            if plan is not None and plan.note(put.note, put.msg_id):
                self._persist(plan)

    def _apply(self, result: f.LaneResult, *, pump: bool) -> None:
        self._refused.pop(result.shard, None)  # a lane ended there: it has room again
        plan = self.plans.get(result.plan)
        if plan is None:
            return
        applied, cancel, changed = plan.apply(result, time.time(), self.max_worker_loss)
        if changed:  # a stale result's spend is recorded too
            self._persist(plan)
        if not applied:
            return
        log.info("plan %s: task %s %s", plan.id, result.task, result.status)
        if self.node is not None:
            self._cancel_lanes(cancel)
        self._maybe_done(plan)
        if pump:
            self._pump()

    def _persist(self, plan: PlanRecord) -> None:
        """Write what changed of `plan` behind (`coordinator.planstore`)."""
        assert self.planstore is not None
        self.planstore.write(plan)

    def _maybe_done(self, plan: PlanRecord) -> None:
        """Skip what can no longer run (for one slice; a longer cascade goes on in `_settle`);
        once the plan is done, write its final record durably (seeds/003: a failure that
        reaches the root "terminates the session with a durable final snapshot"), then wake
        whoever waits for it (`ctl plan --wait`)."""
        if plan.id in self._settling:
            return
        if plan.blocking:
            slicer = Slicer()
            while plan.skip_blocked(SKIP_BATCH):
                self._persist(plan)
                if slicer.spent:
                    break
            if plan.blocking:
                assert self.node is not None
                self._settling.add(plan.id)
                self.node.spawn(self._settle(plan, slicer))
                return
        if plan.done and plan.id not in self._final:
            self._final.add(plan.id)
            self._active.pop(plan.id, None)
            assert self.node is not None
            self.node.retitle()
            self.node.spawn(self._finish(plan))

    async def _settle(self, plan: PlanRecord, slicer: Slicer) -> None:
        """Go on skipping what can no longer run in `plan`, a slice at a time, then finish as
        `_maybe_done` does and place what the plan's end lets run (nothing of the plan is
        placed meanwhile: a grant is carved from a plan whose skips are all counted)."""
        try:
            while plan.blocking:
                await slicer.tick()
                if plan.skip_blocked(SKIP_BATCH):
                    self._persist(plan)
        finally:
            self._settling.discard(plan.id)
        self._maybe_done(plan)
        self._pump()

    async def _finish(self, plan: PlanRecord) -> None:
        assert self.planstore is not None
        try:
            await self.planstore.write_durable(plan)
        finally:
            for waiter in self._waiters.pop(plan.id, []):
                if not waiter.done():
                    waiter.set_result(None)
        if len(plan.tasks) >= FREEZE_TASKS:
            gc.freeze()

    def _ask_recovery(self, need: Need) -> None:
        """A lane with `need` is waiting and a shard that could take it is down: ask the
        supervisor to end that shard's restart backoff, at most once per `RECOVERY_EVERY_S` per
        shard (seeds/000: "at most every 15 seconds per host"). Nothing waits for the answer."""
        assert self.node is not None
        now = time.monotonic()
        for view in self.shards.values():
            last = self._recovery_asked.get(view.name)
            if view.up or not serves(view, need):
                continue
            if last is not None and now - last < RECOVERY_EVERY_S:
                continue
            self._recovery_asked[view.name] = now
            log.info("a lane waits and %s is down: asking the supervisor to recover it", view.name)
            self.node.spawn(self._recover(view.name))

    async def _recover(self, name: str) -> None:
        assert self.node is not None
        with contextlib.suppress(OrchestraError):
            await self.node.control.request(f.RecoverChild(name=name), timeout_s=2.0)

    def _loads(self) -> None:
        for view in self.shards.values():
            view.load = 0
        for plan in self._active.values():
            for task_id in plan.live_ids():
                rec = plan.tasks[task_id]
                view = self.shards.get(rec.shard or "")
                if view is not None:
                    here = rec.shard_gen == view.generation
                    view.load += here or rec.shard_gen in self._moving.get(view.name, ())
        for name, generation in self._refused.items():
            view = self.shards.get(name)
            if view is not None and view.generation == generation:
                view.load = max(view.load, view.capacity)  # it said it is full: believe it

    def _pump(self) -> None:
        """Start every ready task that has a place to go, plans in the order they were accepted,
        each in file order, until no shard has room (nothing once the tree is stopping: what is
        not running then waits for the next start)."""
        assert self.node is not None
        if self.stopping or self.held:
            return
        if self.answers is not None:
            self.answers.send()
        self._loads()
        now = time.time()
        wake: float | None = None
        waits: set[Need] = set()  # needs no shard can take now: their tasks wait
        for plan in list(self._active.values()):
            self._resend_starts(plan)
            self._maybe_done(plan)
            if plan.id in self._settling or plan.done:
                continue
            if plan.hold_for_approval(now):
                self._persist(plan)
            for spec in plan.iter_ready(now):
                need = need_of(plan.spec, spec)
                if not any(view.open for view in self.shards.values()):
                    # Every shard is full or down: what is ready waits for the next pump, and
                    # a down one that could take it is asked back from its restart backoff.
                    self._ask_recovery(need)
                    break
                if need not in waits and not self._place(plan, spec, need, now):
                    waits.add(need)
            retry = plan.next_retry()
            if retry is not None and retry > now:
                wake = retry if wake is None else min(wake, retry)
        self._wake_at(wake)

    def _wake_at(self, when: float | None) -> None:
        """Pump again at `when` (Unix seconds: the earliest retry backoff's end), or never."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if when is not None:
            delay = max(0.0, when - time.time())
            self._wake = asyncio.get_running_loop().call_later(delay, self._pump)

    def _resend_starts(self, plan: PlanRecord) -> None:
        """Send again the `LaneStart` of every placement this process has not sent: one an
        earlier generation recorded (durably, before sending) and then stopped or died before
        its shard answered. A start sent but never acted on (refused as coming from a retired
        generation, or lost with its connection) would otherwise leave the task starting for
        ever; the shard acknowledges a lane it already has without starting it twice."""
        assert self.node is not None
        for task_id in plan.live_ids():
            rec = plan.tasks[task_id]
            spec = plan.spec.tasks[plan.progress.position[task_id]]
            if rec.status is not TaskStatus.STARTING or rec.lane in self._starting:
                continue
            view = self.shards.get(rec.shard or "")
            if view is None or not view.up or view.generation != rec.shard_gen or not rec.lane:
                continue  # the roster decides: a lost shard (generation) pauses the task
            self._starting[rec.lane] = asyncio.get_running_loop().create_future()
            self.node.spawn(self._start(plan, spec.id, plan.start_of(spec), view.name))

    def _place(self, plan: PlanRecord, spec: f.TaskSpec, need: Need, now: float) -> bool:
        """Place one ready task (placement.py: affinity, eligibility, score, tie-break), fail it
        when no shard of this tree could ever take it, or leave it waiting (False: no shard can
        take a lane with `need` now). First the tenant's quota and then the budget are checked:
        a breach, or a budget with nothing left to carve a lane from, starts nothing and is a
        failure for the task's strategy."""
        assert self.node is not None
        rec = plan.tasks[spec.id]
        views = list(self.shards.values())
        why = unplaceable(views, need)
        if why is not None:  # the shards' config changed under a stored plan
            plan.set_status(spec.id, TaskStatus.FAILED).error = why
            self._persist(plan)
            self._maybe_done(plan)
            return True
        tenant = tenant_of(plan.spec, spec)
        quota = None if tenant is None else self.node.args.quotas.get(tenant)
        over = None if quota is None else breach(quota, tenant or "", self.plans.values(), now)
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
            AffinityTicket(shard=shard.name, generation=shard.generation, boot=self.node.args.boot),
            now,
        )
        shard.load += 1
        self.lanes[start.lane] = (plan.id, spec.id)
        self._starting[start.lane] = asyncio.get_running_loop().create_future()
        self._persist(plan)
        self.node.spawn(self._start(plan, spec.id, start, shard.name))
        return True

    def _fail_unstarted(
        self, plan: PlanRecord, spec: f.TaskSpec, failure: FailureClass, error: str, now: float
    ) -> None:
        """A failure raised before any lane started (`quota_breach`, `budget_exhaustion`):
        nothing ran and nothing was spent; the task's strategy decides what follows."""
        log.info("plan %s: task %s: %s", plan.id, spec.id, error)
        self._cancel_lanes(plan.fail(spec.id, failure, error, now, self.max_worker_loss))
        self._persist(plan)
        self._maybe_done(plan)

    async def _start(self, plan: PlanRecord, task_id: str, start: f.LaneStart, shard: str) -> None:
        try:
            await self._send_start(plan, task_id, start, shard)
        finally:
            started = self._starting.pop(start.lane, None)
            if started is not None and not started.done():
                started.set_result(None)

    async def _send_start(
        self, plan: PlanRecord, task_id: str, start: f.LaneStart, shard: str
    ) -> None:
        assert self.node is not None
        rec = plan.tasks[task_id]
        start_gen = rec.shard_gen
        assert self.store is not None
        # The placement is durable before the lane can exist: a coordinator killed after sending
        # LaneStart must not come back believing the task pending and start it a second time.
        # (On a full disk this waits: the store keeps the batch and retries until there is room.)
        assert self.planstore is not None
        await self.planstore.write_durable(plan)
        if rec.lane != start.lane or rec.status is not TaskStatus.STARTING or self.stopping:
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
                plan.unplace(task_id)
                if isinstance(exc, RemoteError) and exc.code is ErrorCode.SHARD_FULL:
                    # Its own count is ahead of ours: placement tries the next shard now, and
                    # this one again once it reports a lane's end or changes generation.
                    self._refused[shard] = start_gen
                elif isinstance(exc, RemoteError) and exc.code is ErrorCode.STATE_DEGRADED:
                    await asyncio.sleep(1.0)  # its disk is full: no tight re-placement loop
            self._persist(plan)
            self._maybe_done(plan)
            self._pump()
            return
        except CallTimeout as exc:  # the lane may or may not exist
            if rec.lane == start.lane and rec.status is TaskStatus.STARTING:
                plan.set_status(task_id, TaskStatus.FAILED)
                rec.error = f"starting lane {start.lane} on {shard}: {exc}"
                plan.close_attempt(task_id, start.lane, time.time(), "unknown")
                self._persist(plan)
                self._maybe_done(plan)
                self._pump()
            return
        if rec.lane == start.lane and rec.status is TaskStatus.STARTING:
            plan.set_status(task_id, TaskStatus.RUNNING)
            self._persist(plan)
