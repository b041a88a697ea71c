"""The runtime of one child process: join the tree, serve, heartbeat, stop on SIGTERM.

A child (coordinator, custodian or shard) is a `Role` plugged into a `Node`. The node:

1. sets `PR_SET_PDEATHSIG` and exits at once if its supervisor is already gone, and raises its
   soft open-file limit to its hard limit (`descriptors.raise_limit`), unless it is a component
   of the supervisor's own process (`runtime.hosting`);
2. lets the role open what it owns (`Role.open`), then binds its ROUTER at
   `<run_dir>/<name>.ipc` (mode 0600), guarded against running out of descriptors
   (`protocol.connections`), and connects a DEALER to the supervisor;
3. says `Hello` and waits for `Welcome` under a deadline: only then is it running;
4. heartbeats its loop lag and descriptors, keeps the `Roster` of peers, and hands every
   request to the role;
5. on SIGTERM or SIGINT, lets the role stop (`Role.close`) and exits 0.

A role may put a `Front` (runtime/front.py) before its loop with `Node.serve_through`: a thread that
owns the public ROUTER, answers the requests the role's `serve` takes, and passes the rest to the
loop.

Requests to peers go through `Node.call`, which refuses at once when the roster says the peer is
down and stamps the peer's generation on the frame, so a replacement never acts on a request meant
for the process it replaced. A peer on another machine (a `tcp://` endpoint) is reached with
CURVE, under the names and keys `runtime.remote` gives. The root's coordinator and custodian,
given `ChildArgs.cluster_listen`, also serve hosts' processes on a CURVE ROUTER of their own,
where a host speaks only for its own processes (`remote.admitted_from_host`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import typing
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

import zmq

from orchestra_sup.errors import ErrorCode, PeerDown, RemoteError
from orchestra_sup.paths import Paths
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.channel import Channel
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.connections import ConnectionGuard, watch
from orchestra_sup.protocol.curve import CLUSTER_DOMAIN, HANDSHAKE_IVL_MS, Gate
from orchestra_sup.protocol.endpoint import (
    Endpoint,
    Handler,
    needs_caller,
    reply_when_done,
    routing_id,
)
from orchestra_sup.protocol.keys import load_server_keys
from orchestra_sup.release import protocol_range, version
from orchestra_sup.runtime import debughooks
from orchestra_sup.runtime.front import LOOP_ID, Front, Serve
from orchestra_sup.runtime.hosting import Hosting, OwnProcess
from orchestra_sup.runtime.looplag import LoopLag
from orchestra_sup.runtime.remote import RemoteLinks, admitted_from_host, is_remote
from orchestra_sup.system import descriptors
from orchestra_sup.system.proctitle import child_title

if typing.TYPE_CHECKING:
    from orchestra_sup.histogram import Buckets
    from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

CONTROL_BODIES = typing.get_args(f.Control)
"""The bodies only the supervisor sends, over the control channel."""

HANDSHAKE_TIMEOUT_S = 10.0


class Role(Protocol):
    """What a child process does. All methods run on the node's loop thread."""

    serves: Channel[Any]
    """The frames its `handle` takes: the node answers any other request with the channel's
    `unsupported` error, and hands `handle` only envelopes of that union."""

    from_hosts: tuple[type, ...]
    """The frames of `serves` a host's process may send it on its hosts' port
    (`ChildArgs.cluster_listen`); any other is refused `forbidden` there."""

    async def open(self, node: Node) -> None:
        """Open what the role owns (state, workspace) before the handshake. Raising here makes
        the child exit non-zero before it ever counts as running."""

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope[Any]) -> None:
        """Serve one request or one-way frame of `serves`. Must not block: use `Node.answer`
        for slow work."""

    def on_roster(self, changed: list[f.PeerState]) -> None:
        """Peers in `changed` went up, went down or changed generation, or a peer left the
        tree (no longer in `Node.peers`, and not in `changed`)."""

    def load(self) -> int:
        """A number that grows with the role's work (lanes, queue depth); sent in heartbeats."""

    def lanes_by_state(self) -> dict[str, int]:
        """Its live lanes by state (a shard; every live state, zeros included); {} elsewhere.
        Sent in heartbeats."""

    def inbox_depth(self) -> int | None:
        """Durable inbox entries not yet handled (the coordinator); None elsewhere."""

    def outbox_depth(self) -> int:
        """Messages to the coordinator not yet acknowledged (a shard's outbox); 0 elsewhere."""

    def persistence(self) -> Store | None:
        """Its write-behind store, whose queue depth and batch sizes heartbeats carry; None
        when it has none."""

    async def close(self) -> None:
        """Stop the role's work and flush its state; called once on SIGTERM."""


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """Which event loop implementation `loop` is, by its top-level package: "uvloop" or
    "asyncio" (another's package name for any other)."""
    return type(loop).__module__.partition(".")[0]


