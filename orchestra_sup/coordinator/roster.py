"""The coordinator's view of its shards, and what a change in the roster does to live tasks.

Each roster change (`Roster.changed`) updates the view placement reads (`shards`); a shard that
went down loses its live tasks (`PlanRecord.lose_shard`: paused and re-placed, or failed at the
`max_worker_loss`-th loss), unless the tree is stopping, which only interrupts them. A rollover
moves lanes between generations of one shard instead (ARCHITECTURE.md §9): those of a draining
generation are kept (`moving`), and once it has retired, the current generation is asked which
it has (`settle_moved`). A live task on a shard the tree no longer has is lost with it.

Every change it makes to a plan is committed through `PlanBook.commit`, and a roster change
ends with a pump.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.placement import ShardView
from orchestra_sup.errors import OrchestraError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.node import Node

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 10.0
"""How long a shard has to say which lanes moved to it (`ListLanes`)."""


class Roster:
    """See the module docstring. `stopping()` says the tree stops."""

    def __init__(self, node: Node, book: PlanBook, *, stopping: Callable[[], bool]) -> None:
        self.node = node
        self.book = book
        self.stopping = stopping
        self.shards: dict[str, ShardView] = {}
        self.moving: dict[str, frozenset[int]] = {}
        """Per shard, its generations whose lanes are moving to the current one: draining, or
        retired and not yet settled (`_settle_moved`)."""

    @property
    def max_worker_loss(self) -> int:
        """Losses of its worker process after which a task fails (`[lanes] max_worker_loss`)."""
        return self.node.args.max_worker_loss

    def changed(self, changed: list[f.PeerState]) -> None:
        """The roster changed (`changed`: the peers whose state did); then place."""
        with self.book.batch():
            self._changed(changed)
            self._lose_unknown_shards()
            self.book.schedule()

    def _changed(self, changed: list[f.PeerState]) -> None:
        for name in [n for n in self.shards if n not in self.node.peers]:
            # taken out of the tree (a reload retired it): never placed on, never waited for;
            # its live tasks are lost below (`_lose_unknown_shards`) and run elsewhere
            del self.shards[name]
            self.moving.pop(name, None)
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
                boot=peer.boot,
                lease=peer.lease,
            )
            # Rollover: lanes of a draining generation are moving here, not lost; those of one
            # that retired are kept until the shard says which it has (`_settle_moved`). So are
            # those of any older generation of a shard that is up: this coordinator may have been
            # away while a drain ended (lanes a crashed generation ran are simply not there).
            keep = self.moving.pop(peer.name, frozenset())
            if peer.up:
                older = self._older_generations(peer.name, peer.generation)
                retired = (keep | older) - set(peer.draining)
                keep = self.moving[peer.name] = keep | older | set(peer.draining)
                if retired:
                    self.node.spawn(self._settle_moved(peer.name, peer.generation, retired))
            else:
                keep = frozenset()
            for plan in list(self.book.active.values()):
                if self.stopping() and not peer.up:
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
                    self.book.commit(plan)

    def _older_generations(self, shard: str, generation: int) -> frozenset[int]:
        """Generations of `shard` older than `generation` that live tasks were placed on."""
        return frozenset(
            rec.shard_gen
            for plan in self.book.active.values()
            for task_id in plan.live_ids()
            for rec in (plan.tasks[task_id],)
            if rec.shard == shard and rec.shard_gen is not None and rec.shard_gen < generation
        )

    async def _settle_moved(self, shard: str, generation: int, retired: frozenset[int]) -> None:
        """Generations `retired` of `shard` drained and are gone: ask generation `generation`
        which lanes it has (live, or with a result in its outbox) and move their tasks on to it;
        the rest are lost (`PlanRecord.settle_moved`). A shard that cannot say loses them all."""
        try:
            reply: object = await self.node.call(
                shard, f.ListLanes(results=True), timeout_s=LIST_TIMEOUT_S
            )
        except OrchestraError as exc:
            reply = exc
        there: set[str] = set()
        if isinstance(reply, f.LaneList):
            there = {lane.lane for lane in reply.lanes} | set(reply.results)
        else:
            log.warning("%s: which lanes moved is unknown (%s): they are lost", shard, reply)
        moving = self.moving.get(shard)
        if moving is not None:
            self.moving[shard] = moving - retired
        with self.book.batch():
            for plan in list(self.book.active.values()):
                moved, lost = plan.settle_moved(
                    shard, retired, generation, there, self.max_worker_loss, time.time()
                )
                if moved or lost:
                    log.info("plan %s: moved to %s: %s; lost: %s", plan.id, shard, moved, lost)
                    self.book.commit(plan)
            self.book.schedule()

    def _lose_unknown_shards(self) -> None:
        """A live task on a shard the roster does not have (the tree came back with fewer
        shards after a crash) is lost with it, as if that shard had died."""
        if not self.node.peers:
            return
        for plan in list(self.book.active.values()):
            gone = {
                rec.shard
                for task_id in plan.live_ids()
                for rec in (plan.tasks[task_id],)
                if rec.shard is not None and rec.shard not in self.node.peers
            }
            for shard in gone:
                lost = plan.lose_shard(shard, None, self.max_worker_loss, now=time.time())
                log.warning("plan %s: %s lost: %s is no longer in the tree", plan.id, lost, shard)
                self.book.commit(plan)
