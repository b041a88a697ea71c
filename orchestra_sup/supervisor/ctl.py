"""The ctl endpoint: what `orchestra-sup ctl` asks of a running tree.

Answered by the supervisor itself: `status` (from the control record, never waiting on a child),
`restart`, `stop`, `rollover` (`supervisor.rollover`), `reload` (`supervisor.reload`; while one
runs, `restart` and `rollover` are refused busy). Asked of a host's agent: `restart
host-a/shard-0` and `stop-host` (`supervisor.hostctl`). Forwarded to the coordinator as a task,
so a slow or wedged coordinator never holds up the supervisor: `submit`, `plan`, `cancel`,
`call`, `message`, and the HITL answers (`approve`, `reject`, `redirect`, `accept-partial`:
`CtlRespond`), stamped with the caller's identity from the connection. Fanned out to every
shard: `lanes` (with the coordinator's pending approvals merged in), `logs`.

Who may ask (ADR 0012): every request is admitted first (`admit`), from the connection, never
the frame: an `ipc://` caller whose uid is the tree owner's (the supervisor's effective uid),
or a CURVE client whose key the tree allows (`ctl --connect tcp://...`). Anyone else, and a
connection that says nothing of who it is, is answered `Error(forbidden)` and logged with what
the connection did say (uid and pid), and nothing else happens.

How many (issue 24): `ctl.ipc` serves at most `[supervisor] ctl_connections` connections at
once, and none new while the supervisor is near its open-file limit (`guard`,
`protocol.connections`); every request on a connection accepted beyond them is answered
`Error(busy)` saying which, before anything else is looked at.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, assert_never

import msgspec
import zmq

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.channel import Channel
from orchestra_sup.protocol.connections import SHUT_BELOW, ConnectionGuard
from orchestra_sup.protocol.endpoint import (
    Caller,
    Endpoint,
    KeyIdentity,
    PeerCredentials,
    TokenIdentity,
    needs_caller,
    reply_when_done,
    routing_id,
)
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.release import version
from orchestra_sup.runtime.debughooks import debug_raise, debug_spin
from orchestra_sup.runtime.remote import HOST_SEPARATOR
from orchestra_sup.supervisor.core import Supervisor, Worker
from orchestra_sup.supervisor.gate import Busy
from orchestra_sup.supervisor.hostctl import (
    ask_host,
    is_host_target,
    rollover_host,
    rollover_status,
    stop_host,
)
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.views import CtlHost
from orchestra_sup.system.cpupolicy import in_force
from orchestra_sup.system.isolation import effective
from orchestra_sup.system.lanecpu import layer_here

log = logging.getLogger(__name__)

DEFAULT_FORWARD_TIMEOUT_S = 10.0
LOGS_MARGIN_S = 1.0
"""How much sooner than the caller's deadline a `ctl logs` long poll ends at the shard."""
PENDING_WAIT_S = 1.0
"""Seconds `ctl lanes` waits for the coordinator's pending approvals (`ListPending`). It answers
from memory at once; only a wedged or stopped one takes longer, and then the shards' lanes are
answered without them rather than held up for the caller's whole deadline."""

Serves = (
    f.CtlStatus
    | f.CtlStop
    | f.CtlRestart
    | f.CtlStopHost
    | f.CtlSubmit
    | f.CtlPlan
    | f.CtlPlans
    | f.CtlCancel
    | f.CtlCall
    | f.CtlMessage
    | f.CtlBenchRelay
    | f.CtlRollover
    | f.CtlReload
    | f.CtlRolloverStatus
    | f.CtlRespond
    | f.CtlLanes
    | f.CtlLogs
    | f.CtlDebug
    | f.CtlPrune
    | f.CtlEvents
)
"""The requests `orchestra-sup ctl` sends, what `CtlService.handle` takes."""
SERVES = Channel[Serves](Serves, "{} is not a ctl request")


