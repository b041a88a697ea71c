"""The children table: the root supervisor's control record of every worker, and the roster.

`Children` is what the root knows of the tree's workers, in start order: their specs and states
(`core.Worker`), what each one's heartbeats said last (`Liveness`), where each live process
listens, and from that the `Roster` pushed to every child on `supervisor.ipc` whenever a child's
state changes, the `ChildInfo` rows of `ctl status`, systemd's `STATUS=` line and the process
title. It sends the roster and nothing else; what the children say comes in through the root
supervisor's control channel, which updates `liveness`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from orchestra_sup.cluster.settings import ClusterSettings
from orchestra_sup.histogram import figures_ms
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import routing_id
from orchestra_sup.supervisor.colocated import ColocatedSeam
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.seam import ProcessSeam
from orchestra_sup.supervisor.sockets import RootSockets
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.system.cpupolicy import in_force
from orchestra_sup.system.proctitle import ProcTitle, supervisor_title

UP = (ChildState.RUNNING, ChildState.STOPPING)


class Liveness:
    """What a worker's heartbeats said last: when (monotonic seconds), its event-loop lag
    (p50, p99, max in ms over its sliding window; None before the first beat), its load, and
    the whole last `beat` of its current process (its histograms and queue figures, for the
    metrics and `ctl status`; None before the first)."""

    def __init__(self) -> None:
        self.last_beat = 0.0
        self.lag_ms: tuple[float, float, float] | None = None
        self.load = 0
        self.stale_frames = 0
        self.bad_frames = 0
        self.beat: f.Heartbeat | None = None


class Children:
    """The tree's `workers` (start order; `by_name`), their `liveness`, and `endpoints`: where
    the live process of each (child, generation) listens. The roster goes out on `sockets`'
    control socket; `seam` says where a child listens by default and which release the
    supervisor runs."""

    def __init__(
        self, workers: list[Worker], seam: ProcessSeam | ColocatedSeam, sockets: RootSockets
    ):
        self.seam = seam
        self.sockets = sockets
        self.workers = workers
        self.by_name = {w.name: w for w in workers}
        self.liveness = {w.name: Liveness() for w in workers}
        self.endpoints: dict[tuple[str, int], str] = {}
        """Where the live process of each (child, generation) listens."""
        self.unheard: set[str] = set()
        """Adopted children not heard from since the re-exec: each is sent the roster again
        at its first heartbeat (until its DEALER has reconnected, a send to it fails)."""
        self.adopting = False
        """`supervisor.reexec.adopt` is taking the children back one by one: no roster goes out
        until all are (one sent midway would show the rest down, and the coordinator would
        lose their lanes)."""
        self.title = ProcTitle()
        self.remote: list[f.PeerState] = []
        """Peers on other machines the roster lists beside the workers: on a root, its hosts'
        shards (`Hosts.peers`); on a host's agent, the root's coordinator and custodian."""

    def index(self, workers: list[Worker]) -> None:
        """Know `workers` (start order) as the tree's children, for the control record, the
        roster and the watchdog: a config reload adds a shard (indexed before it starts, so its
        handshake finds it) or has removed one from the tree."""
        self.workers = workers
        self.by_name = {w.name: w for w in workers}
        for worker in workers:
            self.liveness.setdefault(worker.name, Liveness())
        for name in [n for n in self.liveness if n not in self.by_name]:
            del self.liveness[name]
        self.retitle()

    def retitle(self) -> None:
        """Show the children running, of all, in the process title."""
        running = sum(w.state is ChildState.RUNNING for w in self.workers)
        self.title.show(supervisor_title(running, len(self.workers)))

    def summary(self) -> str:
        """One line for systemd's `STATUS=`, e.g. "5/5 children running, 2 lanes, 1 plan":
        children running of all, live lanes over running shards and plans not done, as their
        last heartbeats said (cheap: it is computed on every state change and heartbeat)."""
        running = [w for w in self.workers if w.state is ChildState.RUNNING]
        lanes = sum(self.liveness[w.name].load for w in running if w.spec.role == "shard")
        plans = sum(self.liveness[w.name].load for w in running if w.spec.role == "coordinator")
        return (
            f"{len(running)}/{len(self.workers)} children running, "
            f"{lanes} lane{'s' * (lanes != 1)}, {plans} plan{'s' * (plans != 1)}"
        )

    def endpoint(self, worker: Worker, generation: int | None = None) -> str:
        """Where `worker`'s process at `generation` (default: its current one) listens."""
        generation = worker.generation if generation is None else generation
        return self.endpoints.get((worker.name, generation), self.seam.endpoint(worker.name))

    def peer_state(self, w: Worker) -> f.PeerState:
        """`w` as the roster shows it. During a surge (`Worker.start_beside`) the retiring
        process stands for the worker, up but taking nothing new, until the new one is running;
        then the new one does, and the retiring generation is listed as draining."""
        generation, up, stopping, draining = (
            w.generation,
            w.state in UP,
            w.state is ChildState.STOPPING,
            [] if w.retiring is None else [w.retiring],
        )
        if w.retiring is not None and w.state is ChildState.STARTING:
            generation, up, stopping, draining = w.retiring, True, True, []
        return f.PeerState(
            name=w.name,
            role=w.spec.role,
            generation=generation,
            up=up,
            endpoint=self.endpoint(w, generation),
            capacity=w.spec.capacity,
            capabilities=list(w.spec.capabilities),
            tenants=list(w.spec.tenants),
            stopping=stopping or w.leaving,
            draining=draining,
        )

    def roster(self) -> f.Roster:
        return f.Roster(peers=[*(self.peer_state(w) for w in self.workers), *self.remote])

    def take_remote(self, peers: list[f.PeerState]) -> None:
        """List `peers` as the roster's remote peers from now, and send the roster out."""
        if peers != self.remote:
            self.remote = peers
            if not self.adopting:
                self.broadcast_roster()

    def root_peers(self, cluster: ClusterSettings) -> list[f.PeerState]:
        """The coordinator and the custodian as hosts' processes reach them: at
        `[cluster] coordinator_listen` and `custodian_listen`, their CURVE ports."""
        out = []
        ports = {"coordinator": cluster.coordinator_listen, "custodian": cluster.custodian_listen}
        for name, address in ports.items():
            worker = self.by_name.get(name)
            if worker is not None and address:
                out.append(msgspec.structs.replace(self.peer_state(worker), endpoint=address))
        return out

    def broadcast_roster(self) -> None:
        """Tell every running child who is up, where, and at which generation."""
        control = self.sockets.control
        if control is None:
            return
        roster = self.roster()
        for worker in self.workers:
            live = [worker.generation] if worker.state in UP else []
            if worker.retiring is not None:  # it finds its successor in the roster
                live.append(worker.retiring)
            for generation in live:
                with contextlib.suppress(Exception):
                    control.send(roster, to=routing_id(worker.name, generation))

    def child_info(self, worker: Worker) -> f.ChildInfo:
        """One worker as `ctl status` shows it."""
        live = self.liveness[worker.name]
        return f.ChildInfo(
            name=worker.name,
            role=worker.spec.role,
            pid=worker.pid,
            generation=worker.generation,
            state="retiring" if worker.leaving and worker.state in UP else str(worker.state),
            restarts=worker.restarts,
            operator_restarts=worker.operator_restarts,
            uptime_s=round(worker.uptime(), 3),
            last_exit=worker.last_exit,
            endpoint=self.endpoint(worker),
            capacity=worker.spec.capacity,
            loop_lag_ms=live.lag_ms,
            capabilities=list(worker.spec.capabilities),
            tenants=list(worker.spec.tenants),
            release=(worker.release or self.seam.release) if worker.pid is not None else "",
            version=worker.version if worker.pid is not None else "",
            stale_frames=live.stale_frames,
            bad_frames=live.bad_frames,
            cpu=in_force(worker.pid) if worker.pid is not None else "",
            **_beat_info(live.beat),
        )


def _beat_info(beat: f.Heartbeat | None) -> dict[str, Any]:
    """`ChildInfo`'s fields from a child's last heartbeat: relay (p50, p99, max) in ms
    estimated from its histogram (`histogram.figures_ms`: bucket upper bounds), lanes by
    state, inbox and write-behind depths, requests answered `internal`, results and commits
    refused as fenced, descriptors."""
    if beat is None:
        return {}
    return {
        "internal_errors": beat.internal_errors,
        "fenced": beat.fenced,
        "relay_ms": figures_ms(beat.relay),
        "lanes": dict(beat.lanes),
        "inbox_depth": beat.inbox_depth,
        "persist_depth": beat.persist_depth,
        "descriptors": beat.descriptors,
    }
