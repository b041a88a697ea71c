"""A worker-host shard: hosts at most `lanes_per_shard` lanes and reports what they did.

A lane is registered (so `cancel` can find it) before its task is spawned, then: ask the custodian
for a sandbox, run the task's command there (`shards.shell.run_shell`: own process group, output
drained as it comes, the whole group killed on timeout or cancel), ask the custodian to commit when
the task says so, and hand the result to the outbox.

The outbox is durable (ARCHITECTURE.md §5, invariant 8): a result is committed to this shard's LMDB
before it is sent, and dropped only when the coordinator acknowledges it, which it does after its
own commit. Until then it is re-sent whenever the coordinator comes (back) up and every
`RESEND_S` seconds; the message id is derived from the lane id, so the coordinator de-duplicates.

Rollovers (ARCHITECTURE.md §9). Generation g+1 of a shard starts beside g (the surge) and opens the
same LMDB environment. g is sent `Drain`: it admits nothing more, and each lane either finishes on
g (a shell lane whose command runs to its end, any lane that ends by itself: "finished"), or is
parked at its next quiet point and handed over (`LaneResume` with a `LaneSnapshot`, to its own
name, which the roster now resolves to g+1: "moved"), or, still not quiet after the drain timeout,
is stopped (its command's group gets SIGTERM, then SIGKILL after `lane_grace_s`) and handed over to
re-run its step with a partial-work warning ("partial"). Quiet points: a lane still waiting for
its sandbox; a program lane suspended in `recv` or `checkpoint` (`shards.program`). A shell lane
whose command runs is never quiet: it finishes on g, or is stopped at the timeout. `Drained` lists
every lane with how it went and how long it took, once no lane is left and the outbox has been
sent (what is not acknowledged within `DELIVER_ON_STOP_S` stays in the durable outbox).

Requests for a lane in motion are neither lost nor applied twice (the idempotency keys travel in
the snapshot). On g, a message or cancel for a lane being handed over is held and forwarded to
g+1 once it has the lane; one for a lane already handed over is forwarded at once (the reply is
g+1's). The coordinator addresses the roster's generation, g+1, before the lanes get there: until
g+1 has *settled* (the roster shows it with no draining predecessor), a request for a lane it
does not have is held (at most `HELD_MAX`, then `busy`) and served when the lane arrives; once
settled, what is still held is answered `not_found`.

Settling is also when g+1 closes as lost the transcripts of lanes no generation runs any more and
adopts the rows its predecessor left in the outbox: never before, since the predecessor's live
lanes are unfinished and its outbox is still its own. A shard that simply (re)starts settles on its
first roster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from orchestra_sup.errors import (
    CallTimeout,
    ErrorCode,
    OrchestraError,
    PeerDown,
    RelayError,
    RemoteError,
    StateError,
)
from orchestra_sup.node.runtime import Node
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.shards.cgroup import LaneCgroups, tree_id
from orchestra_sup.shards.program import (
    MAILBOX_SIZE,
    SHELL,
    LaneContext,
    Mailbox,
    Outcome,
    ProgramError,
    QuietPoints,
    checked,
    load_program,
)
from orchestra_sup.shards.shell import ShellOutcome, run_shell
from orchestra_sup.shards.transcript import DBS as TRANSCRIPT_DBS
from orchestra_sup.shards.transcript import Transcript
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

RESEND_S = 2.0
DELIVER_ON_STOP_S = 2.0
"""How long a stopping shard waits for the coordinator to acknowledge the lanes it interrupted;
what is not acknowledged by then waits in the durable outbox for the next generation."""
TAIL_BYTES = 4096
CUSTODIAN_WAIT_S = 60.0
"""How long a lane waits for a custodian that is down (restarting) before it fails."""
CALL_TIMEOUT_S = 55.0
RETRY_S = 0.05
"""Pause before re-sending to a custodian the roster says is up again."""
MESSAGE_MAX_BYTES = 64 * 1024
"""The largest `message_lane` text (UTF-8 bytes): a lane's mailbox then holds at most 64 MiB."""
MESSAGE_KEYS = 4096
"""Idempotency keys remembered per lane: a re-send of any of its last 4,096 messages is caught."""
HELD_MAX = MAILBOX_SIZE
"""Requests held for lanes on their way here (or for one lane being handed over) at most."""
HANDOVER_S = 2.0
"""How long a drain keeps offering a parked lane to the next generation (`LaneResume` is
idempotent by lane id, so an unanswered offer is made again)."""
DRAIN_KILL_S = 1.0
"""Seconds a command stopped at the drain timeout has between SIGTERM and SIGKILL (at most
`lane_grace_s`): the supervisor waits for `Drained` only a few seconds past the timeout."""

ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")
"""Variables a lane command inherits from the shard; everything else is scrubbed."""


