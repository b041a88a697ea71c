"""The coordinator's side of lanes' fences (ADR 0021; the keys are `cluster.fences`).

- Before a task's lane starts anywhere, the task's earlier attempts on hosts are fenced (their
  keys deleted): a host cut off by a partition may still be running one, and its commit must
  not land once another attempt runs. Before a lane starts on a host, its own key is made
  under the host's lease, and its token goes in its `LaneStart` (`LaneFences.place`). Neither
  done (etcd without a quorum), the lane does not start: the placement is taken back and tried
  again. A task that never ran on a host needs neither, so the root's own lanes go on.
- An inbox message from a host's shard is taken only for a lane that is its task's current
  one, placed on that very shard, and a result only with that placement's token (`refusal`).
  Anything else is refused `fenced`, counted, and dropped by the shard's outbox.
- A lane's key goes once its result is committed (`LaneFences.release`: its commit landed
  before it), and every `SWEEP_S` seconds the keys of lanes no longer live go
  (`LaneFences.run`: what a release could not delete), so a host that stays for months holds
  no key per lane it ever ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgspec

from orchestra_sup.cluster.settings import ClusterSettings, connect
from orchestra_sup.coordinator.placement import ShardView
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.errors import OrchestraError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.remote import HOST_SEPARATOR, host_of

if TYPE_CHECKING:  # aiohttp is imported by a coordinator whose tree has hosts, not by every one
    from orchestra_sup.cluster.fences import Fences

log = logging.getLogger(__name__)

SWEEP_S = 30.0
"""Seconds between two sweeps of the keys of lanes that ended."""


def refusal(put: f.InboxPut, sender: str, plans: Mapping[str, PlanRecord]) -> str | None:
    """Why the coordinator refuses `put` from `sender`, or None: a root process's messages are
    never refused here; a host's shard's are unless they are of a lane that is its task's
    current one, placed on `sender`, and, for a result, with that placement's token."""
    if HOST_SEPARATOR not in sender:
        return None
    part = put.result or put.pause or put.note
    assert part is not None  # the coordinator checked that exactly one is set
    plan = plans.get(part.plan)
    rec = None if plan is None else plan.tasks.get(part.task)
    if rec is None or rec.lane != part.lane or rec.shard != sender:
        return f"lane {part.lane} is not {sender}'s now: that attempt was fenced"
    if put.result is not None and put.result.fence != rec.fence:
        return f"lane {part.lane}'s result carries fence {put.result.fence}, not {rec.fence}"
    return None


class LaneFences:
    """The lane keys of the cluster `settings` names (`[cluster]`, with etcd). Its client is
    opened on first use and closed by `close`."""

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self._stack = contextlib.AsyncExitStack()
        self._fences: Fences | None = None
        self.unreleased: dict[str, str] = {}
        """Lanes whose key `release` has not deleted yet, and the host each ran on."""
        self._revoking: set[asyncio.Task[None]] = set()

    async def _open(self) -> Fences:
        if self._fences is None:
            from orchestra_sup.cluster.fences import Fences

            etcd = await self._stack.enter_async_context(connect(self.settings))
            self._fences = Fences(etcd, self.settings.prefix)
        return self._fences

    async def close(self) -> None:
        await self._stack.aclose()
        self._fences = None

    async def place(
        self, plan: PlanRecord, task_id: str, start: f.LaneStart, view: ShardView | None
    ) -> f.LaneStart:
        """`start` (task `task_id`'s new lane, placed on `view`) once its task's earlier
        attempts on hosts are fenced, with its own token when `view` is a host's shard (the
        token is kept in the task's record too). Raises `EtcdUnavailable` or `EtcdRefused`
        when etcd cannot do it, `FenceRefused` when the lane's key cannot be made."""
        rec = plan.tasks[task_id]
        earlier = [
            (a.lane, host_of(a.shard))
            for a in rec.history
            if a.lane != start.lane and HOST_SEPARATOR in a.shard
        ]
        if start.lane in self.unreleased:  # a placement taken back whose key may stay
            earlier.append((start.lane, self.unreleased[start.lane]))
        on_host = view is not None and HOST_SEPARATOR in view.name
        if not earlier and not on_host:
            return start
        fences = await self._open()
        for lane, host in earlier:
            await fences.revoke(lane, host)
            self.unreleased.pop(lane, None)
        if not on_host:
            return start
        assert view is not None
        token = await fences.grant(start.lane, host_of(view.name), view.lease)
        if rec.lane == start.lane:  # still this placement: the token is kept with it
            plan.touch(task_id).fence = token
        return msgspec.structs.replace(start, fence=token)

    def release(self, lane: str, host: str) -> None:
        """Lane `lane`'s key on `host` goes, if it has one: its lane ended (its result is
        committed), or its placement on a host was taken back (`PlanRecord.unplace`), whose
        lane id the task's next placement uses again. Not done (etcd without a quorum), the
        lane is kept in `unreleased`: its next placement, wherever it goes, waits until the
        key has gone (`place`), and the sweep takes it otherwise."""
        self.unreleased[lane] = host
        task = asyncio.get_running_loop().create_task(self._revoke(lane, host))
        self._revoking.add(task)  # kept until done: the loop holds tasks weakly
        task.add_done_callback(self._revoking.discard)

    async def _revoke(self, lane: str, host: str) -> None:
        try:
            await (await self._open()).revoke(lane, host)
        except OrchestraError as exc:
            log.info("fences: lane %s's key stays for now: %s", lane, exc)
            return
        if self.unreleased.get(lane) == host:
            del self.unreleased[lane]

    async def run(self, live: Callable[[str, str], bool], every_s: float = SWEEP_S) -> None:
        """Sweep every `every_s` seconds (default `SWEEP_S`) the keys of lanes for which
        `live(lane, host)` is False, until cancelled; a sweep etcd does not answer is tried at the
        next."""
        while True:
            await asyncio.sleep(every_s)
            try:
                gone = await (await self._open()).sweep(live)
            except OrchestraError as exc:
                log.info("fences: the sweep waits for etcd: %s", exc)
                continue
            if gone:
                log.info("fences: %d key(s) of lanes that ended deleted", gone)
