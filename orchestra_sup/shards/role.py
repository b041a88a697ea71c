"""A worker-host shard: hosts at most `lanes_per_shard` lanes and reports what they did.

A lane (`shards.lane.Lane`) is registered (so `cancel` can find it) before its task is spawned,
then: ask the custodian for a sandbox (at the task's `rev` when it names one, else at the
workspace's head; `LaneResult.rev` says which commit), run the task's command there
(`shards.shell.run_shell`: own process group, output drained as it comes, the whole group killed
on timeout or cancel) or its program (`shards.program`), ask the custodian to commit when the
task says so, and hand the result to the durable outbox (`shards.outbox`), which sends it to the
coordinator until it is acknowledged.

In a rollover this process is one of two generations of its shard: the old one drains and hands
its lanes over, the new one resumes them (`LaneResume`, admitted like a start) and holds requests
for lanes still on their way. `shards.handover` does both sides, and says where a message, a
cancel or a human's answer for a lane goes (`Handover.route`) before it is delivered (a
message or an answer by `shards.messages`).

Every failed result says why as a `FailureClass` (`LaneResult.failure`): `timeout` (the task's
`timeout_s`), `budget_exhaustion` (the lane spent more than its grant, `LaneStart.budget`: the
shard's `BudgetWatch` stops it, `shards.spend`), the class its program gave, or `tool_failure`
(a command failed, a program raised, a sandbox or commit could not be had). Cancelled and
interrupted results carry none. Every result says what the lane spent (`LaneResult.spent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import assert_never

from orchestra_sup.errors import ErrorCode, OrchestraError, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.channel import Channel
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.protocol.patterns import SHELL
from orchestra_sup.runtime.node import Node
from orchestra_sup.shards.deadline import LeaseDeadline, kill_groups
from orchestra_sup.shards.handover import Handover
from orchestra_sup.shards.hitl import Questions
from orchestra_sup.shards.host import Host, LaneServices, lane_uid
from orchestra_sup.shards.lane import FINAL, Lane, LaneState
from orchestra_sup.shards.limits import LaneLimits
from orchestra_sup.shards.messages import deliver_answer, deliver_message, remove_inbox
from orchestra_sup.shards.outbox import DB as OUTBOX_DB
from orchestra_sup.shards.outbox import DELIVER_ON_STOP_S, Outbox, result_id
from orchestra_sup.shards.program import (
    LaneContext,
    Mailbox,
    Outcome,
    QuietPoints,
    checked,
    load_program,
)
from orchestra_sup.shards.spend import BudgetWatch
from orchestra_sup.shards.transcript import DBS as TRANSCRIPT_DBS
from orchestra_sup.shards.transcript import Transcript
from orchestra_sup.state.store import Store
from orchestra_sup.system.cgroups import tree_id
from orchestra_sup.system.isolation import describe
from orchestra_sup.system.lanecgroups import LaneCgroups
from orchestra_sup.system.lanecpu import LaneCpu

log = logging.getLogger(__name__)

CUSTODIAN_WAIT_S = 60.0
"""How long a lane waits for a custodian that is down (restarting) before it fails."""
CALL_TIMEOUT_S = 55.0
"""How long one call to the custodian (a sandbox, a commit) waits for its answer."""
ROOM_WAIT_MAX_S = 10.0
"""The longest pause between two asks for a sandbox while the state disk has no room."""
RETRY_S = 0.05
"""Pause before re-sending to a custodian the roster says is up again."""
LIVE_STATES = tuple(str(state) for state in LaneState if state not in FINAL)
"""The states a live lane can be in (starting, running, awaiting_approval, moving)."""
Serves = f.LaneRequest | f.Drain | f.LeaseHold
"""What a shard's `handle` takes: the lane plane's requests, and from its supervisor a drain
and, on a host, its lease's deadline."""
SERVES = Channel[Serves](Serves, "a shard does not serve {}")
STOPPED = "interrupted: the tree (or this shard) was stopped"
"""The error of a lane its shard's stop interrupted."""