class CtlService:
    """Serves `Ctl*` frames on the supervisor's ctl ROUTER.

    Its handler is `needs_caller`: on `ctl.ipc` (mode 0600 in a 0700 run directory) every
    request comes with its sender's uid, gid and pid from the kernel; on the CURVE `tcp://`
    endpoint, with the name of the client key the handshake admitted. `owner_uid` (default:
    this process's effective uid) is the only uid admitted; `refused` counts the requests
    answered `forbidden` by `admit`.
    """

    def __init__(self, host: CtlHost, owner_uid: int | None = None):
        self.host = host
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.refused = 0

    def admit(self, caller: Caller | None) -> str | None:
        """None when `caller` may steer the tree; else why not, in one line (and counted)."""
        match caller:
            case KeyIdentity() | TokenIdentity():  # checked already: the ZAP gate, the web's
                return None
            case PeerCredentials(uid=uid) if uid == self.owner_uid:
                return None
            case PeerCredentials(uid=uid, pid=pid):
                reason = f"uid {uid} (pid {pid}) is not the tree owner's (uid {self.owner_uid})"
            case None:
                reason = "the connection says nothing of who it is (no uid, no CURVE key)"
            case _:
                assert_never(caller)
        self.refused += 1
        log.warning("ctl: refused a request: %s", reason)
        return reason

    def guard(self, sock: zmq.Socket, path: Path) -> ConnectionGuard:
        """The guard of the ctl socket `sock`, bound at `path`: it answers, at most
        `[supervisor] ctl_connections` (read at each accept: a reload applies it in place),
        its door shut below `connections.SHUT_BELOW` free descriptors."""
        return ConnectionGuard(
            sock,
            path,
            name="ctl",
            process="the supervisor",
            answers=True,
            max_connections=lambda: self.host.settings.supervisor.ctl_connections,
            shut_below=SHUT_BELOW,
        )

    def busy(self, ep: Endpoint) -> str | None:
        """Why the connection the frame `ep` is dispatching came on is refused (its guard's
        `refusal`), or None: it is served, or it is no connection (`inproc://`)."""
        if ep.connection is None:
            return None
        guard = self.host.sockets.guards.get(ep)
        return guard.refusal(ep.connection) if guard is not None else None

    @needs_caller
    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        busy = self.busy(ep)
        if busy is not None:
            ep.reply(env, peer, f.Error(code=ErrorCode.BUSY, message=busy))
            return
        refusal = self.admit(ep.caller)
        if refusal is not None:
            ep.reply(env, peer, f.Error(code=ErrorCode.FORBIDDEN, message=refusal))
            return
        served = SERVES.admit(ep, peer, env)
        if served is None:
            return
        answer = self.answer(ep.caller, served)
        if isinstance(answer, Coroutine):  # answered once it is done, off the receive loop
            self.host.spawn(reply_when_done(ep, peer, env, answer))
        else:
            ep.reply(env, peer, answer)

    async def ask(self, caller: TokenIdentity, body: f.Body, ttl_s: float) -> f.Body:
        """`body` answered as if it had come on ctl from `caller`, waiting at most `ttl_s`
        seconds for a child's part: the HTTP API's way in (`web.api`)."""
        if not isinstance(body, Serves):
            return SERVES.unsupported(body)
        env = f.Envelope(
            v=PROTOCOL_VERSION,
            id="http",
            corr=None,
            sender="http",
            gen=0,
            ttl_s=ttl_s,
            dest_gen=None,
            body=body,
        )
        try:
            answer = self.answer(caller, env)
            return await answer if isinstance(answer, Coroutine) else answer
        except RemoteError as exc:
            return f.Error(code=exc.code, message=exc.message)

    def answer(
        self, caller: Caller | None, env: f.Envelope[Serves]
    ) -> f.Body | Coroutine[Any, Any, f.Body]:
        """The answer to the admitted request `env` from `caller`: a frame at once, or the
        work that answers it."""
        host, body = self.host, env.body
        match body:
            case f.CtlStatus():
                return self.status()
            case f.CtlStop():
                asyncio.get_running_loop().call_soon(host.request_stop)
                return f.Ack()
            case f.CtlRestart(name=name) if HOST_SEPARATOR in name:  # host-a/shard-0
                host_name, _, local = name.partition(HOST_SEPARATOR)
                return ask_host(host, host_name, f.CtlRestart(name=local))
            case f.CtlStopHost():
                return stop_host(host, body)
            case f.CtlRestart(name=name):
                child = host.children.by_name.get(name)
                if child is None:
                    names = ", ".join(host.children.by_name)
                    return f.Error(
                        code=ErrorCode.NOT_FOUND,
                        message=f"no child named {name!r} (children: {names})",
                    )
                return self._restart(child)
            case (
                f.CtlSubmit()
                | f.CtlPlan()
                | f.CtlPlans()
                | f.CtlCancel()
                | f.CtlCall()
                | f.CtlMessage()
                | f.CtlBenchRelay()
                | f.CtlPrune()
            ):
                return self._forward("coordinator", body, env.ttl_s)
            case f.CtlRollover(name=name) if is_host_target(host, name):
                return rollover_host(host, body, env.ttl_s)
            case f.CtlRolloverStatus(id=rollover_id) if HOST_SEPARATOR in rollover_id:
                return rollover_status(host, body)
            case f.CtlRollover() if host.gate.reloading():
                message = "a config reload is in progress; roll over once it is done"
                return f.Error(code=ErrorCode.BUSY, message=message)
            case f.CtlRollover():
                return host.rollovers.begin(body)
            case f.CtlReload():
                return self._reload()
            case f.CtlRolloverStatus():
                return host.rollovers.status(body)
            case f.CtlRespond():
                assert caller is not None  # admitted
                return self._respond(body, caller, env.ttl_s)
            case f.CtlLanes():
                return self._lanes(env.ttl_s)
            case f.CtlLogs():
                return self._logs(body, env.ttl_s)
            case f.CtlEvents():
                return self._events(body)
            case f.CtlDebug(name="supervisor", action="raise") if host.debug_hooks:
                raise RuntimeError("debug hook: the supervisor's ctl handler raises")
            case f.CtlDebug(name="supervisor", action="raise_in_task") if host.debug_hooks:
                return debug_raise("supervisor")
            case f.CtlDebug(name="supervisor", action="spin_loop") if host.debug_hooks:
                debug_spin("supervisor", body.seconds)
                return f.Ack()
            case f.CtlDebug(name="supervisor") if host.debug_hooks:
                message = f"debug action {body.action} is for children, not the supervisor"
                return f.Error(code=ErrorCode.BAD_REQUEST, message=message)
            case f.CtlDebug(name=name) if host.debug_hooks and name in host.children.by_name:
                hook = f.DebugHook(action=body.action, seconds=body.seconds)
                return self._forward(name, hook, env.ttl_s)
            case f.CtlDebug() if not host.debug_hooks:
                message = "debug hooks are off (start the tree with ORCHESTRA_SUP_DEBUG_HOOKS=1)"
                return f.Error(code=ErrorCode.FORBIDDEN, message=message)
            case f.CtlDebug():
                return f.Error(code=ErrorCode.NOT_FOUND, message=f"no child named {body.name!r}")
            case _:
                assert_never(body)

    def status(self) -> f.StatusReply:
        host, sockets = self.host, self.host.sockets
        paths = host.paths
        return f.StatusReply(
            supervisor_pid=os.getpid(),
            version=version(),
            run_dir=str(paths.run_dir),
            state_dir=str(paths.state_dir),
            workspace=(  # a host's agent has none
                str(paths.workspace or paths.state_dir / "workspace")
                if "custodian" in host.children.by_name
                else ""
            ),
            children=[host.children.child_info(w) for w in host.children.workers],
            supervisors=list(_supervisors(host.tree)),
            loop_lag_ms=_rounded(host.lag.figures()),
            release=host.seam.release,
            rollover=host.rollovers.summary(),
            ctl_refused=host.ctl_refused(),
            bad_frames=sockets.bad_frames(),
            stale_frames=sockets.stale_frames(),
            internal_errors=sockets.internal_errors(),
            isolation=effective(host.settings.isolation).mode,
            cpu=in_force(os.getpid()),
            rt_demoted=host.cpu.demoted,
            lane_cpu=f"{layer_here(host.settings.cpu.lanes)}, nice {host.settings.lanes.nice}",
            metrics_url=host.metrics_url,
            state_disk=host.state_disk(),
            http_url=host.http.url,
            http=host.http.counts(),
            descriptors=sockets.descriptors(),
            ctl_connections=sockets.ctl_connections(),
            ctl_connections_max=host.settings.supervisor.ctl_connections,
            cluster_listen=sockets.cluster_listen or "",
            hosts=host.hosts.infos(),
            hosts_refused=host.hosts.refused,
            etcd_quorum=host.hosts.quorum(),
        )

    async def _reload(self) -> f.Body:
        """`ctl reload`: the `ReloadReport`, or `Error(busy)` (`gate.Busy`)."""
        try:
            task = self.host.reloads.begin()
        except Busy as exc:
            raise RemoteError(ErrorCode.BUSY, str(exc)) from None
        return await asyncio.shield(task)  # the caller going away does not cut a reload short

    async def _restart(self, worker: Worker) -> f.Body:
        gate = self.host.gate
        if gate.reloading():  # it restarts, adds and retires children
            raise RemoteError(
                ErrorCode.BUSY,
                f"a config reload is in progress; restart {worker.name} once it is done",
            )
        running = gate.rollover()
        if running is not None:  # it holds the restart lock of what it moves for its whole run
            raise RemoteError(
                ErrorCode.BUSY,
                f"rollover {running.id} of {running.target} is running; restart "
                f"{worker.name} once it is done (ctl rollover prints when)",
            )
        if worker.state not in (ChildState.RUNNING, ChildState.EXITED, ChildState.BACKOFF):
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"{worker.name} is {worker.state}; try again when it is running",
            )
        await self.host.tree.restart_worker(worker)
        return f.Ack()

    async def _forward(
        self, name: str, body: f.Body, ttl_s: float | None, wait_s: float | None = None
    ) -> f.Body:
        """Ask child `name`, waiting until just before the caller's deadline `ttl_s` (seconds;
        None: `DEFAULT_FORWARD_TIMEOUT_S`), or `wait_s` seconds when that is sooner. Returns
        its reply, its `Error` as a body; raises `RemoteError(peer_down)` when it is not
        running, `PeerDown`/`CallTimeout` when it cannot be reached or does not answer."""
        child = self.host.children.by_name.get(name)
        if child is None:  # a host's agent runs no coordinator or custodian
            raise RemoteError(ErrorCode.NOT_FOUND, f"no {name} here: this is a host; ask its root")
        control = self.host.sockets.control
        assert control is not None
        if child.state is not ChildState.RUNNING:
            raise RemoteError(ErrorCode.PEER_DOWN, f"{name} is {child.state}; try again shortly")
        timeout = max(0.1, (ttl_s or DEFAULT_FORWARD_TIMEOUT_S) - 0.2)
        if wait_s is not None:
            timeout = min(timeout, wait_s)
        try:
            return await control.request(
                body,
                to=routing_id(child.name, child.generation),
                timeout_s=timeout,
                dest_gen=child.generation,
            )
        except RemoteError as exc:
            return f.Error(code=exc.code, message=exc.message)

    async def _respond(self, req: f.CtlRespond, caller: Caller, ttl_s: float | None) -> f.Body:
        """Forward `req` to the coordinator as `HitlRespond`, stamped with who `caller` is: an
        `ipc://` caller's uid and user name, a CURVE client's key name as "key:<name>", or an
        HTTP token's as "token:<name>" (uid -1: neither is a user). Nothing of who answered is
        taken from `req` (extra fields a sender adds to the frame are not even decoded).
        Answers `HitlRecorded`, or the coordinator's `Error` (`not_found`, `bad_request`), or
        `peer_down`/`timeout` when it cannot be asked."""
        if isinstance(caller, KeyIdentity):
            responder = f"key:{caller.name}"
        elif isinstance(caller, TokenIdentity):
            responder = f"token:{caller.name}"
        else:
            responder = await asyncio.to_thread(user_name, caller.uid)  # NSS may read files
        return await self._forward("coordinator", stamped(req, caller, responder), ttl_s)

    async def _events(self, req: f.CtlEvents) -> f.Body:
        """A page of the event log (`state.events`), read off the loop."""
        if not 0 <= req.since <= f.MAX_SEQ or req.limit < 1:
            message = f"since must be 0..2**63-1 and limit >= 1 (got {req.since}, {req.limit})"
            return f.Error(code=ErrorCode.BAD_REQUEST, message=message)
        log = self.host.events.log
        if log is None:
            return f.Error(code=ErrorCode.PEER_DOWN, message="the event log is not open")
        return await asyncio.to_thread(log.page, req.since, req.limit, req.plan)

    async def _lanes(self, ttl_s: float | None) -> f.Body:
        """Every shard's live lanes, merged with the coordinator's pending approvals
        (`merge_pending`). A shard or a coordinator that does not answer is left out (the
        coordinator after `PENDING_WAIT_S`) and named in `unanswered`: what the others said is
        still worth showing, and the caller learns what it does not show."""
        shards = [w for w in self.host.children.workers if w.spec.role == "shard"]
        pending, *replies = await asyncio.gather(
            self._forward("coordinator", f.ListPending(), ttl_s, wait_s=PENDING_WAIT_S),
            *(self._forward(c.name, f.ListLanes(), ttl_s) for c in shards),
            return_exceptions=True,
        )
        lanes: list[f.LaneInfo] = []
        unanswered: list[str] = []
        for child, reply in zip(shards, replies, strict=True):
            if isinstance(reply, f.LaneList):
                lanes.extend(reply.lanes)
            else:
                unanswered.append(child.name)
        if isinstance(pending, f.LaneList):
            lanes = merge_pending(lanes, pending.lanes)
        else:
            unanswered.insert(0, "coordinator")
        return f.LaneList(lanes=lanes, unanswered=unanswered)

    async def _logs(self, req: f.CtlLogs, ttl_s: float | None) -> f.Body:
        """Ask every shard for the lane's transcript; the one that knows it answers. A lane id
        lives on one shard (a re-placed task runs as a new lane), so the first found is the one.
        The long poll is cut `LOGS_MARGIN_S` short of the caller's deadline, so the answer still
        reaches it. Raises `RemoteError`: `not_found` when every shard answered and none knows the
        lane, `peer_down` when none that answered does and some did not answer."""
        shards = [w for w in self.host.children.workers if w.spec.role == "shard"]
        budget = max(0.1, (ttl_s or DEFAULT_FORWARD_TIMEOUT_S) - 0.2)
        ask = f.LaneLogs(
            lane=req.lane,
            after_seq=req.after_seq,
            wait_s=min(req.wait_s, max(0.0, budget - LOGS_MARGIN_S)),
            limit=req.limit,
        )
        replies = await asyncio.gather(
            *(self._forward(c.name, ask, ttl_s) for c in shards), return_exceptions=True
        )
        silent = []
        for child, reply in zip(shards, replies, strict=True):
            if isinstance(reply, f.LogChunk) and reply.found:
                return reply
            if not isinstance(reply, f.LogChunk):
                silent.append(child.name)
        if silent:
            raise RemoteError(
                ErrorCode.PEER_DOWN,
                f"no shard that answered knows lane {req.lane!r}; "
                f"{', '.join(silent)} did not answer, try again shortly",
            )
        raise RemoteError(ErrorCode.NOT_FOUND, f"no lane {req.lane!r} on any shard")


