"""A shard's durable outbox: what its lanes tell the coordinator, on its way there.

Three kinds of message (`InboxPut`), each with a message id the coordinator de-duplicates by:
a lane's result ("result:<lane>", `result_id`), a question its program asks a human
("pause:<lane>:<key>", `pause_id`: asked again after a re-run, it is the same message) and a
note from its program ("note:<lane>:<n>", `note_id`, n counting from 1 over the lane's life).

ARCHITECTURE.md §5 and §11 invariant 8: each is committed to the shard's LMDB (database `DB`)
before it is sent, and dropped only when the coordinator acknowledges it, which it does after its
own commit. Until then it is re-sent whenever the coordinator comes (back) up (`flush`) and every
`RESEND_S` seconds. A host's shard's message the coordinator refuses `fenced` (its attempt no
longer owns the lane, ADR 0021) is dropped: no resend would change that. `holds` and `lanes`
are about results only: they say which lanes have ended and wait for the coordinator to learn
it (the coordinator settles a rollover on them).

Generations of one shard share the LMDB environment, so the rows can outlive the process that
wrote them: a retired predecessor's, or this generation's own from before a restart. `adopt`
takes them; the shard calls it only once they are no live process's own (`shards.handover`:
settling, and `ListLanes(results=True)` after a predecessor retired).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from orchestra_sup.errors import ErrorCode, RelayError, RemoteError, StateError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.node import Node
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

DB = "outbox"
"""The LMDB database the outbox keeps its rows in (key: message id, value: an `InboxPut`)."""
RESEND_S = 2.0
"""Seconds between two rounds of re-sending what the coordinator has not acknowledged."""
SEND_TIMEOUT_S = 10.0
"""How long one send waits for the coordinator's `InboxAck`; unanswered, it is sent again."""
DELIVER_ON_STOP_S = 2.0
"""How long a stopping shard waits for the coordinator to acknowledge the lanes it interrupted;
what is not acknowledged by then waits in the durable outbox for the next generation."""


def result_id(lane: str) -> str:
    """The message id of `lane`'s result."""
    return f"result:{lane}"


def pause_id(lane: str, key: str) -> str:
    """The message id of `lane`'s question `key` to a human."""
    return f"pause:{lane}:{key}"


def note_id(lane: str, n: int) -> str:
    """The message id of `lane`'s `n`-th note to the coordinator (from 1)."""
    return f"note:{lane}:{n}"


class Outbox:
    """The messages one shard process has not had acknowledged yet, in memory and in `store`
    (opened with `DB`), sent through `node`. Runs on the node's event loop."""

    def __init__(self, node: Node, store: Store) -> None:
        self._node = node
        self._store = store
        self._puts: dict[str, f.InboxPut] = {}
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(f.InboxPut)

    def holds(self, lane: str) -> bool:
        """Whether `lane`'s result waits here: it ended in this process, or in an earlier one
        whose row was adopted."""
        return result_id(lane) in self._puts

    def depth(self) -> int:
        """Messages waiting here for the coordinator's acknowledgement."""
        return len(self._puts)

    def lanes(self) -> list[str]:
        """The lanes whose result waits here, in the order this process took them."""
        return [put.result.lane for put in self._puts.values() if put.result is not None]

    async def deliver(self, put: f.InboxPut) -> None:
        """Commit `put` (returns once the write has landed) and send it; a put with the id of
        one that waits here replaces it. A write that fails (`StateError`, e.g. a full disk) is
        logged, not raised: the message is sent from memory all the same, not durable but not
        lost while this process lives."""
        self._puts[put.msg_id] = put
        try:
            await self._store.put_durable(DB, put.msg_id.encode(), self._encoder.encode(put))
        except StateError as exc:
            log.error("outbox: %s not persisted (%s); sending it from memory", put.msg_id, exc)
        self._send(put.msg_id)

    async def adopt(self) -> None:
        """Take every outbox row LMDB holds that this process does not (a predecessor's, which
        has retired, or this generation's own from before a restart) and send them. The rows
        are read off the loop; an unreadable one is logged and deleted."""
        rows = await asyncio.to_thread(self._store.items, DB)
        for key, value in rows:
            msg_id = key.decode(errors="replace")
            if msg_id in self._puts:
                continue
            try:
                self._puts[msg_id] = self._decoder.decode(value)
            except msgspec.DecodeError as exc:  # one bad record must not stop the shard
                log.error("outbox %r: unreadable record dropped: %s", key, exc)
                self._store.delete(DB, key)
        self.flush()

    def flush(self) -> None:
        """Send every message that is not being sent already (nothing while the roster says the
        coordinator is down: its coming up flushes again)."""
        for msg_id in list(self._puts):
            self._send(msg_id)

    async def wait_sent(self, timeout_s: float) -> None:
        """Wait at most `timeout_s` seconds (not at all when it is <= 0) for the sends in flight
        to end, acknowledged or not."""
        pending = list(self._sending.values())
        if pending and timeout_s > 0:
            await asyncio.wait(pending, timeout=timeout_s)

    async def resend_loop(self) -> None:
        """`flush` every `RESEND_S` seconds, for ever (a task the node owns)."""
        while True:
            await asyncio.sleep(RESEND_S)
            self.flush()

    def _send(self, msg_id: str) -> None:
        if msg_id in self._sending or not self._node.peer_up("coordinator"):
            return
        self._sending[msg_id] = self._node.spawn(self._send_one(msg_id))

    async def _send_one(self, msg_id: str) -> None:
        try:
            put = self._puts.get(msg_id)
            if put is None:
                return
            reply = await self._node.call("coordinator", put, timeout_s=SEND_TIMEOUT_S)
            if isinstance(reply, f.InboxAck) and reply.msg_id == msg_id:
                self._drop(msg_id)
        except RemoteError as exc:
            if exc.code is not ErrorCode.FENCED:
                log.info("outbox: %s not delivered yet: %s", msg_id, exc)
                return
            log.warning("outbox: %s dropped: the coordinator refused it: %s", msg_id, exc)
            self._drop(msg_id)  # final: the attempt no longer owns its lane (ADR 0021)
        except RelayError as exc:
            log.info("outbox: %s not delivered yet: %s", msg_id, exc)
        finally:
            self._sending.pop(msg_id, None)

    def _drop(self, msg_id: str) -> None:
        self._puts.pop(msg_id, None)
        self._store.delete(DB, msg_id.encode())