class Shard:
    """The `shard` role. See the module docstring."""

    serves = SERVES
    from_hosts: tuple[type, ...] = ()  # a shard serves no hosts' port

    def __init__(self) -> None:
        self.node: Node | None = None
        self.store: Store | None = None
        self.transcript: Transcript | None = None  # lane transcripts, `ctl logs` (open())
        self.cgroups: LaneCgroups | None = None  # cgroup tracking of lane processes (open())
        self.deadline: LeaseDeadline | None = None  # a host's shard: its lease's deadline
        self.limits: LaneLimits | None = None  # lanes' memory and pids limits (open())
        self.cpu: LaneCpu | None = None  # lanes' CPU class, [cpu] lanes (open())
        self.lanes: dict[str, Lane] = {}
        self.outbox: Outbox | None = None  # results on their way to the coordinator (open())
        self.handover: Handover | None = None  # rollovers: this generation's side (open())
        self.budgets: BudgetWatch | None = None  # stops lanes that overspend (open())
        self.services: LaneServices | None = None  # what its lanes' hosts use (open())
        self._custodian_up = asyncio.Event()
        self._closing = False

    @property
    def capacity(self) -> int:
        assert self.node is not None
        return self.node.args.lanes_per_shard

    async def open(self, node: Node) -> None:
        self.node = node
        # Lane cgroups live under <tree>/<shard>.<generation>: the supervisor kills a dead
        # generation's subtree while the next generation starts its own beside it.
        tree, own = tree_id(node.paths.run_dir), f"{node.name}.{node.generation}"
        self.cgroups = LaneCgroups(tree, own)
        self.limits = LaneLimits(tree, own)
        self.limits.remove_all()
        self.cpu = await asyncio.to_thread(LaneCpu, node.args.lane_cpu, tree, own)
        isolation = node.args.isolation
        log.info(
            "%s: lanes run with isolation %s (limits: %s; CPU: %s, nice %d)",
            node.name,
            isolation.mode,
            ", ".join(self.limits.bases) or "rlimits only",
            self.cpu.layer,
            node.args.lane_nice,
        )
        self.store = Store(node.paths.state_dir / node.name, [OUTBOX_DB, *TRANSCRIPT_DBS])
        self.store.start()
        # --- transcripts: prune now and periodically (lost lanes are closed on settling)
        self.transcript = Transcript(self.store)
        await self.transcript.open(node.args.transcript_retention_s)
        args = node.args
        node.spawn(self.transcript.prune_every(args.transcript_retention_s, args.prune_every_s))
        # --- end transcripts
        self.outbox = Outbox(node, self.store)
        node.spawn(self.outbox.resend_loop())
        self.budgets = BudgetWatch(node.spawn)
        self.services = LaneServices(
            node, self.cgroups, self.limits, self.cpu, self.transcript, self.outbox, self.budgets
        )
        self.handover = Handover(
            node,
            self.lanes,
            self.transcript,
            self.outbox,
            serve=self.handle,
            end=self._end,
            info=self._info,
            lost=self._sandbox_done,
        )

    def load(self) -> int:
        return len(self.lanes)

    def _kill_lanes(self) -> None:
        """SIGKILL every lane's process group and cgroup now (blocking): the lease is over."""
        kill_groups([lane.pgid for lane in self.lanes.values() if lane.pgid is not None])
        if self.cgroups is not None:
            self.cgroups.kill_all_sync()

    def lanes_by_state(self) -> dict[str, int]:
        """Its lanes by state: every live state (zeros included, so a gauge falls back to 0
        rather than vanish), and a final one only while a lane in it is still held."""
        counts = dict.fromkeys(LIVE_STATES, 0)
        for lane in self.lanes.values():
            counts[lane.state] = counts.get(lane.state, 0) + 1
        return counts

    def inbox_depth(self) -> None:
        return None

    def outbox_depth(self) -> int:
        return self.outbox.depth() if self.outbox is not None else 0

    def persistence(self) -> Store | None:
        return self.store

    async def close(self) -> None:
        """Stop interrupts running lanes: SIGTERM to each command's group, SIGKILL after
        `shutdown_timeout_s` (a lane program with no command running is cancelled at once);
        each is recorded as interrupted (not failed) in the outbox, and
        sent to the coordinator while there is time (the supervisor gives a shard
        `shutdown_timeout_s + SHARD_STOP_MARGIN_S` before it kills it)."""
        assert self.node is not None
        self._closing = True
        tasks = [lane.task for lane in self.lanes.values() if lane.task is not None]
        for lane in self.lanes.values():
            lane.interrupted = True
            if lane.pgid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(lane.pgid, signal.SIGTERM)
            elif lane.mailbox is not None:
                lane.cancel()  # a program with no command running: nothing to wait for
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.node.args.lane_grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert self.outbox is not None
        await self.outbox.wait_sent(DELIVER_ON_STOP_S)
        if self.cgroups is not None:  # cgroup tracking: nothing of any lane outlives the shard
            self.cgroups.kill_all_sync()
        if self.limits is not None:
            self.limits.remove_all()
        if self.cpu is not None:
            self.cpu.remove()
        if self.transcript is not None:  # transcripts: reads in flight end before the store
            await self.transcript.close()
        assert self.store is not None
        self.store.close()

    def on_roster(self, changed: list[f.PeerState]) -> None:
        assert self.node is not None and self.outbox is not None and self.handover is not None
        for peer in changed:
            if peer.name == self.node.args.sandboxes:
                (self._custodian_up.set if peer.up else self._custodian_up.clear)()
            if peer.name == "coordinator" and peer.up:
                self.outbox.flush()
            if (
                peer.name == self.node.name
                and peer.generation == self.node.generation
                and not peer.draining
                and not self.handover.settled
            ):
                self.handover.settle()

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope[Serves]) -> None:
        assert self.handover is not None
        body = env.body
        match body:
            case f.LaneStart():
                ep.reply(env, peer, self._admit(body))
            case f.LaneResume():
                ep.reply(env, peer, self._admit_resumed(body.snapshot, env.gen))
            case f.Drain():
                self.handover.drain(ep, peer, env, body)
            case f.LeaseHold(stop_by=stop_by):
                if self.deadline is None:  # the first: this shard is a host's
                    assert self.node is not None
                    self.deadline = LeaseDeadline(self.node.name, self._kill_lanes)
                    self.node.spawn(self.deadline.run())
                self.deadline.hold(stop_by)
            case f.LaneCancel(lane=lane_id):
                lane = self.handover.route(ep, peer, env, lane_id)
                if lane is None:
                    return
                lane.cancel()
                ep.reply(env, peer, f.Ack())
            case f.ListLanes(results=False):
                ep.reply(
                    env, peer, f.LaneList(lanes=[self._info(lane) for lane in self.lanes.values()])
                )
            case f.ListLanes():
                assert self.node is not None
                self.node.answer(ep, peer, env, self.handover.lanes_and_results())
            case f.LaneMessage():
                lane = self.handover.route(ep, peer, env, body.lane)
                if lane is not None:
                    assert self.node is not None
                    deliver_message(self.node, self.transcript, lane, ep, peer, env, body)
            case f.HitlAnswer():
                lane = self.handover.route(ep, peer, env, body.lane)
                if lane is None:
                    return
                deliver_answer(self.transcript, lane, body)
                ep.reply(env, peer, f.Ack())
            case f.LaneLogs():  # transcripts: answered off the receive loop (memory, then LMDB)
                assert self.node is not None and self.transcript is not None
                work = self.transcript.read(
                    body.lane, after_seq=body.after_seq, limit=body.limit, wait_s=body.wait_s
                )
                self.node.answer(ep, peer, env, work)
            case _:
                assert_never(body)

    # --- lanes -----------------------------------------------------------------------------------

    def _refusal(self) -> f.Error | None:
        """Why a lane cannot be taken now (a start or a resumed lane), or None."""
        assert self.node is not None and self.store is not None and self.handover is not None
        if self._closing or self.handover.draining:
            # Stopping or drained: a lane placed here now would only be interrupted. Full, to
            # the coordinator, until this shard's next generation says otherwise.
            return f.Error(code=ErrorCode.SHARD_FULL, message=f"{self.node.name} is stopping")
        if self.store.degraded is not None:
            # A full disk stops new work (its result could not be made durable); the
            # coordinator places the lane elsewhere or later.
            return f.Error(code=ErrorCode.STATE_DEGRADED, message=str(self.store.degraded))
        if len(self.lanes) >= self.capacity:
            return f.Error(
                code=ErrorCode.SHARD_FULL,
                message=f"{self.node.name} is full ({self.capacity} lanes)",
            )
        return None

    def _admit(self, start: f.LaneStart) -> f.Body:
        assert self.outbox is not None
        if start.lane in self.lanes or self.outbox.holds(start.lane):
            return f.Ack()  # a re-sent start: the lane id is its idempotency key
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        assert self.node is not None
        lane = Lane(start)
        self.lanes[lane.id] = lane  # registered before it is spawned: a cancel always finds it
        if self.transcript is not None:  # transcripts: its rows start before anything can happen
            self.transcript.begin(lane.id)
            for warning in start.warnings:
                self.transcript.event(lane.id, f"warning: {warning}")
        self._watch(lane)
        lane.task = self.node.spawn(self._run(lane))
        self.node.retitle()
        return f.Ack()

    def _watch(self, lane: Lane) -> None:
        """Have a lane with a grant stopped when it overspends (`shards.spend`)."""
        assert self.budgets is not None
        if lane.start.budget is not None:
            self.budgets.watch(lane.id, lane.start.budget, lane.meter, lane.exhaust)

    def _admit_resumed(self, snapshot: f.LaneSnapshot, predecessor: int) -> f.Body:
        """Host a lane generation `predecessor` of this shard parked (`LaneResume`): admitted
        like a start (same refusals: `shard_full`, `state_degraded`), its id, transcript and
        unread messages kept; a lane already here is acknowledged again (the lane id is the
        idempotency key of the hand-over). Requests held for it are then served, in order."""
        lane_id = snapshot.start.lane
        if lane_id in self.lanes:
            return f.Ack()
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        assert self.node is not None and self.transcript is not None and self.handover is not None
        lane = Lane(snapshot.start, snapshot)
        self.lanes[lane_id] = lane
        self.transcript.resume(lane_id, snapshot.next_seq, time.time() - snapshot.elapsed_s)
        where = "from its last checkpoint" if snapshot.checkpoint is not None else "as parked"
        if snapshot.partial:
            where = "re-running its interrupted step"
        self.transcript.event(
            lane_id, f"resumed from generation {predecessor} of {self.node.name} {where}"
        )
        if snapshot.partial:
            lane.warnings.append(
                f"partial work: lane {lane_id} was stopped mid-step when generation "
                f"{predecessor} of {self.node.name} was drained for a rollover; "
                + (
                    "re-running its command"
                    if lane.quiet is None
                    else "resumed from its last checkpoint"
                )
            )
            self.transcript.event(lane_id, f"warning: {lane.warnings[-1]}")
        self._watch(lane)
        lane.task = self.node.spawn(self._run(lane))
        self.node.retitle()
        self.handover.arrived(lane_id)
        return f.Ack()

    def _info(self, lane: Lane) -> f.LaneInfo:
        assert self.node is not None
        question, since = lane.question or (None, None)
        return f.LaneInfo(
            lane=lane.id,
            task=lane.start.task.id,
            plan=lane.start.plan,
            shard=self.node.remote.sender(self.node.name),  # host-a/shard-0 on a host
            state=lane.state,
            sandbox=lane.sandbox,
            question=question,
            since=since,
        )

    async def _run(self, lane: Lane) -> None:
        """Run the lane to its end and deliver its result; or, when a drain stops it to hand it
        over (`lane.moving`), return with no result. A resumed lane keeps its sandbox, counts
        its time from its first start and its spend from what it had spent."""
        assert self.node is not None and self.services is not None
        spec = lane.start.task
        verdict: Outcome | None = None
        status, error, commit = f.ResultStatus.FAILED, None, None
        failure: f.FailureClass | None = f.FailureClass.TOOL_FAILURE
        host: Host | None = None
        lane.started = True
        try:
            if lane.cancel_requested:  # before this task's first step (`Lane.cancel`)
                raise asyncio.CancelledError
            program = load_program(spec.program, frozenset(self.node.args.lane_programs))
            if lane.sandbox is None:
                ready = await self._make_sandbox(lane.id, spec.rev)
                lane.sandbox, lane.rev = ready.path, ready.rev
                if self.transcript is not None:
                    what = spec.run if spec.program == SHELL else f"{spec.program} {spec.run}"
                    mode = self.node.args.isolation.mode
                    uid = await asyncio.to_thread(lane_uid, Path(ready.path))
                    at = "" if spec.rev is None else f" at {spec.rev} ({ready.rev})"
                    self.transcript.event(
                        lane.id, f"started in {ready.path}{at} ({describe(mode, uid)}): {what}"
                    )
            lane.enter(LaneState.RUNNING)
            host = Host(lane, self.services)
            context = LaneContext(
                lane.start,
                Path(lane.sandbox),
                host,
                mailbox=lane.mailbox or Mailbox(),
                quiet=lane.quiet or QuietPoints(),
                questions=lane.questions or Questions(),
            )
            if spec.program == SHELL:  # its command has the timeout, and kills its group
                verdict = await program.run(context)
            else:
                # The time earlier generations ran it counts; the time it waited for a human
                # does not (`Host.waiting` holds the deadline meanwhile).
                before = lane.resumed.spent.wall_s if lane.resumed is not None else 0.0
                limit = None if spec.timeout_s is None else max(0.0, spec.timeout_s - before)
                try:
                    async with asyncio.timeout(limit) as host.deadline:
                        verdict = checked(spec.program, await program.run(context))
                except TimeoutError:
                    verdict = Outcome(
                        status="failed",
                        error=f"timed out after {spec.timeout_s:g} s",
                        failure=f.FailureClass.TIMEOUT,
                    )
            if lane.moving:  # a program that swallowed the stop: it is handed over all the same
                return
            lane.finishing = True
            if lane.exhausted is not None:  # a program that swallowed the stop: it failed
                verdict = Outcome(
                    status="failed", error=lane.exhausted, failure=f.FailureClass.BUDGET_EXHAUSTION
                )
            status, error, failure = f.ResultStatus(verdict.status), verdict.error, verdict.failure
            if lane.interrupted:  # told to stop: even an exit 0 is not a finished step
                status, error = f.ResultStatus.INTERRUPTED, STOPPED
                failure = None
            if status is f.ResultStatus.SUCCEEDED and spec.commit:
                done = await self._custodian(
                    f.SandboxCommit(
                        lane=lane.id,
                        message=(
                            f"{lane.start.plan_name}/{spec.id}: "
                            f"lane {lane.id} of plan {lane.start.plan}"
                        ),
                        fence=lane.start.fence,
                    )
                )
                assert isinstance(done, f.CommitDone)
                commit = done.commit
        except asyncio.CancelledError:
            if lane.moving:  # stopped by a drain: it is handed over, not ended
                return
            failure = None
            if lane.exhausted is not None:
                status, error = f.ResultStatus.FAILED, lane.exhausted
                failure = f.FailureClass.BUDGET_EXHAUSTION
            elif lane.interrupted:
                status, error = f.ResultStatus.INTERRUPTED, STOPPED
            else:
                status, error = f.ResultStatus.CANCELLED, "cancelled by request"
        except OrchestraError as exc:  # a `ProgramError` too: refused, or no valid Outcome
            status, error = f.ResultStatus.FAILED, str(exc)
        except OSError as exc:  # the command could not be spawned (its sandbox is gone, ...)
            status, error = f.ResultStatus.FAILED, f"cannot run the command: {exc}"
        except Exception as exc:  # a lane program's bug fails its lane, never the shard
            log.exception("lane %s: program %s raised", lane.id, spec.program)
            status, error = f.ResultStatus.FAILED, f"program {spec.program} raised {exc!r}"
        finally:
            if host is not None:
                host.close()
        exit_code = verdict.exit_code if verdict is not None else None
        if status is not f.ResultStatus.FAILED:
            failure = None
        await self._end(lane, status, error, exit_code=exit_code, commit=commit, failure=failure)

    async def _end(
        self,
        lane: Lane,
        status: f.ResultStatus,
        error: str | None,
        *,
        exit_code: int | None = None,
        commit: str | None = None,
        failure: f.FailureClass | None = None,
    ) -> None:
        """Record how `lane` ended (its last transcript row) and deliver its result, with
        `failure` when it failed (None: `tool_failure`) and what it spent."""
        assert self.node is not None and self.outbox is not None and self.budgets is not None
        self.budgets.unwatch(lane.id)
        if status is f.ResultStatus.FAILED and failure is None:
            failure = f.FailureClass.TOOL_FAILURE
        result = f.LaneResult(
            lane=lane.id,
            plan=lane.start.plan,
            task=lane.start.task.id,
            shard=self.node.remote.sender(self.node.name),  # host-a/shard-0 on a host
            status=status,
            exit_code=exit_code,
            duration_s=round(time.monotonic() - lane.began, 3),
            output_tail=lane.tail.decode(errors="replace"),
            sandbox=lane.sandbox,
            commit=commit,
            error=error,
            warnings=lane.warnings,
            failure=failure,
            spent=lane.meter.spent(),
            rev=lane.rev,
            start_received_ns=lane.start_received_ns,
            fence=lane.start.fence,
        )
        lane.enter(LaneState(status))
        if self.transcript is not None:  # transcripts: the last row, then the finished entry
            self.transcript.end(lane.id, _end_event(result))
        # The slot is free before the result can leave: the outbox may send it before its own
        # write lands (`Outbox.flush`), and a coordinator that has the result places the next
        # lane here. Were the lane still counted, that start would be refused `shard_full`, and
        # the coordinator would not offer this shard another lane until one of its lanes ended.
        # A start re-sent for it is still known: `deliver` holds the result from its first line.
        self.lanes.pop(lane.id, None)
        self.node.retitle()
        await self.outbox.deliver(f.InboxPut(msg_id=result_id(lane.id), result=result))
        self.node.spawn(remove_inbox(self.node.paths.state_dir, lane))
        if lane.sandbox is not None:  # kept [retention] sandboxes_s from now, then removed
            self.node.spawn(self._sandbox_done(lane.id))

    async def _sandbox_done(self, lane: str) -> None:
        """Tell the sandboxes' maker lane `lane` ended (`custodian.sandboxes`); one it does not
        hear of keeps the sandbox."""
        with contextlib.suppress(OrchestraError):
            await self._custodian(f.SandboxDone(lane=lane))

    async def _make_sandbox(self, lane: str, rev: str | None) -> f.SandboxReady:
        """Lane `lane`'s sandbox from its maker. While the state disk has no room for one
        (`state_degraded`) it is asked again, after 1 s doubling to `ROOM_WAIT_MAX_S`, for as
        long as that lasts: a task the tree accepted waits for room instead of failing (issue
        22), as the stores wait for a commit. A cancel of the lane ends the wait."""
        delay = 1.0
        while True:
            try:
                ready = await self._custodian(f.SandboxCreate(lane=lane, rev=rev))
            except RemoteError as exc:
                if exc.code is not ErrorCode.STATE_DEGRADED:
                    raise
                if delay == 1.0 and self.transcript is not None:
                    self.transcript.event(lane, f"waiting for room for its sandbox: {exc.message}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, ROOM_WAIT_MAX_S)
                continue
            assert isinstance(ready, f.SandboxReady)
            return ready

    async def _custodian(self, body: f.Body) -> f.Body:
        """Call the custodian (on a host, its mirror: `ChildArgs.sandboxes`), waiting (up to
        `CUSTODIAN_WAIT_S`) while it is down."""
        assert self.node is not None
        custodian = self.node.args.sandboxes
        deadline = time.monotonic() + CUSTODIAN_WAIT_S
        while True:
            try:
                return await self.node.call(custodian, body, timeout_s=CALL_TIMEOUT_S)
            except PeerDown:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                # The roster, not this (possibly stale) failure, says whether it is down: a
                # custodian forked back in milliseconds may be up again before this task runs.
                if self.node.peer_up(custodian):
                    await asyncio.sleep(RETRY_S)
                    continue
                try:
                    async with asyncio.timeout(remaining):
                        await self._custodian_up.wait()
                except TimeoutError:
                    raise PeerDown(custodian) from None


def _end_event(result: f.LaneResult) -> str:
    """A lane's last transcript row: "<status>: <how it ended>", e.g. "succeeded: exited with
    status 0", "failed: exited with status 3", "cancelled: cancelled by request"."""
    if result.status == f.ResultStatus.SUCCEEDED:
        text = "succeeded"
        if result.exit_code is not None:
            text = f"succeeded: exited with status {result.exit_code}"
        return f"{text}; committed {result.commit}" if result.commit else text
    error = result.error or "no error recorded"
    return error if error.startswith(f"{result.status}:") else f"{result.status}: {error}"