class Node:
    """The child side of the tree. See the module docstring for the lifecycle."""

    def __init__(
        self,
        args: ChildArgs,
        role: Role,
        *,
        hosting: Hosting | None = None,
    ):
        """`hosting`: the process the node runs in (`runtime.hosting`; default: a process of
        its own, `OwnProcess`)."""
        self.args = args
        self.hosting = hosting if hosting is not None else OwnProcess()
        self.role = role
        self.name = args.name
        self.generation = args.generation
        self.paths = Paths(
            state_dir=Path(args.state_dir),
            run_dir=Path(args.run_dir),
            workspace=Path(args.workspace) if args.workspace else None,
        )
        self.codec = Codec()
        self.ctx = self.hosting.ctx
        self.control = self._endpoint(
            zmq.DEALER, self._on_control, identity=routing_id(self.name, self.generation).decode()
        )
        self.server = self._endpoint(zmq.ROUTER, self._on_request)
        self.front: Front | None = None
        self.peers: dict[str, f.PeerState] = {}
        self._links: dict[str, Endpoint] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.lag = LoopLag()
        self.relay: Buckets | None = None
        """Round trips of `call`, seconds from send to answer, when the role set it (the
        coordinator: its relay); heartbeats carry it."""
        self.stopping = asyncio.Event()
        self.stale_frames = 0
        """Requests refused because their sender's generation was retired (ARCHITECTURE.md §11
        invariant 11), reported in heartbeats."""
        self._exit_code = 0
        self.title = self.hosting.title
        """This process's title (`proctitle`); a component shares the supervisor's process."""
        self.guard: ConnectionGuard | None = None
        """The guard of its public `ipc://` socket, while it is bound (none for `inproc://`)."""
        self.remote = RemoteLinks(args.keys_dir, args.host)
        self.cluster: Endpoint | None = None
        """The CURVE port hosts' processes reach this node at (`ChildArgs.cluster_listen`)."""
        self._gate: Gate | None = None
        self.foreign_frames = 0
        """Frames on `cluster` refused because a host spoke for a process not its own."""
        self.fenced = 0
        """Hosts' results or commits the role refused as fenced (`ErrorCode.FENCED`)."""

    # --- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> int:
        if not self.hosting.arm(self.stopping.set, self.args.supervisor_pid):
            return 1  # orphaned before the death signal was armed
        log.info("%s: event loop %s", self.name, loop_kind(asyncio.get_running_loop()))
        self.retitle()
        await self.role.open(self)
        self.retitle()  # what the role opened with (the coordinator's plans not done)
        try:
            return await self._serve()
        finally:
            await self.role.close()
            if self.front is not None:
                self.front.close()  # returns once its thread is out of its current request
            for task in self._tasks:
                task.cancel()
            for ep in (*self._links.values(), self.server, self.control):
                ep.close()
            if self.cluster is not None:
                self.cluster.close()
            if self._gate is not None:
                self._gate.close()
            if self.guard is not None:  # once its socket (the front's, the server's) is closed
                self.guard.close()
            self.hosting.end()

    async def _serve(self) -> int:
        public = self.args.endpoint or self.hosting.endpoint(self.paths, self.name)
        if public.startswith("ipc://"):
            sock = self.server.sock if self.front is None else self.front.router
            self.guard = ConnectionGuard(
                sock, Path(public.removeprefix("ipc://")), name=self.name, process=self.name
            )
            self.guard.start()  # before the front's thread owns its socket
            self.spawn(watch(lambda: [self.guard] if self.guard else []))
        if self.front is None:
            self.server.bind(public)
        else:
            self.front.start(public)
        if public.startswith("ipc://"):
            os.chmod(public.removeprefix("ipc://"), 0o600)
        self.server.start()
        if self.args.cluster_listen:
            self._serve_hosts(self.args.cluster_listen)
        self.control.connect(self.hosting.endpoint(self.paths, "supervisor"))
        self.control.start()
        proto_min, proto_max = protocol_range()
        hello = f.Hello(
            role=self.args.role,
            name=self.name,
            generation=self.generation,
            release=sys.executable,
            proto_min=proto_min,
            proto_max=proto_max,
            pid=os.getpid(),
            version=version(),
        )
        reply = await self.control.request(hello, timeout_s=HANDSHAKE_TIMEOUT_S)
        if isinstance(reply, f.Reject):
            log.error("%s: supervisor rejected the handshake: %s", self.name, reply.reason)
            return 1
        self.spawn(self.lag.run())
        self.spawn(self._heartbeat())
        await self.stopping.wait()
        return self._exit_code

    def _serve_hosts(self, address: str) -> None:
        """Bind the CURVE port hosts' processes reach this node at, its handshakes put to a
        `Gate` of this process admitting hosts' keys only. Raises `ConfigError` when the keys
        cannot be read, `zmq.ZMQError` when `address` cannot be bound (the child exits, and
        its supervisor restarts it)."""
        keys = load_server_keys(Path(self.args.keys_dir or ""))
        self._gate = Gate(self.ctx, keys)
        self._gate.start()  # before the bind: a CURVE socket with no ZAP handler admits all
        self.cluster = self._endpoint(zmq.ROUTER, self._on_host_request)
        self.cluster.sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
        self.cluster.bind(address, keys, CLUSTER_DOMAIN)
        self._gate.watch(self.cluster.sock)
        self.cluster.start()
        log.info("%s: hosts' processes reach it at %s (CURVE)", self.name, address)

    def retitle(self) -> None:
        """Show the role's figure (`Role.load`) in this process's title; nothing is written when
        it has not changed. Roles call it when the figure changes (a lane starts or ends)."""
        if self.title is not None:
            load = self.role.load()
            self.title.show(
                child_title(
                    self.name, self.args.role, self.generation, load, self.args.lanes_per_shard
                )
            )

    def _endpoint(self, kind: int, handler: Handler, **options: Any) -> Endpoint:
        """A socket of this node (its name, generation and codec) on its context."""
        return Endpoint(
            self.ctx,
            kind,
            name=self.name,
            generation=self.generation,
            codec=self.codec,
            handler=handler,
            **options,
        )

    def serve_through(self, serve: Serve) -> None:
        """Put a `Front` before this node's loop: requests `serve` answers (not None) are
        answered on the front's thread as they arrive, everything else reaches the role's
        `handle` as before. Call from `Role.open`. `serve` must not touch loop state."""
        loop = asyncio.get_running_loop()
        # Per generation: a closed inproc:// socket is unbound by libzmq's reaper thread, later,
        # and the next generation binds at once.
        inner = f"inproc://{self.name}.{self.generation}.front"
        self.server.close()  # never bound: the loop is reached through the front now
        self.server = self._endpoint(
            zmq.DEALER, self._on_request, identity=LOOP_ID.decode(), routed=True
        )
        self.front = Front(
            self.ctx,
            name=self.name,
            generation=self.generation,
            serve=serve,
            on_crash=lambda: loop.call_soon_threadsafe(self._front_crashed),
            inner=inner,
            busy_poll_s=self.args.cpu.busy_poll_s,
        )
        self.server.connect(inner)

    def _front_crashed(self) -> None:
        log.error("%s: stopping, its front thread is gone", self.name)
        self._exit_code = 1
        self.stopping.set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` as a task owned by this node (cancelled on stop, errors logged)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task failed", self.name, exc_info=task.exception())

    def answer(
        self,
        ep: Endpoint,
        peer: bytes | None,
        env: f.Envelope,
        work: Coroutine[Any, Any, f.Body],
    ) -> None:
        """Run `work` off the receive loop and reply with its result, or with the `Error` frame
        its exception maps to."""
        self.spawn(reply_when_done(ep, peer, env, work))

    def refused(self) -> tuple[int, int]:
        """(stale, bad): frames refused so far as stale (a retired sender, or meant for another
        generation of this node) and as undecodable, over every socket of this node."""
        eps = self._sockets()
        stale = self.stale_frames + sum(ep.stale_frames for ep in eps)
        return stale, self.foreign_frames + sum(ep.bad_frames for ep in eps)

    def _sockets(self) -> list[Endpoint]:
        """Every socket of this node but its front's."""
        eps = [self.server, self.control, *self._links.values()]
        return eps if self.cluster is None else [*eps, self.cluster]

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(PeerDown):
                self.control.send(self.beat())
            await asyncio.sleep(self.args.heartbeat_s)

    def beat(self) -> f.Heartbeat:
        """This node's heartbeat now: loop lag (window figures and histogram), relay round
        trips, the role's lanes, inbox and write-behind figures, refused frames, requests
        answered `internal`."""
        stale, bad = self.refused()
        role = self.role
        internal = sum(ep.internal_errors for ep in self._sockets())
        if self.front is not None:
            internal += self.front.internal_errors
        store = role.persistence()
        lag = None
        if self.lag.samples:  # before its first sample a loop has no figures, not zeros
            lag = self.lag.figures()
        return f.Heartbeat(
            descriptors=self.descriptors(),
            loop_lag_p50_ms=None if lag is None else lag[0],
            loop_lag_p99_ms=None if lag is None else lag[1],
            loop_lag_max_ms=None if lag is None else lag[2],
            load=role.load(),
            stale_frames=stale,
            bad_frames=bad,
            internal_errors=internal,
            fenced=self.fenced,
            loop_lag=self.lag.buckets.frame() if lag is not None else None,
            relay=self.relay.frame() if self.relay is not None else None,
            lanes=role.lanes_by_state(),
            inbox_depth=role.inbox_depth(),
            outbox_depth=role.outbox_depth(),
            persist_depth=store.queue_depth if store is not None else 0,
            persist_batches=store.batch_rows.frame() if store and store.batches else None,
        )

    def descriptors(self) -> f.Descriptors:
        """This process's descriptors now, and what its guard shut."""
        now = descriptors.usage()
        guard = self.guard
        return f.Descriptors(
            open=now.open,
            limit=now.limit,
            closings=guard.closings if guard is not None else 0,
            shut=[guard.name] if guard is not None and guard.shut else [],
        )

    # --- peers -----------------------------------------------------------------------------------

    def peer_up(self, name: str) -> bool:
        peer = self.peers.get(name)
        return peer is not None and peer.up

    def link(self, name: str) -> Endpoint:
        """The DEALER this node uses to call `name` (created on first use)."""
        ep = self._links.get(name)
        if ep is None:
            peer = self.peers.get(name)
            if peer is None:
                raise PeerDown(name)
            if is_remote(peer.endpoint):
                ep = Endpoint(
                    self.ctx,
                    zmq.DEALER,
                    name=self.remote.sender(self.name),
                    generation=self.generation,
                    codec=self.codec,
                    handler=self._on_request,
                    identity=self.remote.identity(self.name, self.generation, name).decode(),
                )
                ep.sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
                ep.connect(peer.endpoint, self.remote.keys(name))
            else:
                ep = self._endpoint(
                    zmq.DEALER,
                    self._on_request,
                    identity=routing_id(self.name, self.generation).decode(),
                )
                ep.connect(peer.endpoint)
            ep.start()
            self._links[name] = ep
        return ep

    async def call(self, name: str, body: f.Body, *, timeout_s: float) -> f.Body:
        """Request `body` from peer `name` and return its reply.

        Raises `PeerDown` at once when the roster says `name` is down (or when it goes down while
        waiting), `CallTimeout` after `timeout_s` seconds, `RemoteError` for an `Error` reply.
        With `relay` set, each answered call's round trip is counted into it.
        """
        peer = self.peers.get(name)
        if peer is None or not peer.up:
            raise PeerDown(name)
        relay = self.relay
        if relay is None:
            return await self.link(name).request(
                body, timeout_s=timeout_s, dest_gen=peer.generation
            )
        # Timed from send to answer; an `Error` answer is an answer, a timeout or a lost peer
        # is not one (their time says nothing about the round trip).
        sent = time.perf_counter()
        try:
            reply = await self.link(name).request(
                body, timeout_s=timeout_s, dest_gen=peer.generation
            )
        except RemoteError:
            relay.observe(time.perf_counter() - sent)
            raise
        relay.observe(time.perf_counter() - sent)
        return reply

    def send_to(self, name: str, body: f.Body) -> None:
        """Send a one-way frame to `name`; raises `PeerDown` when it is down."""
        peer = self.peers.get(name)
        if peer is None or not peer.up:
            raise PeerDown(name)
        self.link(name).send(body, dest_gen=peer.generation)

    # --- dispatch --------------------------------------------------------------------------------

    def _on_control(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        if isinstance(env.body, f.Roster):
            self._apply_roster(env.body)
            return
        if isinstance(env.body, f.DebugHook):
            self._debug_hook(ep, peer, env, env.body)
            return
        self._serve_request(ep, peer, env)

    def _debug_hook(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope, hook: f.DebugHook
    ) -> None:
        """Fault injection for tests; off unless the tree runs with ORCHESTRA_SUP_DEBUG_HOOKS=1."""
        if os.environ.get("ORCHESTRA_SUP_DEBUG_HOOKS") != "1":
            ep.reply(env, peer, f.Error(code=ErrorCode.FORBIDDEN, message="debug hooks are off"))
            return
        if hook.action == "raise":
            raise RuntimeError(f"debug hook: {self.name}'s handler raises")
        if hook.action == "raise_in_task":
            self.answer(ep, peer, env, debughooks.debug_raise(self.name))
            return
        store = self.role.persistence()
        refused = debughooks.refusal(self.name, hook, store)
        if refused is not None:
            ep.reply(env, peer, refused)
            return
        ep.reply(env, peer, f.Ack())
        debughooks.act(self.name, hook, store)

    def _on_request(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        """Hand a peer's request to the role, unless its sender is a generation the roster has
        retired (older than the current one and not draining): that is refused with
        `stale_generation` and counted. A sender newer than the roster is let through: its
        roster update may simply not have arrived yet. A control-channel body (`frames.Control`:
        `TreeStopping`, `Quiesce`, `Drain`, ...) is refused `forbidden`: the supervisor sends
        those over the control channel, and a peer that sends one here is not it."""
        if isinstance(env.body, CONTROL_BODIES):  # only the supervisor says these, and only
            ep.reply(  # on the control channel (`_on_control`): never a peer
                env,
                peer,
                f.Error(
                    code=ErrorCode.FORBIDDEN,
                    message=f"{type(env.body).__name__} comes only from the supervisor",
                ),
            )
            return
        known = self.peers.get(env.sender)
        if known is not None and env.gen < known.generation and env.gen not in known.draining:
            self.stale_frames += 1
            message = (
                f"{env.sender} generation {env.gen} is retired "
                f"(generation {known.generation} is current)"
            )
            ep.reply(env, peer, f.Error(code=ErrorCode.STALE_GENERATION, message=message))
            return
        self._serve_request(ep, peer, env)

    @needs_caller
    def _on_host_request(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        """A frame on the hosts' port: taken as any peer's (`_on_request`) when a host sends it
        for one of its own processes, else refused `forbidden` and counted."""
        refusal = admitted_from_host(ep.caller, peer, env)
        if refusal is None and not isinstance(env.body, self.role.from_hosts):
            refusal = f"a host's process may not send {type(env.body).__name__} here"
        if refusal is not None:
            self.foreign_frames += 1
            ep.reply(env, peer, f.Error(code=ErrorCode.FORBIDDEN, message=refusal))
            return
        self._on_request(ep, peer, env)

    def _serve_request(self, ep: Endpoint, peer: bytes | None, env: f.Envelope[f.Body]) -> None:
        """Hand `env` to the role when its channel admits it (`Role.serves`), else answer it as
        the channel says."""
        admitted = self.role.serves.admit(ep, peer, env)
        if admitted is not None:
            self.role.handle(ep, peer, admitted)

    def _apply_roster(self, roster: f.Roster) -> None:
        """Take `roster` (always the whole tree) as the peers: a peer it no longer lists (a
        shard a config reload retired) is forgotten and its link closed, and that counts as a
        change the role hears of (`Role.on_roster`, which reads `self.peers`)."""
        changed: list[f.PeerState] = []
        listed = {state.name for state in roster.peers}
        gone = [name for name in self.peers if name not in listed]
        for name in gone:
            del self.peers[name]
            link = self._links.pop(name, None)
            if link is not None:
                link.fail_pending(None, PeerDown(name))
                link.close()
        for state in roster.peers:
            old = self.peers.get(state.name)
            self.peers[state.name] = state
            if old == state:
                continue
            changed.append(state)
            lost = old is not None and (not state.up or old.generation != state.generation)
            link = self._links.get(state.name)
            if lost and link is not None:
                # A fresh connection for the next generation: nothing queued for the old one
                # reaches it, and an inproc:// link (colocated) never reconnects by itself.
                link.fail_pending(None, PeerDown(state.name))
                link.close()
                del self._links[state.name]
        if changed or gone:
            self.role.on_roster(changed)