class Lane:
    """One lane's record in its shard: what it runs and where it stands."""

    def __init__(self, start: f.LaneStart, snapshot: f.LaneSnapshot | None = None):
        self.start = start
        self.id = start.lane
        self.state = "starting"
        self.sandbox: str | None = None if snapshot is None else snapshot.sandbox
        self.task: asyncio.Task[None] | None = None
        self.cancel_requested = False
        self.pgid: int | None = None
        self.interrupted = False
        self.message_keys: dict[str, None] | None = None
        """The idempotency keys of its last `MESSAGE_KEYS` messages, oldest first (made by the
        first message: parked lanes are many)."""
        self.inbox_lock: asyncio.Lock | None = None  # made by the first inbox-file append
        self.tail = bytearray()
        self.mailbox: Mailbox | None = None
        """A program's `recv` reads it; a shell command reads its inbox file instead."""
        self.quiet: QuietPoints | None = None  # a program's quiet points and last checkpoint
        if start.task.program != SHELL:
            self.mailbox = Mailbox(snapshot.mailbox if snapshot is not None else None)
            self.quiet = QuietPoints(snapshot.checkpoint if snapshot is not None else None)
        self.resumed = snapshot
        """The snapshot it was resumed from (another generation ran it before), or None."""
        if snapshot is not None and snapshot.message_keys:
            self.message_keys = dict.fromkeys(snapshot.message_keys)
        self.finishing = False  # its program has returned: it ends here, whatever drains
        self.moving = False  # a drain stopped it to hand it over: it reports no result
        self.held: list[tuple[Endpoint, bytes | None, f.Envelope]] | None = None
        """Requests for it while it is handed over (None when it is not), in arrival order."""
        self.warnings: list[str] = []  # for its result (a partial-work warning)
        self.began = time.monotonic() - (snapshot.elapsed_s if snapshot is not None else 0.0)
        """When it started (monotonic seconds), counting the time other generations ran it."""

    def parked_now(self) -> bool:
        """At a quiet point: still waiting for its sandbox, or a program suspended in `recv`
        or `checkpoint`."""
        if self.state == "starting":
            return True
        return self.quiet is not None and self.quiet.quiet and not self.finishing

    def spawned(self, pgid: int) -> None:
        """The lane's command runs as process group `pgid` (for a graceful SIGTERM on stop)."""
        self.pgid = pgid

    def output(self, _stream: str, chunk: bytes) -> None:
        """Keep the last `TAIL_BYTES` of the command's output as it comes, so a lane that is
        cancelled mid-run still reports what it printed."""
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - TAIL_BYTES)]


