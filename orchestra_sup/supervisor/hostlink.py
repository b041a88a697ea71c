"""A host's agent's link to its root: the join over CURVE, the etcd lease, the reports (ADR 0022).

`orchestra-sup host --join tcp://ROOT:PORT --name NAME` runs a supervisor whose tree is only its
shards (`shape.build_tree` with no fixed children): it restarts them under its own intensity,
as a root does. `HostLink` is what makes that supervisor a host of another tree:

0. With `listen`, it opens the host's data port there (`supervisor.hostdata`), which the
   registration names as `data`.
1. It connects a DEALER to the root's cluster endpoint as CURVE client NAME and says
   `Hello(role="host")`, again every `RETRY_S` until it is answered. A `Reject`, or a CURVE
   handshake the root refuses, is a mistake only the operator can mend (a key not allowed as
   this host, another protocol): the agent stops with `root.EXIT_REFUSED` and the reason on
   stderr.
2. On the first `HostWelcome` it takes its etcd lease (`cluster.lease.HostLease`) and keeps it
   for as long as it runs, whatever becomes of the link: the registration at the welcome's
   prefix + NAME holds its name, this run's boot id, its shards, capabilities and tenants.
3. Every `REPORT_S`, and at once when one of its children changes state (`changed`: a shard
   the root asked to restart must be seen stopping before the root places a lane on it
   again), it sends a `HostReport` of its shards. A `not_found` answer means the root
   does not know it (the root restarted): it says `Hello` again. The answer is the root's
   coordinator and custodian (`RootPeers`), which go into the roster the agent sends its own
   children, at the CURVE ports the welcome named (a wildcard host there is the root's
   address in `--join`). Its children call them as `<NAME>/<child>` with the host's key
   (`runtime.remote`, `child_args`).
4. On the same connection the root asks what its operator asks of this host (`ROOT_ASKS`:
   `ctl restart host-a/shard-0`, `ctl rollover host-a`, `ctl stop-host`; `supervisor.hostctl`),
   served as the host's own ctl serves it.

When the lease is lost (`on_lost`: etcd said so, or the host can no longer know it holds it),
every running shard is SIGKILLed at once, so its lanes stop before etcd's side of the lease can
end and the root places them again (ARCHITECTURE.md §12, invariant 15). The shards' supervisor
restarts them, lane-less, and the host joins again under a new lease. At every renewal each
running shard is also handed the lease's deadline (`LeaseHold`), which it keeps by itself
(`shards.deadline`): a frozen agent kills nothing, and its shards still stop in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec
import zmq

from orchestra_sup.cluster.settings import connect
from orchestra_sup.errors import CallTimeout, ErrorCode, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.curve import HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS, REFUSALS
from orchestra_sup.protocol.endpoint import Endpoint, reply_when_done, routing_id
from orchestra_sup.protocol.keys import ClientKeys, load_client_keys
from orchestra_sup.release import describe
from orchestra_sup.supervisor.core import ExitCause
from orchestra_sup.supervisor.hostdata import DataPort
from orchestra_sup.supervisor.shape import HOST_FIXED
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.views import AgentHost
from orchestra_sup.system import cpupolicy

log = logging.getLogger("orchestra_sup.supervisor")

RETRY_S = 1.0
"""Seconds between two `Hello`s the root did not answer."""
REPORT_S = 1.0
"""Seconds between two `HostReport`s."""
ANSWER_S = 5.0
"""Seconds a `Hello` or a report waits for the root's answer."""
LOG_EVERY_S = 10.0
"""At most one "cannot reach the root" line this often."""
WILDCARDS = frozenset({"0.0.0.0", "*", "[::]", "::"})
"""Hosts of a bound address that name every interface, not one to dial."""
ROOT_ASKS = (f.CtlRestart, f.CtlStop, f.CtlRollover, f.CtlRolloverStatus)
"""What the root may ask of its hosts' agents (`supervisor.hostctl`)."""


class HostJoin(msgspec.Struct, frozen=True, kw_only=True):
    """`orchestra-sup host`'s own options: the root's cluster endpoint (`tcp://HOST:PORT`),
    the keys directory holding `server.public` and `<name>.secret`, the host's name, and its
    data port (`tcp://HOST:PORT`, `supervisor.hostdata`; None: none)."""

    root: str
    keys_dir: str
    name: str
    listen: str | None = None