def stamped(req: f.CtlRespond, caller: Caller, responder: str) -> f.HitlRespond:
    """`req` as the coordinator gets it: the answer as asked, and who answered as the connection
    says (`caller.uid`, or -1 for a CURVE key; `responder`: the user or key name)."""
    return f.HitlRespond(
        lane=req.lane,
        verdict=req.verdict,
        uid=caller.uid if isinstance(caller, PeerCredentials) else -1,
        responder=responder,
        text=req.text,
        grant=req.grant,
        retries=req.retries,
    )


def user_name(uid: int) -> str:
    """The login name of `uid` (`pwd`), or "uid N" when the user database has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def merge_pending(live: list[f.LaneInfo], pending: list[f.LaneInfo]) -> list[f.LaneInfo]:
    """The shards' `live` lanes with the coordinator's `pending` approvals folded in.

    A pending entry for a lane a shard lists takes that lane's place with the coordinator's
    state, question, since and the answers it takes (the shard's own question and since are
    kept where the coordinator has none) and the shard's placement (shard, sandbox); a pending
    entry with no live lane (a task waiting for
    approval before it runs, or one whose shard is down) is added after the live lanes. Order:
    live lanes as the shards listed them, then the others as the coordinator did.

    A live lane its shard shows waiting for a human that the coordinator does not list yet is
    shown running: its question is on its way to the coordinator (the shard's outbox), and an
    answer now would be refused as nothing waiting there.
    """
    waiting = {p.lane: p for p in pending}
    merged = []
    for lane in live:
        p = waiting.pop(lane.lane, None)
        if p is None and lane.state == "awaiting_approval":
            lane = msgspec.structs.replace(lane, state="running", question=None, since=None)
        if p is not None:
            lane = msgspec.structs.replace(
                lane,
                state=p.state,
                question=p.question if p.question is not None else lane.question,
                since=p.since if p.since is not None else lane.since,
                accepts=p.accepts,
                needs_retries=p.needs_retries,
            )
        merged.append(lane)
    return merged + list(waiting.values())


def _supervisors(sup: Supervisor, parent: str | None = None) -> Iterator[f.SupervisorInfo]:
    """Every supervisor of the tree, parents first, with its children's names in order."""
    yield f.SupervisorInfo(
        name=sup.name,
        parent=parent,
        strategy=str(sup.flags.strategy),
        max_restarts=sup.flags.max_restarts,
        max_seconds=sup.flags.max_seconds,
        children=[c.name for c in sup.children],
    )
    for child in sup.children:
        if isinstance(child, Supervisor):
            yield from _supervisors(child, sup.name)


def _rounded(figures: tuple[float, float, float]) -> tuple[float, float, float]:
    """Loop-lag figures (p50, p99, max, ms) to the microsecond, for `StatusReply.loop_lag_ms`."""
    p50, p99, worst = figures
    return round(p50, 3), round(p99, 3), round(worst, 3)