class Shard:
    """The `shard` role. See the module docstring."""

    def __init__(self) -> None:
        self.node: Node | None = None
        self.store: Store | None = None
        self.transcript: Transcript | None = None  # lane transcripts, `ctl logs` (open())
        self.cgroups: LaneCgroups | None = None  # cgroup tracking of lane processes (open())
        self.lanes: dict[str, Lane] = {}
        self.outbox: dict[str, f.InboxPut] = {}
        self._sending_tasks: dict[str, asyncio.Task[None]] = {}
        self._custodian_up = asyncio.Event()
        self._closing = False
        self._settled = False  # the only generation of this name (see the module docstring)
        self._drain: asyncio.Future[f.Body] | None = None  # Drained, once drained
        self._awaiting: dict[str, list[tuple[Endpoint, bytes | None, f.Envelope]]] = {}
        """Requests for lanes this shard does not have, held until it settles."""
        self._moved: set[str] = set()  # lanes handed over to the next generation
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(f.InboxPut)

    @property
    def capacity(self) -> int:
        assert self.node is not None
        return self.node.args.lanes_per_shard

    async def open(self, node: Node) -> None:
        self.node = node
        # Lane cgroups live under <tree>/<shard>.<generation>: the supervisor kills a dead
        # generation's subtree while the next generation starts its own beside it.
        self.cgroups = LaneCgroups(tree_id(node.paths.run_dir), f"{node.name}.{node.generation}")
        self.store = Store(node.paths.state_dir / node.name, ["outbox", *TRANSCRIPT_DBS])
        self.store.start()
        # --- transcripts: prune now and periodically (lost lanes are closed on settling)
        self.transcript = Transcript(self.store)
        await self.transcript.open(node.args.transcript_retention_s)
        node.spawn(self.transcript.prune_every(node.args.transcript_retention_s))
        # --- end transcripts
        node.spawn(self._resend_loop())

    def load(self) -> int:
        return len(self.lanes)

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
            elif lane.mailbox is not None and lane.task is not None:
                lane.task.cancel()  # a program with no command running: nothing to wait for
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.node.args.lane_grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        pending = [self._sending_tasks[m] for m in list(self._sending_tasks)]
        if pending:
            await asyncio.wait(pending, timeout=DELIVER_ON_STOP_S)
        if self.cgroups is not None:  # cgroup tracking: nothing of any lane outlives the shard
            self.cgroups.kill_all_sync()
        if self.transcript is not None:  # transcripts: reads in flight end before the store
            await self.transcript.close()
        assert self.store is not None
        self.store.close()

    def on_roster(self, changed: list[f.PeerState]) -> None:
        assert self.node is not None
        for peer in changed:
            if peer.name == "custodian":
                (self._custodian_up.set if peer.up else self._custodian_up.clear)()
            if peer.name == "coordinator" and peer.up:
                self._flush_outbox()
            if (
                peer.name == self.node.name
                and peer.generation == self.node.generation
                and not peer.draining
                and not self._settled
            ):
                self._settle()

    def _settle(self) -> None:
        """This generation is the only one of its name now (the roster shows no draining
        predecessor): requests held for lanes that never came are answered (`not_found`), and
        off the loop, a gone generation's unfinished transcripts are closed as lost and the
        rows it left in the outbox are adopted and sent."""
        assert self.node is not None and self.transcript is not None
        self._settled = True
        held, self._awaiting = self._awaiting, {}
        for requests in held.values():
            for ep, peer, env in requests:
                self.handle(ep, peer, env)
        self.node.spawn(self.transcript.close_lost())
        self.node.spawn(self._adopt_outbox())

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        body = env.body
        match body:
            case f.LaneStart():
                ep.reply(env, peer, self._admit(body))
            case f.LaneResume():
                ep.reply(env, peer, self._admit_resumed(body.snapshot, env.gen))
            case f.Drain():
                assert self.node is not None
                if self._drain is None:
                    answer_by = time.monotonic() + (env.ttl_s or body.timeout_s) - RETRY_S
                    self._drain = asyncio.ensure_future(self._drain_lanes(body, answer_by))
                self.node.answer(ep, peer, env, _shielded(self._drain))
            case f.LaneCancel(lane=lane_id):
                lane = self._route(ep, peer, env, lane_id)
                if lane is None:
                    return
                assert lane.task is not None
                lane.cancel_requested = True
                lane.task.cancel()
                ep.reply(env, peer, f.Ack())
            case f.ListLanes(results=False):
                ep.reply(
                    env, peer, f.LaneList(lanes=[self._info(lane) for lane in self.lanes.values()])
                )
            case f.ListLanes():
                assert self.node is not None
                self.node.answer(ep, peer, env, self._lanes_and_results())
            case f.LaneMessage():
                if self._route(ep, peer, env, body.lane) is not None:
                    self._message(ep, peer, env, body)
            case f.LaneLogs():  # transcripts: answered off the receive loop (memory, then LMDB)
                assert self.node is not None and self.transcript is not None
                work = self.transcript.read(
                    body.lane, after_seq=body.after_seq, limit=body.limit, wait_s=body.wait_s
                )
                self.node.answer(ep, peer, env, work)
            case _:
                ep.reply(
                    env,
                    peer,
                    f.Error(
                        code=ErrorCode.UNEXPECTED,
                        message=f"a shard does not serve {type(body).__name__}",
                    ),
                )

    # --- lanes -----------------------------------------------------------------------------------

    def _refusal(self) -> f.Error | None:
        """Why a lane cannot be taken now (a start or a resumed lane), or None."""
        assert self.node is not None and self.store is not None
        if self._closing or self._drain is not None:
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
        if start.lane in self.lanes or f"result:{start.lane}" in self.outbox:
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
        lane.task = self.node.spawn(self._run(lane))
        return f.Ack()

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
        assert self.node is not None and self.transcript is not None
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
        lane.task = self.node.spawn(self._run(lane))
        for ep, peer, env in self._awaiting.pop(lane_id, []):
            self.handle(ep, peer, env)
        return f.Ack()

    def _route(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope, lane_id: str
    ) -> Lane | None:
        """The live lane a message or cancel is for, or None when the request was dealt with
        here: held (the lane is being handed over, or may be on its way here), forwarded (it
        was handed over) or refused (`not_found`; `busy` past `HELD_MAX` held requests)."""
        assert self.node is not None
        lane = self.lanes.get(lane_id)
        if lane is not None and lane.held is None:
            return lane
        if lane is None and lane_id in self._moved:
            self.node.answer(ep, peer, env, self._forward(env))
            return None
        if lane is not None:
            held = lane.held
            full = len(held) >= HELD_MAX
        elif not self._settled:
            held = self._awaiting.setdefault(lane_id, [])
            full = sum(map(len, self._awaiting.values())) >= HELD_MAX
        else:
            message = f"no live lane {lane_id!r} on this shard"
            ep.reply(env, peer, f.Error(code=ErrorCode.NOT_FOUND, message=message))
            return None
        if full:
            message = f"lane {lane_id} is moving between generations; try again shortly"
            ep.reply(env, peer, f.Error(code=ErrorCode.BUSY, message=message))
        else:
            held.append((ep, peer, env))
        return None

    async def _forward(self, env: f.Envelope) -> f.Body:
        """`env`'s request, answered by this shard's next generation (it has the lane now)."""
        assert self.node is not None
        return await self.node.call(self.node.name, env.body, timeout_s=env.ttl_s or CALL_TIMEOUT_S)

    def _message(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope, msg: f.LaneMessage
    ) -> None:
        """Deliver a message to a live lane: one line appended to its inbox file
        (`$ORCHESTRA_INBOX`) and an event row in its transcript. The idempotency key is claimed
        here, on the loop, before anything is awaited, so a re-sent message can never be
        delivered twice; messages to one lane are written in order, off the loop."""
        assert self.node is not None
        lane = self.lanes[msg.lane]  # `_route` found it
        if len(msg.text.encode()) > MESSAGE_MAX_BYTES:
            ep.reply(
                env,
                peer,
                f.Error(
                    code=ErrorCode.BAD_REQUEST,
                    message=f"a message is at most {MESSAGE_MAX_BYTES} bytes",
                ),
            )
            return
        if lane.message_keys is not None and msg.key in lane.message_keys:
            ep.reply(env, peer, f.MessageAck(lane=lane.id, key=msg.key, duplicate=True))
            return
        if lane.mailbox is not None and lane.mailbox.full():
            ep.reply(
                env,
                peer,
                f.Error(
                    code=ErrorCode.BUSY,
                    message=f"lane {lane.id}'s mailbox is full ({MAILBOX_SIZE} unread messages)",
                ),
            )
            return
        if lane.message_keys is None:
            lane.message_keys = {}
        lane.message_keys[msg.key] = None
        if len(lane.message_keys) > MESSAGE_KEYS:  # a re-send comes soon after its timeout
            del lane.message_keys[next(iter(lane.message_keys))]
        if self.transcript is not None:
            self.transcript.event(lane.id, f"message ({msg.key}): {msg.text}")
        if lane.mailbox is not None:
            lane.mailbox.put_nowait(msg.text)
            ep.reply(env, peer, f.MessageAck(lane=lane.id, key=msg.key, duplicate=False))
            return
        inbox = self._inbox(lane.id)

        async def deliver() -> f.Body:
            if lane.inbox_lock is None:
                lane.inbox_lock = asyncio.Lock()
            async with lane.inbox_lock:
                await asyncio.to_thread(_append_line, inbox, msg.text)
            return f.MessageAck(lane=lane.id, key=msg.key, duplicate=False)

        self.node.answer(ep, peer, env, deliver())

    def _inbox(self, lane: str) -> Path:
        assert self.node is not None
        return self.node.paths.state_dir / "inboxes" / lane

    def _info(self, lane: Lane) -> f.LaneInfo:
        assert self.node is not None
        return f.LaneInfo(
            lane=lane.id,
            task=lane.start.task.id,
            plan=lane.start.plan,
            shard=self.node.name,
            state=lane.state,
            sandbox=lane.sandbox,
        )

    async def _run(self, lane: Lane) -> None:
        """Run the lane to its end and deliver its result; or, when a drain stops it to hand it
        over (`lane.moving`), return with no result. A resumed lane keeps its sandbox and counts
        its time from its first start."""
        assert self.node is not None
        before = lane.resumed.elapsed_s if lane.resumed is not None else 0.0
        spec = lane.start.task
        verdict: Outcome | None = None
        status, error, commit = "failed", None, None
        try:
            program = load_program(spec.program, frozenset(self.node.args.lane_programs))
            if lane.sandbox is None:
                ready = await self._custodian(f.SandboxCreate(lane=lane.id))
                assert isinstance(ready, f.SandboxReady)
                lane.sandbox = ready.path
                if self.transcript is not None:
                    what = spec.run if spec.program == SHELL else f"{spec.program} {spec.run}"
                    self.transcript.event(lane.id, f"started in {ready.path}: {what}")
            lane.state = "running"
            context = LaneContext(
                lane.start,
                Path(lane.sandbox),
                exec_fn=lambda command, timeout_s: self._exec(lane, command, timeout_s),
                emit_fn=self._emitter(lane),
                mailbox=lane.mailbox or Mailbox(),
                quiet=lane.quiet or QuietPoints(),
            )
            if spec.program == SHELL:  # its command has the timeout, and kills its group
                verdict = await program.run(context)
            else:
                limit = None if spec.timeout_s is None else max(0.0, spec.timeout_s - before)
                try:
                    async with asyncio.timeout(limit):
                        verdict = checked(spec.program, await program.run(context))
                except TimeoutError:
                    verdict = Outcome(
                        status="failed", error=f"timed out after {spec.timeout_s:g} s"
                    )
            if lane.moving:  # a program that swallowed the stop: it is handed over all the same
                return
            lane.finishing = True
            status, error = verdict.status, verdict.error
            if lane.interrupted:  # told to stop: even an exit 0 is not a finished step
                status, error = "interrupted", "interrupted: the tree (or this shard) was stopped"
            if status == "succeeded" and spec.commit:
                done = await self._custodian(
                    f.SandboxCommit(
                        lane=lane.id,
                        message=(
                            f"{lane.start.plan_name}/{spec.id}: "
                            f"lane {lane.id} of plan {lane.start.plan}"
                        ),
                    )
                )
                assert isinstance(done, f.CommitDone)
                commit = done.commit
        except asyncio.CancelledError:
            if lane.moving:  # stopped by a drain: it is handed over, not ended
                return
            if lane.interrupted:
                status, error = "interrupted", "interrupted: the tree (or this shard) was stopped"
            else:
                status, error = "cancelled", "cancelled by request"
        except (OrchestraError, ProgramError) as exc:
            status, error = "failed", str(exc)
        except OSError as exc:  # the command could not be spawned (its sandbox is gone, ...)
            status, error = "failed", f"cannot run the command: {exc}"
        except Exception as exc:  # a lane program's bug fails its lane, never the shard
            log.exception("lane %s: program %s raised", lane.id, spec.program)
            status, error = "failed", f"program {spec.program} raised {exc!r}"
        exit_code = verdict.exit_code if verdict is not None else None
        await self._end(lane, status, error, exit_code=exit_code, commit=commit)

    async def _end(
        self,
        lane: Lane,
        status: str,
        error: str | None,
        *,
        exit_code: int | None = None,
        commit: str | None = None,
    ) -> None:
        """Record how `lane` ended (its last transcript row) and deliver its result."""
        assert self.node is not None
        result = f.LaneResult(
            lane=lane.id,
            plan=lane.start.plan,
            task=lane.start.task.id,
            shard=self.node.name,
            status=status,  # type: ignore[arg-type]
            exit_code=exit_code,
            duration_s=round(time.monotonic() - lane.began, 3),
            output_tail=lane.tail.decode(errors="replace"),
            sandbox=lane.sandbox,
            commit=commit,
            error=error,
            warnings=lane.warnings,
        )
        lane.state = status
        if self.transcript is not None:  # transcripts: the last row, then the finished entry
            self.transcript.end(lane.id, _end_event(result))
        try:
            await self._deliver(result)
        finally:
            self.lanes.pop(lane.id, None)  # the slot is free even if the outbox write failed

    async def _exec(self, lane: Lane, command: str, timeout_s: float | None) -> ShellOutcome:
        """One command of `lane` (`LaneContext.exec`). It joins the lane's cgroup before exec;
        whatever is left in it when the command ends (setsid'ed or double-forked daemons) is
        killed."""
        assert self.node is not None and self.cgroups is not None and lane.sandbox is not None
        cgroup = self.cgroups.create(lane.id)
        try:
            return await run_shell(
                command,
                cwd=Path(lane.sandbox),
                env=self._lane_env(lane),
                timeout_s=timeout_s,
                on_output=self._on_output(lane),
                tail_bytes=TAIL_BYTES,
                preexec=LaneCgroups.join_fn(cgroup) if cgroup is not None else None,
                on_spawn=lane.spawned,
                nice=self.node.args.lane_nice,
            )
        finally:
            lane.pgid = None  # no command runs any more: a stop need not wait for this lane
            await self.cgroups.kill(lane.id)
            if lane.moving:  # a drain stopped the command to hand the lane over
                raise asyncio.CancelledError

    def _emitter(self, lane: Lane) -> Callable[[str], None]:
        """`LaneContext.emit`: a line of the lane's own output, as if it printed it."""
        on_output = self._on_output(lane)

        def emit(text: str) -> None:
            on_output("stdout", text.encode() + b"\n")

        return emit

    def _on_output(self, lane: Lane) -> Callable[[str, bytes], None]:
        """What `run_shell` calls with each chunk: the lane's tail, and one transcript row."""
        transcript = self.transcript

        def on_output(stream: str, chunk: bytes) -> None:
            lane.output(stream, chunk)
            if transcript is not None:
                transcript.output(lane.id, stream, chunk)

        return on_output

    def _lane_env(self, lane: Lane) -> dict[str, str]:
        env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(
            ORCHESTRA_LANE=lane.id,
            ORCHESTRA_PLAN=lane.start.plan,
            ORCHESTRA_TASK=lane.start.task.id,
            ORCHESTRA_ATTEMPT=str(lane.start.attempt),
            ORCHESTRA_PYTHON=sys.executable,
            ORCHESTRA_INBOX=str(self._inbox(lane.id)),
        )
        return env

    async def _custodian(self, body: f.Body) -> f.Body:
        """Call the custodian, waiting (up to `CUSTODIAN_WAIT_S`) while it is down."""
        assert self.node is not None
        deadline = time.monotonic() + CUSTODIAN_WAIT_S
        while True:
            try:
                return await self.node.call("custodian", body, timeout_s=CALL_TIMEOUT_S)
            except PeerDown:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                # The roster, not this (possibly stale) failure, says whether it is down: a
                # custodian forked back in milliseconds may be up again before this task runs.
                if self.node.peer_up("custodian"):
                    await asyncio.sleep(RETRY_S)
                    continue
                try:
                    async with asyncio.timeout(remaining):
                        await self._custodian_up.wait()
                except TimeoutError:
                    raise PeerDown("custodian") from None

    # --- rollover: the old generation drains -----------------------------------------------------

    async def _drain_lanes(self, req: f.Drain, answer_by: float) -> f.Body:
        """`Drain`: hand every lane over (see the module docstring) and say how each went, by
        `answer_by` (monotonic seconds: the request's deadline): lanes get `req.timeout_s` to
        reach a quiet point, a stopped command `DRAIN_KILL_S` more, a hand-over `HANDOVER_S`,
        the outbox `DELIVER_ON_STOP_S`, each cut short at `answer_by`. Runs once; a repeated
        `Drain` is answered with the same `Drained`."""
        assert self.node is not None
        log.info(
            "%s: draining %d lanes to generation %d (timeout %g s)",
            self.node.name,
            len(self.lanes),
            req.successor_gen,
            req.timeout_s,
        )
        deadline = time.monotonic() + req.timeout_s
        moves = await asyncio.gather(
            *(self._drain_lane(lane, deadline, answer_by) for lane in list(self.lanes.values()))
        )
        self._flush_outbox()
        pending = list(self._sending_tasks.values())
        left = min(DELIVER_ON_STOP_S, answer_by - time.monotonic())
        if pending and left > 0:
            await asyncio.wait(pending, timeout=left)
        return f.Drained(lanes=list(moves))

    async def _drain_lane(self, lane: Lane, deadline: float, answer_by: float) -> f.LaneMove:
        """Bring `lane` to an end here or to the next generation (`Drain`)."""
        assert lane.task is not None
        began = time.monotonic()
        task = lane.task
        if not lane.parked_now():
            waits: list[asyncio.Future[Any]] = [task]
            if lane.quiet is not None:
                waits.append(lane.quiet.request())
            await asyncio.wait(
                waits, timeout=max(0.0, deadline - began), return_when=asyncio.FIRST_COMPLETED
            )
        partial = not (task.done() or lane.parked_now())
        if partial and lane.finishing:  # its step is done: it ends here (commit, result)
            await asyncio.wait([task])
        if task.done():
            return f.LaneMove(lane=lane.id, how="finished", elapsed_s=_since(began))
        lane.moving = True
        if partial and lane.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(lane.pgid, signal.SIGTERM)
            assert self.node is not None
            await asyncio.wait([task], timeout=min(DRAIN_KILL_S, self.node.args.lane_grace_s))
        task.cancel()  # SIGKILLs a command still running; a parked program ends at once
        await asyncio.gather(task, return_exceptions=True)
        return await self._hand_over(lane, partial, began, answer_by)

    async def _hand_over(
        self, lane: Lane, partial: bool, began: float, answer_by: float
    ) -> f.LaneMove:
        """Snapshot the stopped `lane` and offer it to the next generation until it takes it
        (`moved`/`partial`), refuses it (`lost`: the lane ends here `interrupted`, so the
        coordinator re-runs it) or `HANDOVER_S` passes unanswered (`lost`: whether the next
        generation has it is what the coordinator then asks it)."""
        assert self.node is not None and self.transcript is not None
        lane.state = "moving"
        lane.held = []
        next_seq, landed = self.transcript.detach(lane.id)
        snapshot = f.LaneSnapshot(
            start=lane.start,
            sandbox=lane.sandbox,
            checkpoint=lane.quiet.checkpoint if lane.quiet is not None else None,
            mailbox=lane.mailbox.unread() if lane.mailbox is not None else [],
            message_keys=list(lane.message_keys or ()),
            next_seq=next_seq,
            partial=partial,
            elapsed_s=time.monotonic() - lane.began,
        )
        with contextlib.suppress(TimeoutError):  # a slow disk delays the rows, nothing more
            async with asyncio.timeout(HANDOVER_S / 2):
                await landed  # the next generation's rows follow ours in LMDB, without a gap
        how: Literal["moved", "partial", "lost"] = "partial" if partial else "moved"
        detail = ""
        give_up = min(time.monotonic() + HANDOVER_S, answer_by - DELIVER_ON_STOP_S)
        while True:
            try:
                await self.node.call(
                    self.node.name, f.LaneResume(snapshot=snapshot), timeout_s=HANDOVER_S / 4
                )
                break
            except (CallTimeout, PeerDown) as exc:  # the outcome is unknown: offer it again
                if time.monotonic() >= give_up:
                    how, detail = "lost", str(exc)
                    break
                await asyncio.sleep(RETRY_S)
            except RemoteError as exc:  # refused: the lane is not there, so it ends here
                how, detail = "lost", f"refused by the next generation: {exc}"
                self.transcript.resume(lane.id, next_seq, time.time() - snapshot.elapsed_s)
                lane.moving = False
                await self._end(lane, "interrupted", f"interrupted: it was {detail}")
                break
        if lane.moving:  # there (or, unanswered, maybe there: the next generation says)
            self._moved.add(lane.id)
            self.lanes.pop(lane.id, None)
        held, lane.held = lane.held, None
        for ep, peer, env in held:
            self.handle(ep, peer, env)
        if how == "lost":
            log.warning("lane %s: not handed over: %s", lane.id, detail)
        return f.LaneMove(lane=lane.id, how=how, elapsed_s=_since(began), detail=detail)

    # --- outbox ----------------------------------------------------------------------------------

    async def _deliver(self, result: f.LaneResult) -> None:
        assert self.store is not None
        put = f.InboxPut(msg_id=f"result:{result.lane}", result=result)
        self.outbox[put.msg_id] = put
        try:
            await self.store.put_durable("outbox", put.msg_id.encode(), self._encoder.encode(put))
        except StateError as exc:
            # Not durable, but not lost while this process lives: it is sent all the same.
            log.error(
                "lane %s: result not persisted (%s); sending it from memory", result.lane, exc
            )
        self._send(put.msg_id)

    async def _adopt_outbox(self) -> None:
        """Take every outbox row LMDB holds that this process does not (a predecessor's, which
        has retired, or this generation's own from before a restart) and send them. The rows
        are read off the loop."""
        assert self.store is not None
        rows = await asyncio.to_thread(self.store.items, "outbox")
        for key, value in rows:
            msg_id = key.decode(errors="replace")
            if msg_id in self.outbox:
                continue
            try:
                self.outbox[msg_id] = self._decoder.decode(value)
            except msgspec.DecodeError as exc:  # one bad record must not stop the shard
                log.error("outbox %r: unreadable record dropped: %s", key, exc)
                self.store.delete("outbox", key)
        self._flush_outbox()

    async def _lanes_and_results(self) -> f.Body:
        """`ListLanes(results=True)`: the live lanes, and the lanes whose result waits in the
        outbox, after adopting what a retired predecessor left there."""
        await self._adopt_outbox()
        results = [put.result.lane for put in self.outbox.values()]
        return f.LaneList(lanes=[self._info(lane) for lane in self.lanes.values()], results=results)

    def _flush_outbox(self) -> None:
        for msg_id in list(self.outbox):
            self._send(msg_id)

    def _send(self, msg_id: str) -> None:
        assert self.node is not None
        if msg_id in self._sending_tasks or not self.node.peer_up("coordinator"):
            return
        self._sending_tasks[msg_id] = self.node.spawn(self._send_one(msg_id))

    async def _send_one(self, msg_id: str) -> None:
        assert self.node is not None and self.store is not None
        try:
            put = self.outbox.get(msg_id)
            if put is None:
                return
            reply = await self.node.call("coordinator", put, timeout_s=10.0)
            if isinstance(reply, f.InboxAck) and reply.msg_id == msg_id:
                self.outbox.pop(msg_id, None)
                self.store.delete("outbox", msg_id.encode())
        except (RelayError, RemoteError) as exc:
            log.info("outbox: %s not delivered yet: %s", msg_id, exc)
        finally:
            self._sending_tasks.pop(msg_id, None)

    async def _resend_loop(self) -> None:
        while True:
            await asyncio.sleep(RESEND_S)
            self._flush_outbox()


def _since(began: float) -> float:
    return round(time.monotonic() - began, 3)


async def _shielded(drain: asyncio.Future[f.Body]) -> f.Body:
    """The drain's answer; a caller giving up (its reply task cancelled) leaves it running."""
    return await asyncio.shield(drain)


def _end_event(result: f.LaneResult) -> str:
    """A lane's last transcript row: "<status>: <how it ended>", e.g. "succeeded: exited with
    status 0", "failed: exited with status 3", "cancelled: cancelled by request"."""
    if result.status == "succeeded":
        text = "succeeded"
        if result.exit_code is not None:
            text = f"succeeded: exited with status {result.exit_code}"
        return f"{text}; committed {result.commit}" if result.commit else text
    error = result.error or "no error recorded"
    return error if error.startswith(f"{result.status}:") else f"{result.status}: {error}"


def _append_line(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text.replace("\n", " ") + "\n")