class HostLink:
    """The link of the agent `sup` to the root `join` names (module docstring). The keys are
    read now: raises `ConfigError` when they cannot be. The agent's processes cannot then move
    onto another release in place (`seam.pinned`): an exec would drop the lease this process
    holds, and with it the host's lanes. Its shards roll over (surge and drain); the agent
    itself by restarting it."""

    def __init__(self, sup: AgentHost, join: HostJoin):
        sup.seam.pinned = (
            "this is a host's agent, whose etcd lease an exec would drop: it moves onto a new "
            "release when its unit restarts"
        )
        self.sup = sup
        self.join = join
        self.keys: ClientKeys = load_client_keys(Path(join.keys_dir), join.name)
        self.ctx = cpupolicy.context()
        """The link's and the data port's own context, terminated when `run` ends: the agent's
        is terminated before its tasks are cancelled, and would wait for these sockets."""
        self.lease_id = 0
        """The etcd lease the registration is under now (0: none)."""
        self.welcome: f.HostWelcome | None = None
        """The root's last welcome."""
        self._lease: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        """Set when a child changed state since the last report."""
        self._unreached_logged = -LOG_EVERY_S
        self._refusals: zmq.Socket  # the link's failed handshakes, made by `run`

    async def run(self) -> None:
        """Join, report, join again when the root forgets the host; until cancelled (the
        agent stopping), when the lease is revoked."""
        ep = Endpoint(  # no routing id of its own: the root's listener gives it one
            self.ctx,
            zmq.DEALER,
            name=self.join.name,
            generation=1,
            codec=Codec(),
            handler=self._on_root,
        )
        ep.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)  # a dead root link is seen
        ep.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._refusals = ep.sock.get_monitor_socket(REFUSALS)
        port = None
        try:
            try:
                ep.connect(self.join.root, self.keys)
            except zmq.ZMQError as exc:
                self.sup.refuse(f"--join {self.join.root}: cannot connect: {exc}")
                return
            ep.start()
            if self.join.listen is not None:
                port = self._data_port(self.join.listen)
                if port is None:
                    return
            while True:
                welcome = self.welcome = await self._hello(ep)
                if welcome is None:
                    return
                if self._lease is None:
                    self._lease = asyncio.create_task(self._hold(welcome))
                await self._report(ep)
        finally:
            if self._lease is not None:
                self._lease.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._lease
            if port is not None:
                port.close()
            if not ep.sock.closed:
                ep.sock.disable_monitor()
            self._refusals.close(linger=0)
            ep.close()
            self.ctx.term()

    def _on_root(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        """What the root asks of this host (`supervisor.hostctl`): a restart of one of its
        children, or to stop; served as this host's own ctl serves them. Anything else is
        answered `unexpected`: the root steers no more of a host than that."""
        if not isinstance(env.body, ROOT_ASKS):
            message = f"a host's agent does not do {type(env.body).__name__} for its root"
            ep.reply(env, peer, f.Error(code=ErrorCode.UNEXPECTED, message=message))
            return
        log.info("the root asks: %s", type(env.body).__name__)
        answer = self.sup.ctl_service.answer(ep.caller, env)
        if isinstance(answer, Coroutine):
            self.sup.spawn(reply_when_done(ep, peer, env, answer))
        else:
            ep.reply(env, peer, answer)

    def _data_port(self, address: str) -> DataPort | None:
        """The host's data port at `address`, open; None once the agent is refusing to go on
        (the address cannot be bound)."""
        port = DataPort(self.ctx, address, self.keys, self._route)
        try:
            port.open()
        except zmq.ZMQError as exc:
            self.sup.refuse(f"data port {address}: cannot bind it: {exc}")
            return None
        return port

    def _route(self, name: str, generation: int | None) -> str | None:
        """Where the data port sends a frame for shard `name` at `generation` (`hostdata.Route`;
        called on the port's thread, reading only): that generation's socket while it runs (a
        rollover's surge runs two), else that of the generation standing for the shard, which
        answers a frame for another `stale_generation` itself."""
        children = self.sup.children
        worker = children.by_name.get(name)
        if worker is None or worker.spec.role != "shard":
            return None
        if generation is None or generation not in (worker.generation, worker.retiring):
            generation = children.peer_state(worker).generation
        return children.endpoint(worker, generation)

    async def _hello(self, ep: Endpoint) -> f.HostWelcome | None:
        """The root's welcome, asked for until it comes; None once it refused (the agent is
        then stopping)."""
        info = describe()
        hello = f.Hello(
            role=f.HOST_ROLE,
            name=self.join.name,
            generation=1,
            release=info.python,
            proto_min=info.proto_min,
            proto_max=info.proto_max,
            pid=os.getpid(),
            version=info.version,
        )
        while True:
            try:
                answer = await ep.request(hello, timeout_s=ANSWER_S)
            except (PeerDown, CallTimeout, RemoteError) as exc:
                if self._refusals.poll(0):  # the handshake failed: no retry mends a key
                    self.sup.refuse(
                        f"the root at {self.join.root} refused the CURVE handshake: its server "
                        f"key is not {self.join.keys_dir}/server.public, or it does not allow "
                        f"{self.join.name}.secret as a host's key (keys init --client "
                        f"{self.join.name} --host)"
                    )
                    return None
                self._unreached(exc)
                await asyncio.sleep(RETRY_S)
                continue
            if isinstance(answer, f.HostWelcome):
                log.info("joined the root at %s as host %s", self.join.root, self.join.name)
                return answer
            reason = answer.reason if isinstance(answer, f.Reject) else type(answer).__name__
            self.sup.refuse(f"the root at {self.join.root} refused host {self.join.name}: {reason}")
            return None

    def changed(self) -> None:
        """One of this host's children changed state: report now, not at the next tick."""
        self._changed.set()

    async def _report(self, ep: Endpoint) -> None:
        """Report every `REPORT_S`, and at once after a child changed state, until the root
        answers that it does not know this host."""
        while True:
            self._changed.clear()
            try:
                answer = await ep.request(self.report(), timeout_s=ANSWER_S)
                if isinstance(answer, f.RootPeers):
                    self.sup.children.take_remote([self._reached(p) for p in answer.peers])
            except RemoteError as exc:
                if exc.code == ErrorCode.NOT_FOUND:
                    log.warning("the root forgot this host (%s); saying Hello again", exc.message)
                    return
                log.warning("the root refused a report: %s", exc.message)
            except (PeerDown, CallTimeout) as exc:
                self._unreached(exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPORT_S):
                    await self._changed.wait()

    async def _hold(self, welcome: f.HostWelcome) -> None:
        """Hold the lease the welcome says, for as long as the agent runs, reaching etcd with
        the credentials of the agent's own `[cluster]` (`settings.HOST_KEYS`), at its
        `etcd` when it gives one, else at the welcome's."""
        from orchestra_sup.cluster.lease import HostLease  # aiohttp: only on a host

        own = self.sup.settings.cluster
        settings = msgspec.structs.replace(
            own,
            etcd=own.etcd or tuple(welcome.etcd),
            lease_ttl_s=welcome.lease_ttl_s,
            keepalive_s=welcome.keepalive_s,
        )
        async with connect(settings) as etcd:
            lease = HostLease(
                etcd,
                f"{welcome.prefix}{self.join.name}".encode(),
                msgspec.json.encode(self.registration()),
                on_lost=self._lost,
                on_joined=self._joined,
                on_renewed=self._renewed,
                on_refused=self._etcd_refused,
                ttl_s=welcome.lease_ttl_s,
                every_s=welcome.keepalive_s,
            )
            await lease.run()

    def _etcd_refused(self, reason: str) -> None:
        """etcd refused this host's first registration: stop, saying where its user is set."""
        self.sup.refuse(
            f"{reason}; this host reaches etcd as the user its --config [cluster] gives "
            "(etcd_user, etcd_password_file), which needs its own registration key and lanes "
            '(README, "Hosts on other machines")'
        )

    def _joined(self, lease: int) -> None:
        self.lease_id = lease

    def _renewed(self, stop_by: float) -> None:
        """Hand every running shard the lease's new deadline (`shards.deadline`): past it, a
        shard stops its lanes itself, whether or not this agent still runs to stop them. A
        generation a rollover is draining holds lanes too, and gets it as well."""
        control = self.sup.sockets.control
        if control is None:
            return
        for worker in self.sup.children.workers:
            if worker.spec.role != "shard":
                continue
            live = [worker.generation] if worker.state is ChildState.RUNNING else []
            if worker.retiring is not None:
                live.append(worker.retiring)
            for generation in live:
                with contextlib.suppress(PeerDown):
                    control.send(
                        f.LeaseHold(stop_by=stop_by), to=routing_id(worker.name, generation)
                    )

    def _lost(self) -> None:
        """Stop every lane now: SIGKILL each running shard (its supervisor restarts it), and
        each generation a rollover is draining (its lanes are lost with the lease too)."""
        self.lease_id = 0
        shards = [w for w in self.sup.children.workers if w.spec.role == "shard"]
        running = [w for w in shards if w.state is ChildState.RUNNING]
        log.error("lease lost: stopping %d shards' lanes (SIGKILL) before it can end", len(running))
        for worker in running:
            worker.killed_for = ExitCause.LEASE
            self.sup.seam.signal(worker, signal.SIGKILL)
        for worker in shards:
            if worker.retiring is not None:
                self.sup.seam.signal_retiring(worker.name, worker.retiring, signal.SIGKILL)

    def registration(self) -> dict[str, Any]:
        """What etcd holds for this host: {"name", "boot", "shards", "capabilities", "tenants",
        "lanes_per_shard", "data"}."""
        shards = self.sup.settings.shards
        return {
            "name": self.join.name,
            "boot": self.sup.boot,
            "shards": [w.name for w in self.sup.children.workers if w.spec.role == "shard"],
            "capabilities": list(shards.capabilities),
            "tenants": list(shards.tenants),
            "lanes_per_shard": shards.lanes_per_shard,
            "data": self.join.listen or "",
        }

    def report(self) -> f.HostReport:
        """The host's shards as its supervisor has them now."""
        shards = []
        for worker in self.sup.children.workers:
            if worker.spec.role != "shard":
                continue
            beat = self.sup.children.liveness[worker.name].beat
            running = worker.state is ChildState.RUNNING
            peer = self.sup.children.peer_state(worker)
            shards.append(
                f.HostShard(
                    name=worker.name,
                    state=str(worker.state),
                    generation=peer.generation,
                    pid=worker.pid if running else None,
                    lanes=sum(beat.lanes.values()) if beat is not None else 0,
                    capacity=worker.spec.capacity,
                    up=peer.up,
                    stopping=peer.stopping,
                    draining=peer.draining,
                )
            )
        settings = self.sup.settings.shards
        return f.HostReport(
            boot=self.sup.boot,
            shards=shards,
            capabilities=list(settings.capabilities),
            tenants=list(settings.tenants),
            lease=self.lease_id,
            data=self.join.listen or "",
        )

    def _reached(self, peer: f.PeerState) -> f.PeerState:
        """`peer` at an address this host can dial: a wildcard host is the root's own."""
        host, _, port = peer.endpoint.removeprefix("tcp://").rpartition(":")
        if host not in WILDCARDS:
            return peer
        root = self.join.root.removeprefix("tcp://").rpartition(":")[0]
        return msgspec.structs.replace(peer, endpoint=f"tcp://{root}:{port}")

    def child_args(self, args: ChildArgs) -> ChildArgs:
        """`args` of one of this host's children: it speaks to the root as `<name>/<child>`,
        with the host's keys, and a shard's sandboxes are the host's mirror's."""
        return msgspec.structs.replace(
            args, keys_dir=self.join.keys_dir, host=self.join.name, sandboxes=HOST_FIXED[0]
        )

    def _unreached(self, exc: Exception) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._unreached_logged >= LOG_EVERY_S:
            self._unreached_logged = now
            log.warning(
                "cannot reach the root at %s yet (%s): is a root listening there ([cluster] "
                "listen), and does the network let this host through?",
                self.join.root,
                exc,
            )
