"""The coordinator: decides which task runs where, and records what happened.

It holds no sandbox, no tree and no lane (ARCHITECTURE.md §11.6): it places each ready task's lane
on a shard (`coordinator.placer`), and learns the outcome from its durable inbox. Its default
policy is the plan runner (`runner.PlanRecord`). Its parts: the plans and the one path a change
to one takes (`coordinator.book`), the shards seen (`coordinator.roster`), the placement of lanes
(`coordinator.placer`), humans' answers (`coordinator.answers`) and the lane tools
(`coordinator.toolkit`); this module serves requests and the inbox.

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
import gc
import logging
import time
import uuid
from typing import Any, assert_never

import msgspec

from orchestra_sup.coordinator.accept import Submission, accept_off_loop
from orchestra_sup.coordinator.answers import Answers
from orchestra_sup.coordinator.book import FREEZE_TASKS, PlanBook
from orchestra_sup.coordinator.fencing import refusal
from orchestra_sup.coordinator.placement import ShardView
from orchestra_sup.coordinator.placer import Placer
from orchestra_sup.coordinator.planstore import DBS, PlanStore
from orchestra_sup.coordinator.report import plan_summary, sliced_report
from orchestra_sup.coordinator.retention import DBS as RETENTION_DBS
from orchestra_sup.coordinator.retention import InboxIndex, Retention, plan_of
from orchestra_sup.coordinator.roster import Roster
from orchestra_sup.coordinator.runner import PlanRecord, TaskStatus
from orchestra_sup.coordinator.seat import Seat
from orchestra_sup.coordinator.sessionstore import DBS as SESSION_DBS
from orchestra_sup.coordinator.sessionstore import SessionStore
from orchestra_sup.coordinator.startlane import start_lane
from orchestra_sup.coordinator.toolkit import Toolkit
from orchestra_sup.errors import ErrorCode, RemoteError, StateError
from orchestra_sup.histogram import RELAY_BOUNDS_S, Buckets
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.protocol.channel import NO_SANDBOX, Channel
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.protocol.patterns import DAG, SHELL
from orchestra_sup.runtime.node import Node
from orchestra_sup.state.events import UNLOGGED, EventLog
from orchestra_sup.state.store import Store
from orchestra_sup.system import cpupolicy
from orchestra_sup.system.reserve import DiskReserve

__all__ = ["FREEZE_TASKS", "MSG_ID_MAX_BYTES", "Coordinator"]

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
    | f.CtlMessage
    | f.HitlRespond
    | f.ListPending
    | f.SandboxCreate
    | f.CtlPrune
)
"""What the coordinator's `handle` takes, from shards (`InboxPut`), the supervisor (control and
forwarded ctl requests) and peers (a `SandboxCreate`, refused)."""
SERVES = Channel[Serves](Serves, "the coordinator does not serve {}")

MSG_ID_MAX_BYTES = 256
"""The longest inbox message id (UTF-8 bytes): it is an LMDB key (`state.store.check_key`)."""


class Coordinator:
    """The `coordinator` role. See the module docstring."""

    serves = SERVES
    from_hosts = (f.InboxPut,)  # a host's shard's outbox: no ctl, no HITL answer, no seat

    def __init__(self) -> None:
        self.node: Node | None = None
        self.store: Store | None = None
        self.reserve: DiskReserve | None = None
        self.events: EventLog | None = None
        self.book: PlanBook | None = None
        self.roster: Roster | None = None
        self.placer: Placer | None = None
        self.answers: Answers | None = None
        self.toolkit: Toolkit | None = None
        self.seat: Seat | None = None
        self.inbox = InboxIndex()
        self.retention: Retention | None = None
        self._committing: dict[str, asyncio.Future[None]] = {}
        self.stopping = False
        self.held = False
        """At a quiet point for a rollover (`Quiesce`): no turn is taken, nothing is placed."""
        self._unread: list[f.InboxPut] = []
        """Inbox messages committed while held, to apply on `Resume`."""
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
        # Its synced commits (an inbox message, a placement) are on a reaction's path: the
        # write-behind thread runs in real time, one below the loop (`cpupolicy`, "Threads").
        store = Store(
            node.paths.state_dir / "coordinator",
            ["inbox", *DBS, *SESSION_DBS, *RETENTION_DBS],
            thread_start=cpupolicy.same_class(below=1),
        )
        store.start()
        events = EventLog.open(
            node.paths.state_dir, "coordinator", thread_start=cpupolicy.same_class(below=2)
        )
        self.attach(node, store, events)
        assert self.book is not None and self.placer is not None and self.answers is not None
        book = self.book
        with book.batch(pump=False):  # the roster's first change places what is ready
            for plan in book.planstore.load():
                book.add(plan)
                self.placer.track(plan)
                if plan.done:
                    book.final.add(plan.id)
                    book.active.pop(plan.id, None)
            gc.freeze()  # what was loaded stays: keep it out of every full collection
            for key, value in store.items("inbox"):
                try:
                    put = self._put_dec.decode(value)
                except msgspec.DecodeError as exc:
                    log.error("inbox %r: unreadable entry skipped: %s", key, exc)
                    continue
                self.inbox.add(key.decode(), put, known=plan_of(put) in book.plans)
                self._apply_put(put)
            # An answer recorded by an earlier generation that stopped before acting on it, or
            # acted on and not delivered (`Answers.recover`).
            for plan in list(book.active.values()):
                self.answers.recover(plan)
        assert self.seat is not None
        self.seat.open()  # every session not ended, from its last checkpoint
        self.placer.open()
        assert self.retention is not None
        self.retention.load(time.time())
        node.spawn(self.retention.run())

    def attach(self, node: Node, store: Store, events: EventLog | None = None) -> None:
        """Serve through `node`, keeping state in `store` (started, opened with "inbox",
        `planstore.DBS`, `sessionstore.DBS` and `retention.DBS`), and writing what happens
        to `events` (the tree's event log; None: nowhere)."""
        self.node, self.store, self.events = node, store, events
        self.reserve = DiskReserve(store.path, node.args.min_free)  # the disk it writes to
        planstore = PlanStore(store, UNLOGGED if events is None else events)
        sessions = SessionStore(store)
        self.book = book = PlanBook(node, planstore, pump=self._pump)
        self.roster = roster = Roster(node, book, stopping=lambda: self.stopping)
        self.answers = answers = Answers(node, book, shards=roster.shards)
        self.placer = Placer(node, book, answers, roster, held=lambda: self.held)
        if self.toolkit is not None:
            self.seat = Seat(
                node,
                book,
                sessions,
                allowed=frozenset(node.args.coordinator_programs),
                call=self.toolkit.call,
                start_lane=self._start_lane,
                deadline_s=node.args.relay_deadline_s,
            )
            book.on_done = self.seat.plan_done
        self.retention = retention = Retention(
            book,
            store,
            self.inbox,
            sessions,
            node.args.retention,
            forget=self.placer.forget,
            events=events,
        )
        ended = book.on_done  # the seat's, when there is one

        def on_done(plan: PlanRecord) -> None:
            ended(plan)
            retention.finished(plan)

        book.on_done = on_done

    @property
    def shards(self) -> dict[str, ShardView]:
        """The shards as the roster last told of them, by name (`coordinator.roster`)."""
        assert self.roster is not None
        return self.roster.shards

    def load(self) -> int:
        return 0 if self.book is None else len(self.book.active)

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
        assert self.store is not None and self.placer is not None
        await self.placer.close()
        self.store.close()
        if self.events is not None:
            self.events.close()

    def on_roster(self, changed: list[f.PeerState]) -> None:
        assert self.roster is not None
        self.roster.changed(changed)

    def _pump(self) -> None:
        """Place what is ready (`Placer.pump`)."""
        assert self.placer is not None
        self.placer.pump()

    def _starting(self) -> dict[str, asyncio.Future[None]]:
        """Lanes whose `LaneStart` is in flight (`Placer.starting`)."""
        assert self.placer is not None
        return self.placer.starting

    async def _lane_shard(self, lane: str) -> str | None:
        assert self.placer is not None
        return await self.placer.lane_shard(lane)

    # --- requests --------------------------------------------------------------------------------

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope[Serves]) -> None:
        assert self.node is not None and self.book is not None
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
            case f.InboxPut() if fenced := refusal(body, env.sender, self.book.plans):
                self.node.fenced += 1
                assert self.book is not None
                self.book.planstore.events.emit("lane.fenced", child=env.sender, detail=fenced)
                ep.reply(env, peer, f.Error(code=ErrorCode.FENCED, message=fenced))
            case f.InboxPut():
                if body.msg_id in self.inbox:
                    ep.reply(env, peer, f.InboxAck(msg_id=body.msg_id))
                else:  # stamped as it arrives: `bench reaction` times from here
                    put = msgspec.structs.replace(body, received_ns=time.monotonic_ns())
                    self.node.answer(ep, peer, env, self._commit_inbox(put))
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
                assert self.book is not None
                plans = self.book.plans.values()
                newest = sorted(plans, key=lambda p: p.submitted_at, reverse=True)
                ep.reply(env, peer, f.PlanList(plans=[self._summary(p) for p in newest]))
            case f.CtlCall():
                self.node.answer(ep, peer, env, self._call(body))
            case f.CtlBenchRelay():
                self.node.answer(ep, peer, env, self._bench(body))
            case f.CtlCancel():
                self.node.answer(ep, peer, env, self._cancel(body.lane))
            case f.CtlMessage():
                self.node.answer(ep, peer, env, self._message(body))
            case f.HitlRespond() if self.seat is not None and self.seat.asks(body.lane):
                self.node.answer(ep, peer, env, self.seat.respond(body))
            case f.HitlRespond() if self.answers is not None:
                self.node.answer(ep, peer, env, self.answers.respond(body))
            case f.ListPending() if self.answers is not None:
                asked = [] if self.seat is None else self.seat.pending()
                ep.reply(env, peer, f.LaneList(lanes=[*self.answers.pending().lanes, *asked]))
            case f.SandboxCreate():
                ep.reply(env, peer, NO_SANDBOX)
            case f.CtlPrune():
                assert self.retention is not None
                self.node.answer(ep, peer, env, self.retention.prune_now(dry_run=body.dry_run))
            case f.HitlRespond() | f.ListPending():  # no answers store: not served here
                ep.reply(env, peer, SERVES.unsupported(body))
            case _:
                assert_never(body)

    # --- the inbox -------------------------------------------------------------------------------

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
            assert self.book is not None
            self.inbox.add(put.msg_id, put, known=plan_of(put) in self.book.plans)
            assert self.placer is not None
            self.placer.ended(put)
            if self.held:  # committed and acknowledged; the next generation applies it
                self._unread.append(put)
            else:
                self._apply_put(put)
        else:
            await asyncio.shield(pending)
        return f.InboxAck(msg_id=put.msg_id)

    def _apply_put(self, put: f.InboxPut) -> None:
        """Act on one committed inbox message: a lane's result, a question its program asks a
        human, or a note it tells the coordinator. Idempotent: every start applies the whole
        inbox again."""
        assert self.book is not None
        if put.result is not None:
            self._apply(put.result, put.received_ns)
        elif put.pause is not None:
            plan = self.book.plans.get(put.pause.plan)
            if plan is not None and plan.pause_for_question(put.pause):
                log.info(
                    "plan %s: task %s asks a human: %s", plan.id, put.pause.task, put.pause.question
                )
                self.book.commit(plan)
        elif put.note is not None:
            if self.seat is not None:
                self.seat.note(put.note, put.msg_id)
            plan = self.book.plans.get(put.note.plan)
            if plan is not None and plan.note(put.note, put.msg_id):
                self.book.commit(plan)

    def _apply(self, result: f.LaneResult, received_ns: int | None = None) -> None:
        """Apply a lane's result to its plan (a stale one records at most its spend);
        `received_ns` is when its inbox message arrived (`InboxPut.received_ns`)."""
        assert self.book is not None and self.node is not None
        view = self.shards.get(result.shard)
        if view is not None:
            view.refused = False  # a lane ended there: it has room again
        plan = self.book.plans.get(result.plan)
        if plan is None:
            return
        applied, cancel, _ = plan.apply(result, time.time(), self.node.args.max_worker_loss)
        if applied:
            rec = plan.tasks[result.task]  # touched by `apply`: written with the rest
            rec.stamps_ns = (result.start_received_ns, received_ns)
            log.info("plan %s: task %s %s", plan.id, result.task, result.status)
        self.book.commit(plan, cancel)

    async def _submit(
        self, spec: f.PlanSpec, key: str | None = None, ticket: str | None = None
    ) -> f.Body:
        """Validate and durably record a plan, then start what is ready. With an idempotency
        `key` already used, nothing new happens and the earlier plan's id is the answer, once
        that plan is durable. A `ticket` is every task's first affinity ticket (`start_lane
        ticket=`). A big plan is checked off the loop (`coordinator.accept`).

        The plan is kept, and what is ready placed (of a task graph; a session starts once
        durable), before its record is durable, so that the record and the first placements
        share a commit (one fsync less on a lane's start, the
        reaction of ADR 0019) and a second submission of its key finds it at once (two at once
        made two plans while the first awaited its commit). No one hears of the plan before
        that commit: not its submitter (the answer waits for it), not a second submitter of
        its key (`_accepted`), not a shard (`Placer._send_start` waits for the placement's own
        durable write, queued behind the plan's). `ctl plans` may list it meanwhile."""
        assert self.store is not None and self.book is not None and self.node is not None
        book = self.book
        if key is not None and key in book.keys:
            return await self._accepted(book.keys[key])
        try:  # a full disk, or one short of its reserve, refuses new work in one clear line
            self.store.check_writable()
            assert self.reserve is not None
            self.reserve.check()
        except StateError as exc:
            raise RemoteError(ErrorCode.STATE_DEGRADED, str(exc)) from exc
        if spec.coordinator != DAG:
            assert self.seat is not None
            self.seat.check(spec)  # refused in one line when it cannot run here
        plan = await accept_off_loop(
            Submission(
                spec,
                plan_id=uuid.uuid4().hex[:12],
                submitted_at=time.time(),
                shards=list(self.shards.values()),
                programs=frozenset({SHELL, *self.node.args.lane_programs}),
                key=key,
                ticket=ticket,
            )
        )
        if key is not None and key in book.keys:  # the same key, accepted meanwhile
            return await self._accepted(book.keys[key])
        book.planstore.write(plan, new=True)
        book.add(plan)
        if len(plan.tasks) >= FREEZE_TASKS:
            gc.freeze()
        self.node.retitle()
        if spec.coordinator == DAG:
            log.info("plan %s (%s): %d tasks accepted", plan.id, spec.name, len(spec.tasks))
            book.schedule()  # the placements' writes queue behind the plan's record
        durable = book.accepting[plan.id] = book.planstore.write_durable(plan)
        durable.add_done_callback(lambda _: book.accepting.pop(plan.id, None))
        await asyncio.shield(durable)
        if spec.coordinator != DAG:
            # A session's program starts once its submitter can be answered, never before: a
            # program that ends the process in its first step must not take the answer along.
            assert self.seat is not None
            log.info("plan %s (%s): session of %s accepted", plan.id, spec.name, spec.coordinator)
            self.seat.started(plan)
            book.schedule()
        return f.PlanAccepted(id=plan.id)

    async def _accepted(self, plan_id: str) -> f.PlanAccepted:
        """The answer to a submission whose idempotency key plan `plan_id` holds: once that
        plan's record is durable."""
        assert self.book is not None
        pending = self.book.accepting.get(plan_id)
        if pending is not None:
            await asyncio.shield(pending)
        return f.PlanAccepted(id=plan_id)

    def _summary(self, plan: PlanRecord) -> f.PlanSummary:
        """`ctl plans`' line of `plan`: a session's counts its lanes (`Seat.summary`)."""
        if plan.spec.coordinator != DAG and self.seat is not None:
            return self.seat.summary(plan)
        return plan_summary(plan)

    async def _plan(self, req: f.CtlPlan) -> f.Body:
        assert self.book is not None
        plan = self.book.plans.get(req.id)
        if plan is None:
            raise RemoteError(
                ErrorCode.NOT_FOUND,
                f"no plan {req.id!r} (a finished plan is pruned after [retention] plans_s)",
            )
        if not plan.done and req.wait_s > 0:
            waiter = asyncio.get_running_loop().create_future()
            self.book.waiters.setdefault(plan.id, []).append(waiter)
            try:
                async with asyncio.timeout(req.wait_s):
                    await waiter
            except TimeoutError:
                pass
            finally:
                waiters = self.book.waiters.get(plan.id, [])
                if waiter in waiters:
                    waiters.remove(waiter)
        if plan.spec.coordinator != DAG:
            assert self.seat is not None
            return self.seat.report(plan)
        return await sliced_report(plan)

    async def _start_lane(self, params: tools.StartLane, grant: f.Budget | None = None) -> Any:
        """The `start_lane` tool (`coordinator.startlane`)."""
        assert self.book is not None
        return await start_lane(self.book, self._submit, params, grant)

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

    async def _cancel(self, lane: str) -> f.Body:
        """`ctl cancel`: the `cancel_lane` tool, so operators and policies share one path; a
        task that waits for a human with no lane (an approval, a review) is cancelled here."""
        assert self.toolkit is not None and self.book is not None
        if self.seat is not None and self.seat.cancel(lane):  # a session's plan id
            return f.Ack()
        for plan in list(self.book.active.values()):
            task_id = plan.waiting_on(lane)
            if task_id is not None and plan.tasks[task_id].status is TaskStatus.AWAITING_APPROVAL:
                rec = plan.set_status(task_id, TaskStatus.CANCELLED)
                rec.error, rec.pending = "cancelled", None
                self.book.commit(plan)
                return f.Ack()
        await self.toolkit.call("cancel_lane", {"lane": lane})
        return f.Ack()

    async def _message(self, req: f.CtlMessage) -> f.Body:
        """`ctl message PLAN TEXT`: an event in the inbox of session `req.plan`
        (`Seat.message`, which says what it refuses)."""
        assert self.seat is not None
        return await self.seat.message(req)

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
        assert self.seat is not None
        self.held = True
        self.seat.hold()
        try:
            async with asyncio.timeout(timeout_s):
                while self._starting() or self._committing or self.seat.inflight():
                    inflight = [*self._starting().values(), *self._committing.values()]
                    await asyncio.wait([*inflight, *self.seat.inflight()])
        except TimeoutError:
            self._resume()
            raise RemoteError(
                ErrorCode.TIMEOUT,
                f"{len(self._starting())} lane start(s) and {len(self._committing)} inbox "
                f"commit(s) still in flight after {timeout_s:g} s",
            ) from None
        assert self.book is not None
        waiting = sum(len(plan.ready()) for plan in self.book.active.values())
        return f.Quiesced(held=f"turns held, {waiting} ready task(s) wait for the next generation")

    def _resume(self) -> None:
        """Leave the quiet point (a rollover rolled back): apply what came in, then place."""
        assert self.book is not None
        self.held = False
        if self.seat is not None:
            self.seat.release()
        unread, self._unread = self._unread, []
        with self.book.batch():
            for put in unread:
                self._apply_put(put)
            self.book.schedule()
