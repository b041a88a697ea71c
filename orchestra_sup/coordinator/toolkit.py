"""The coordinator's relayed tools, as `ctl call` reaches them.

Every tool keeps its name and parameters whether the other side is local or not (ARCHITECTURE.md
§6): read tools on the tree are answered by the custodian, lane tools by the shards (which is
which, and each tool's parameters: `protocol.tools`). Each call has a deadline (`deadline_s`,
default 55 s, the seed's relay bound).

Failure semantics (the relay section of seeds/000):
- A peer that is down is reported at once (`PeerDown`: the call was not delivered, retry when it
  is back), never after the deadline.
- A call that got no answer in time raises `CallTimeout`: the outcome is unknown. For a read that
  costs nothing; for a lane tool the error says how to check (`lane_status`, `list_lanes`)
  before sending again.
- `RemoteError` carries the peer's typed error (`path_escape`, `not_found`, ...).
"""

from __future__ import annotations

import asyncio
import typing
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, assert_never

import msgspec

from orchestra_sup.errors import CallTimeout, ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.runtime.node import Node

SNAPSHOT_ROWS = 50
SNAPSHOT_MAX_CHUNKS = 64
DEADLINE_S = 55.0


@dataclass
class Toolkit:
    """Relayed tools for the coordinator.

    `start_lane(params)` is the coordinator's own placement of a one-task plan; `shards()` lists
    the shard names that are up; `lane_shard(lane)` says which shard runs a lane, once its shard
    has taken it (None when no live lane has that id); `deadline_s` bounds each relayed call,
    seconds.
    """

    node: Node
    start_lane: Callable[[tools.StartLane], Awaitable[Any]]
    shards: Callable[[], list[str]]
    lane_shard: Callable[[str], Awaitable[str | None]]
    deadline_s: float = DEADLINE_S

    async def call(self, tool: str, params: dict[str, str]) -> Any:
        """Run `tool` with `params`; returns its JSON-shaped value.

        Raises `RemoteError(bad_request)` for an unknown tool or a missing parameter, and the
        relay errors described in the module docstring.
        """
        spec = tools.TOOLS.get(tool)
        if spec is None:
            known = ", ".join(sorted(tools.TOOLS))
            raise RemoteError(ErrorCode.BAD_REQUEST, f"unknown tool {tool!r} (known: {known})")
        if spec.answered_by == "custodian":  # its parameters are the custodian's to read
            reply = await self.node.call(
                "custodian", f.ToolCall(tool=tool, params=params), timeout_s=self.deadline_s
            )
            assert isinstance(reply, f.ToolResult)
            return reply.value
        call = typing.cast(tools.LaneCall, spec.parse(params))
        match call:
            case tools.StartLane() as start:
                return await self.start_lane(start)
            case tools.ListLanes():
                return {"lanes": [msgspec.to_builtins(lane) for lane in await self._all_lanes()]}
            case tools.LaneStatus(lane=lane):
                return await self._lane_status(_required(lane, "lane"))
            case tools.CancelLane(lane=lane):
                return await self._cancel(_required(lane, "lane"))
            case tools.MessageLane(lane=lane, text=text, key=key):
                return await self._message(
                    _required(lane, "lane"), _required(text, "text"), key or None
                )
            case tools.SnapshotLane(lane=lane):
                return await self._snapshot(_required(lane, "lane"))
            case _:
                assert_never(call)

    async def _all_lanes(self) -> list[f.LaneInfo]:
        replies = await asyncio.gather(
            *(
                self.node.call(name, f.ListLanes(), timeout_s=self.deadline_s)
                for name in self.shards()
            ),
            return_exceptions=True,
        )
        return [lane for r in replies if isinstance(r, f.LaneList) for lane in r.lanes]

    async def _shard_of(self, lane: str) -> str:
        """The shard running `lane`, waiting (within the deadline) while its start is in flight.

        Raises `RemoteError(not_found)` when no live lane has that id, `RemoteError(timeout)` when
        it is still starting at the deadline (nothing was sent to it)."""
        try:
            async with asyncio.timeout(self.deadline_s):
                shard = await self.lane_shard(lane)
        except TimeoutError:
            raise RemoteError(
                ErrorCode.TIMEOUT,
                f"lane {lane!r} was still starting after {self.deadline_s:g} s; nothing was sent",
            ) from None
        if shard is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no live lane {lane!r}")
        return shard

    async def _lane_status(self, lane: str) -> Any:
        shard = await self._shard_of(lane)
        reply = await self.node.call(shard, f.ListLanes(), timeout_s=self.deadline_s)
        assert isinstance(reply, f.LaneList)
        for info in reply.lanes:
            if info.lane == lane:
                return msgspec.to_builtins(info)
        raise RemoteError(ErrorCode.NOT_FOUND, f"lane {lane!r} is no longer on {shard}")

    async def _cancel(self, lane: str) -> Any:
        shard = await self._shard_of(lane)
        try:
            await self.node.call(shard, f.LaneCancel(lane=lane), timeout_s=self.deadline_s)
        except CallTimeout as exc:
            raise CallTimeout(
                shard,
                f"cancel_lane({lane}); check with lane_status before sending again",
                self.deadline_s,
            ) from exc
        return {"cancelled": lane}

    async def _message(self, lane: str, text: str, key: str | None) -> Any:
        """Deliver `text` once: the idempotency key (`key`, or a new one, returned) makes a
        re-send after a timeout harmless; the relay itself never re-sends a message."""
        shard = await self._shard_of(lane)
        key = key or uuid.uuid4().hex
        try:
            ack = await self.node.call(
                shard, f.LaneMessage(lane=lane, text=text, key=key), timeout_s=self.deadline_s
            )
        except CallTimeout as exc:
            raise CallTimeout(
                shard,
                f"message_lane({lane}, key={key}); snapshot_lane shows whether it was delivered, "
                "and re-sending with the same key cannot deliver it twice",
                self.deadline_s,
            ) from exc
        assert isinstance(ack, f.MessageAck)
        return {
            "lane": lane,
            "key": key,
            "delivered": not ack.duplicate,
            "duplicate": ack.duplicate,
        }

    async def _snapshot(self, lane: str) -> Any:
        """The lane's status and the newest rows of its transcript (messages included)."""
        status = await self._lane_status(lane)
        shard = status["shard"]
        rows: list[Any] = []
        after = -1
        for _ in range(SNAPSHOT_MAX_CHUNKS):  # a huge transcript is cut, not read whole
            chunk = await self.node.call(
                shard, f.LaneLogs(lane=lane, after_seq=after), timeout_s=self.deadline_s
            )
            assert isinstance(chunk, f.LogChunk)
            rows = (rows + msgspec.to_builtins(chunk.rows))[-SNAPSHOT_ROWS:]
            if not chunk.rows:
                break
            after = chunk.rows[-1].seq
        return {**status, "transcript_tail": rows}


def _required(value: str, name: str) -> str:
    """`value`, a tool's parameter `name`; raises `RemoteError(bad_request)` when it is empty
    (missing)."""
    if not value:
        raise RemoteError(ErrorCode.BAD_REQUEST, f"missing parameter {name!r}")
    return value
