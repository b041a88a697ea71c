"""A worker-host shard: hosts at most `lanes_per_shard` lanes and reports what they did.

A lane is registered (so `cancel` can find it) before its task is spawned, then: ask the custodian
for a sandbox, run the task's command there (`shards.shell.run_shell`: own process group, output
drained as it comes, the whole group killed on timeout or cancel), ask the custodian to commit when
the task says so, and hand the result to the outbox.

The outbox is durable (ARCHITECTURE.md §5, invariant 8): a result is committed to this shard's LMDB
before it is sent, and dropped only when the coordinator acknowledges it, which it does after its
own commit. Until then it is re-sent whenever the coordinator comes (back) up and every
`RESEND_S` seconds; the message id is derived from the lane id, so the coordinator de-duplicates.
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

import msgspec

from orchestra_sup.errors import (
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

ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")
"""Variables a lane command inherits from the shard; everything else is scrubbed."""


class Lane:
    """One lane's record in its shard: what it runs and where it stands."""

    def __init__(self, start: f.LaneStart):
        self.start = start
        self.id = start.lane
        self.state = "starting"
        self.sandbox: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.cancel_requested = False
        self.pgid: int | None = None
        self.interrupted = False
        self.message_keys: dict[str, None] | None = None
        """The idempotency keys of its last `MESSAGE_KEYS` messages, oldest first (made by the
        first message: parked lanes are many)."""
        self.inbox_lock: asyncio.Lock | None = None  # made by the first inbox-file append
        self.tail = bytearray()
        self.mailbox: Mailbox | None = None if start.task.program == SHELL else Mailbox()
        """A program's `recv` reads it; a shell command reads its inbox file instead."""

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
        for key, value in self.store.items("outbox"):
            try:
                self.outbox[key.decode()] = self._decoder.decode(value)
            except msgspec.DecodeError as exc:  # one bad record must not stop the shard
                log.error("outbox %r: unreadable record dropped: %s", key, exc)
                self.store.delete("outbox", key)
        # --- transcripts: close what a dead generation left running, prune, prune periodically
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
        for peer in changed:
            if peer.name == "custodian":
                (self._custodian_up.set if peer.up else self._custodian_up.clear)()
            if peer.name == "coordinator" and peer.up:
                self._flush_outbox()

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        body = env.body
        match body:
            case f.LaneStart():
                ep.reply(env, peer, self._admit(body))
            case f.LaneCancel(lane=lane_id):
                lane = self.lanes.get(lane_id)
                if lane is None or lane.task is None:
                    ep.reply(
                        env,
                        peer,
                        f.Error(
                            code=ErrorCode.NOT_FOUND,
                            message=f"no live lane {lane_id!r} on this shard",
                        ),
                    )
                    return
                lane.cancel_requested = True
                lane.task.cancel()
                ep.reply(env, peer, f.Ack())
            case f.ListLanes():
                ep.reply(
                    env, peer, f.LaneList(lanes=[self._info(lane) for lane in self.lanes.values()])
                )
            case f.LaneMessage():
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

    def _admit(self, start: f.LaneStart) -> f.Body:
        assert self.node is not None and self.store is not None
        if start.lane in self.lanes or f"result:{start.lane}" in self.outbox:
            return f.Ack()  # a re-sent start: the lane id is its idempotency key
        if self._closing:
            # Stopping: a lane placed here now would only be interrupted. Full, to the
            # coordinator, until this shard's next generation says otherwise.
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
        lane = Lane(start)
        self.lanes[lane.id] = lane  # registered before it is spawned: a cancel always finds it
        if self.transcript is not None:  # transcripts: its rows start before anything can happen
            self.transcript.begin(lane.id)
            for warning in start.warnings:
                self.transcript.event(lane.id, f"warning: {warning}")
        lane.task = self.node.spawn(self._run(lane))
        return f.Ack()

    def _message(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope, msg: f.LaneMessage
    ) -> None:
        """Deliver a message to a live lane: one line appended to its inbox file
        (`$ORCHESTRA_INBOX`) and an event row in its transcript. The idempotency key is claimed
        here, on the loop, before anything is awaited, so a re-sent message can never be
        delivered twice; messages to one lane are written in order, off the loop."""
        assert self.node is not None
        lane = self.lanes.get(msg.lane)
        if lane is None:
            ep.reply(
                env,
                peer,
                f.Error(
                    code=ErrorCode.NOT_FOUND, message=f"no live lane {msg.lane!r} on this shard"
                ),
            )
            return
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
        assert self.node is not None
        started = time.monotonic()
        spec = lane.start.task
        verdict: Outcome | None = None
        status, error, commit = "failed", None, None
        try:
            program = load_program(spec.program, frozenset(self.node.args.lane_programs))
            ready = await self._custodian(f.SandboxCreate(lane=lane.id))
            assert isinstance(ready, f.SandboxReady)
            lane.sandbox = ready.path
            lane.state = "running"
            if self.transcript is not None:
                what = spec.run if spec.program == SHELL else f"{spec.program} {spec.run}"
                self.transcript.event(lane.id, f"started in {ready.path}: {what}")
            context = LaneContext(
                lane.start,
                Path(ready.path),
                exec_fn=lambda command, timeout_s: self._exec(lane, command, timeout_s),
                emit_fn=self._emitter(lane),
                mailbox=lane.mailbox or Mailbox(),
            )
            if spec.program == SHELL:  # its command has the timeout, and kills its group
                verdict = await program.run(context)
            else:
                try:
                    async with asyncio.timeout(spec.timeout_s):
                        verdict = checked(spec.program, await program.run(context))
                except TimeoutError:
                    verdict = Outcome(
                        status="failed", error=f"timed out after {spec.timeout_s:g} s"
                    )
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
        result = f.LaneResult(
            lane=lane.id,
            plan=lane.start.plan,
            task=spec.id,
            shard=self.node.name,
            status=status,
            exit_code=verdict.exit_code if verdict is not None else None,
            duration_s=round(time.monotonic() - started, 3),
            output_tail=lane.tail.decode(errors="replace"),
            sandbox=lane.sandbox,
            commit=commit,
            error=error,
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
