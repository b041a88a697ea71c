"""The root supervisor process: the tree, its sockets, its control record.

Shape (ARCHITECTURE.md §4): a one_for_one root over custodian, coordinator and a `shards`
sub-supervisor, itself one_for_one over shard-0 .. shard-N-1; restarts, intensity, escalation
and backoff are `core.Supervisor`'s, processes are `seam.ProcessSeam`'s. This module adds what
only the root has:

- the run and state directory locks, the subreaper bit, and SIGTERM/SIGINT/SIGCHLD handling;
- `supervisor.ipc`: handshakes (`Hello` is welcomed only from the routing id of the generation
  being started), heartbeats (credited to the connection, never to a name in the frame), and the
  `Roster` pushed to every child whenever a child's state changes;
- the watchdog: a child silent for `watchdog_s` is SIGKILLed, and its exit is handled like any;
- `ctl.ipc` (`supervisor.ctl`), and, with `RemoteCtl`, the same service on a CURVE `tcp://`
  endpoint for a remote operator (ADR 0012); with `[cluster] listen`, the hosts' agents'
  endpoint (`supervisor.hosts`, ADR 0022);
- what a dead child leaves behind: orphans reparented here and, for a shard, its lanes' cgroups;
- re-executing itself onto another release with its children left running (`supervisor.reexec`):
  a `RootSupervisor` given a `Handoff` adopts the tree instead of starting it, and `resume` is
  the new image's whole life;
- SIGHUP: the config file read again and applied child by child (`supervisor.reload`).

Its collaborators (the ctl service, the metrics, reloads, rollovers, the re-exec) each get a
narrow view of it (`supervisor.views`); the children table is `supervisor.children`, the
sockets `supervisor.sockets`, and a reload and a rollover exclude each other through
`supervisor.gate`.

Exit statuses: `EXIT_OK` after a requested stop, `EXIT_FAILED_START` when the tree could not
start, `EXIT_REFUSED` when a host's agent was refused by its root, `EXIT_INTENSITY` when the
root's restart intensity was exceeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import zmq

from orchestra_sup.config import Settings, SupervisorSettings
from orchestra_sup.errors import (
    ChildStartError,
    ConfigError,
    ErrorCode,
    OrchestraError,
    PeerDown,
)
from orchestra_sup.logformat import SUPERVISOR, LogFormat, configure
from orchestra_sup.paths import Paths
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.connections import shut_path, watch
from orchestra_sup.protocol.endpoint import Endpoint, routing_id
from orchestra_sup.release import skew
from orchestra_sup.runtime.looplag import LoopLag
from orchestra_sup.supervisor import notify
from orchestra_sup.supervisor.children import Children
from orchestra_sup.supervisor.colocated import ColocatedSeam
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.cpu import SupervisorCpu, previous_exit
from orchestra_sup.supervisor.ctl import CtlService
from orchestra_sup.supervisor.events import SupervisorEvents
from orchestra_sup.supervisor.gate import ChangeGate
from orchestra_sup.supervisor.hostlink import HostJoin, HostLink
from orchestra_sup.supervisor.hosts import Hosts
from orchestra_sup.supervisor.httpserve import HttpServer
from orchestra_sup.supervisor.metrics import MetricsServer, start_server
from orchestra_sup.supervisor.reexec import (
    HELD_SIGNALS,
    Handoff,
    adopt,
    check,
    read_handoff,
    stop_children,
)
from orchestra_sup.supervisor.reload import Reloads
from orchestra_sup.supervisor.rollover import Rollovers
from orchestra_sup.supervisor.runlock import DirLock, lock_dirs
from orchestra_sup.supervisor.seam import ProcessSeam
from orchestra_sup.supervisor.shape import (
    FIXED,
    HOST_FIXED,
    SHARD_STOP_MARGIN_S,
    build_tree,
    settings_args,
)
from orchestra_sup.supervisor.sockets import RemoteCtl, RootSockets
from orchestra_sup.supervisor.source import ConfigSource
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.template import template_for
from orchestra_sup.supervisor.watchdog import watchdog
from orchestra_sup.system import descriptors, v1cgroups
from orchestra_sup.system.cgroups import kill_tree_sync, tree_path
from orchestra_sup.system.reserve import DiskReserve, DiskSpace

log = logging.getLogger("orchestra_sup.supervisor")

EXIT_OK = 0
EXIT_FAILED_START = 1
EXIT_REFUSED = 2
"""Exit status of a host's agent its root refused (its key, its name): bad input, as `start`'s."""
EXIT_INTENSITY = 3
"""Exit status when restart intensity was exceeded at the root (documented in the README)."""

STOP_ANNOUNCE_S = 2.0
"""Seconds a stop waits for the coordinator to hear the tree is stopping (`_announce_stop`)."""


class RootSupervisor:
    """Runs one tree in the foreground until asked to stop; `run()` returns the exit status.

    With `handoff` (this process is a supervisor that re-executed itself, `supervisor.reexec`)
    `run()` adopts the tree the old image left running instead of starting one, and the
    rollover that asked for it takes up the old image's `carry`. `remote_ctl` (or the
    hand-off's) also serves ctl on a CURVE `tcp://` endpoint. `log_format` (or the hand-off's)
    is how the children write their logs, as this process does; `generation` counts this
    supervisor's images (1, one more after each re-exec), for its log lines. `config` (or the
    hand-off's) is where `settings` came from, read again on SIGHUP and `ctl reload`
    (`supervisor.reload`; None: nothing to re-read). With `join` it is a host's agent: its tree
    is only shards, and it joins the root `join` names (`supervisor.hostlink`). Raises
    `SupervisionError` when the hand-off's children are not this tree's, `ConfigError` when
    `remote_ctl`'s or `join`'s keys cannot be read, or `colocated` with `[cluster] listen`.
    """

    def __init__(
        self,
        paths: Paths,
        settings: Settings,
        *,
        colocated: bool = False,
        handoff: Handoff | None = None,
        remote_ctl: RemoteCtl | None = None,
        log_format: LogFormat = LogFormat.TEXT,
        config: ConfigSource | None = None,
        join: HostJoin | None = None,
    ):
        if colocated and settings.cluster.listen:  # one context: one ZAP handler, the root's
            raise ConfigError("[cluster] listen needs a process per role; not with --colocated")
        self.paths = paths
        self.settings = settings
        self.cpu = SupervisorCpu(settings)  # before its first thread: ZeroMQ's take its class
        self.sockets = RootSockets(
            paths,
            handoff.remote_ctl if handoff is not None else remote_ctl,
            settings.cluster.listen,
            settings.cluster.keys,
        )
        self.hosts = Hosts(
            lambda: self.settings.supervisor.watchdog_s,
            lambda: self.settings.cluster,
            lambda: self.children.root_peers(self.settings.cluster),
            lambda: self.children.take_remote(self.hosts.peers()),
        )
        self.seam: ProcessSeam | ColocatedSeam
        """Processes, or, `colocated`, every role a component of this process and loop
        (`supervisor/colocated.py`)."""
        if colocated:
            self.seam = ColocatedSeam(
                self.sockets.ctx, self._child_args, self._after_exit, self._changed
            )
        else:
            self.seam = ProcessSeam(
                self._child_args,
                self._after_exit,
                self._changed,
                template_for(settings.supervisor),
                paths=paths,
            )
        self.tree = build_tree(
            settings,
            self.seam,
            self._gave_up,
            HOST_FIXED if join else FIXED,
        )
        self.link = HostLink(self, join) if join is not None else None
        """A host's agent's link to its root (`supervisor.hostlink`); None for a root."""
        self.children = Children(list(self.tree.workers()), self.seam, self.sockets)
        self.lag = LoopLag()
        self.ctl_service = CtlService(self)
        rebind = handoff.http_bound if handoff is not None else None
        self.http = HttpServer(self.ctl_service, paths.state_dir, self.sockets.keys_dir, rebind)
        self._stop = asyncio.Event()
        self._exit_code = EXIT_OK
        self._tasks: set[asyncio.Task[Any]] = set()
        self.debug_hooks = os.environ.get("ORCHESTRA_SUP_DEBUG_HOOKS") == "1"
        self._cgroups = tree_path(paths.run_dir)
        self._last_summary = ""
        self.boot = uuid.uuid4().hex[:12] if handoff is None else handoff.boot
        """This run of the tree; generations start again at 1 in the next, boot ids do not (a
        re-exec is the same run)."""
        self.handoff = handoff
        self.gate = ChangeGate()
        """Held by the config reload or the rollover in progress: one change at a time."""
        self.events = SupervisorEvents(
            f"{join.name}/supervisor" if join is not None else "supervisor"
        )
        """The event log as this supervisor writes it, while `run()` runs (`supervisor.events`)."""
        self.rollovers = Rollovers(self, self.gate, handoff.carry if handoff is not None else None)
        self.reloads = Reloads(self, self.gate, handoff.config if handoff is not None else config)
        self.dir_locks: tuple[DirLock, DirLock] | None = None
        """The run and state directories' locks, while `run()` holds them."""
        self.log_format = handoff.log_format if handoff is not None else log_format
        self.generation = handoff.generation if handoff is not None else 1
        self.metrics: MetricsServer | None = None
        """The Prometheus endpoint (`[supervisor] metrics_port`), while `run()` serves it."""
        if handoff is not None:
            check(handoff, self.children.workers)
            self.seam.release = handoff.release

    @property
    def config(self) -> ConfigSource | None:
        """Where the settings in force came from (`reload.Reloads.source`)."""
        return self.reloads.source

    # --- the whole tree --------------------------------------------------------------------------

    async def run(self) -> int:
        before, now = descriptors.raise_limit()
        if before != now:
            log.info("open-file limit raised from %d to %d (its hard limit)", before, now)
        handoff = self.handoff
        held = (handoff.run_lock_fd, handoff.state_lock_fd) if handoff is not None else None
        lock, state_lock = self.dir_locks = lock_dirs(self.paths, held)
        self.events.open(self.paths.state_dir)
        self.children.retitle()
        if self._cgroups is not None and self.handoff is None:
            kill_tree_sync(self._cgroups)  # what a crashed tree on this run dir left running
            v1cgroups.sweep(self._cgroups.name)
        loop = asyncio.get_running_loop()
        try:
            self.open_sockets()
            self._serve_metrics()  # a port in use fails here, before any child starts
        except BaseException:
            self.sockets.close(0.0)
            self.events.close()
            state_lock.release()
            lock.release()
            raise
        if self.handoff is not None:
            self.events.adopting = True  # re-adopted, not restarted: no child events
            adopt(self, self.handoff)  # before anything awaits: see `reexec.adopt`
            self.events.adopting = False
        self.spawn(self.lag.run())
        self.spawn(self.hosts.follow())
        self.spawn(watch(lambda: self.sockets.guards.values()))
        self.cpu.start_guard(self.seam.known_pids)
        if (ping := notify.watchdog_interval()) is not None:  # a re-exec's new image too
            self.spawn(notify.keep_alive(ping))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.reloads.on_sighup)
        self.seam.watch_orphans(loop)
        # Blocked across the exec (`reexec.HELD_SIGNALS`), or SIGHUP since `start` began: one
        # sent meanwhile lands now, on its handler.
        signal.pthread_sigmask(
            signal.SIG_UNBLOCK, HELD_SIGNALS if self.handoff is not None else {signal.SIGHUP}
        )
        if self.handoff is not None:
            self.seam.on_sigchld()  # orphans whose SIGCHLD fell into the exec
        try:
            await self.http.open(self.settings.http)  # before any child: a port in use
            await self.seam.open()
            if self.handoff is not None:
                self._adopted()
            else:
                await self._start_tree()
            await self._stop.wait()
            notify.stopping()
            await self._announce_stop()  # first: the coordinator places nothing from now on
            await self.rollovers.cancel()
            await self.reloads.cancel()
            await self.tree.stop()
            await self.seam.close()
            if self._cgroups is not None:
                kill_tree_sync(self._cgroups)
                v1cgroups.sweep(self._cgroups.name)
            self.seam.kill_orphans()
            self.seam.on_sigchld()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            # a reload asked while the tree stops is moot; its default action would kill this
            # process before it has released its locks and said how it ended
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            for task in list(self._tasks):
                task.cancel()
            if self.metrics is not None:
                self.metrics.close()
            await self.http.close()
            self.sockets.close_endpoints(0.0)
            self.seam.close_context(self.sockets.ctx)
            self.events.close()
            state_lock.release()
            lock.release()
            self.cpu.close()  # last: every child is reaped
        log.info("tree stopped (exit status %d)", self._exit_code)
        return self._exit_code

    def open_sockets(self) -> None:
        """Bind and start the sockets (`sockets.RootSockets.open`): the control channel served
        here, ctl by `ctl_service`. On the loop. Raises `zmq.ZMQError` or `ConfigError` as
        `open` does."""
        self.sockets.open(
            self._on_control,
            self.ctl_service.handle,
            self.ctl_service.guard,
            self.seam.endpoint("supervisor"),
            self.hosts.handle,
        )

    def _serve_metrics(self) -> None:
        """Serve Prometheus metrics when `[supervisor] metrics_port` is set
        (`metrics.start_server`). At start, raises `ConfigError` when its address cannot be
        bound; after a re-exec the tree is already running and its children would die with
        this process, so the error is logged and the tree goes on without metrics."""
        sup = self.settings.supervisor
        if sup.metrics_port is None:
            return
        try:
            self.metrics = start_server(self, sup.metrics_host, sup.metrics_port)
        except ConfigError as exc:
            if self.handoff is None:
                raise
            log.error("metrics not served after the re-exec: %s", exc)
            return
        log.info("metrics served at %s", self.metrics.url)

    @property
    def metrics_url(self) -> str:
        """Where the metrics are scraped, "" when they are not served."""
        return self.metrics.url if self.metrics is not None else ""

    def ctl_refused(self) -> int:
        """Ctl requests refused `forbidden`, plus tcp peers refused at the CURVE handshake."""
        return self.ctl_service.refused + self.sockets.refused_at_handshake()

    def state_disk(self) -> DiskSpace | None:
        """The state disk against `[state] min_free`; None on a host's agent (no plans)."""
        if "coordinator" not in self.children.by_name:
            return None
        return DiskReserve(self.paths.state_dir, self.settings.min_free).space()

    async def _start_tree(self) -> None:
        try:
            await self.tree.start()
        except ChildStartError as exc:
            log.error("%s; stopped what was started", exc)
            print(f"orchestra-sup: {exc}", file=sys.stderr)
            self._exit_code = EXIT_FAILED_START
            self._stop.set()
        else:
            self.spawn(watchdog(self.children, self.seam, self._watchdog_s))
            if self.link is not None:
                self.spawn(self.link.run())
            log.info(
                "tree ready: %d children, run dir %s",
                len(self.children.workers),
                self.paths.run_dir,
            )
            notify.ready(self.children.summary())

    def _adopted(self) -> None:
        """The adopted tree is ready: each child gets a full `watchdog_s` from now to be heard
        again (its DEALER reconnects within a few hundred ms), and the roster is sent out."""
        children = self.children
        now = time.monotonic()
        for name in children.unheard:
            children.liveness[name].last_beat = now
        children.broadcast_roster()
        self.spawn(watchdog(self.children, self.seam, self._watchdog_s))
        log.info("tree adopted: %d children, run dir %s", len(children.workers), self.paths.run_dir)
        notify.ready(children.summary())
        if self.handoff is not None:
            self.rollovers.adopted(len(children.workers), self.handoff.exec_at)

    async def _announce_stop(self) -> None:
        """Tell the coordinator the tree is stopping (bounded: a wedged one is not waited for)."""
        coordinator = self.children.by_name.get("coordinator")  # none on a host's agent
        control = self.sockets.control
        if control is None or coordinator is None or coordinator.state is not ChildState.RUNNING:
            return
        with contextlib.suppress(Exception):
            await control.request(
                f.TreeStopping(),
                to=routing_id(coordinator.name, coordinator.generation),
                timeout_s=STOP_ANNOUNCE_S,
                dest_gen=coordinator.generation,
            )

    @property
    def stopping(self) -> bool:
        """The tree has been asked to stop."""
        return self._stop.is_set()

    def _gave_up(self) -> None:
        flags = self.tree.flags
        detail = f"{flags.max_restarts} restarts in {flags.max_seconds:g} s; the tree stops"
        self.events.emit("supervisor.escalated", child=self.tree.name, detail=detail)
        self.request_stop(EXIT_INTENSITY)

    def request_stop(self, exit_code: int = EXIT_OK) -> None:
        """Stop the tree (SIGTERM, SIGINT, `ctl stop`, or escalation with `EXIT_INTENSITY`)."""
        if exit_code != EXIT_OK:
            self._exit_code = exit_code
        self._stop.set()

    def refuse(self, reason: str) -> None:
        """Stop with `EXIT_REFUSED`, `reason` in the log and on stderr (a host's agent that its
        root refused: only its operator can mend that)."""
        log.error("%s; stopping", reason)
        print(f"orchestra-sup: {reason}", file=sys.stderr)
        self.request_stop(EXIT_REFUSED)

    def report_status(self) -> None:
        """Send systemd `STATUS=` with `summary()` when it differs from the last one sent."""
        summary = self.children.summary()
        if summary != self._last_summary:
            self._last_summary = summary
            notify.send(f"STATUS={summary}")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _watchdog_s(self) -> float:
        return self.settings.supervisor.watchdog_s

    # --- seam callbacks --------------------------------------------------------------------------

    def _child_args(self, worker: Worker) -> ChildArgs:
        endpoint = self.seam.child_endpoint(worker)
        self.children.endpoints[(worker.name, worker.generation)] = endpoint
        args = ChildArgs(
            endpoint=endpoint,
            role=worker.spec.role,
            name=worker.name,
            generation=worker.generation,
            run_dir=str(self.paths.run_dir),
            state_dir=str(self.paths.state_dir),
            workspace=str(self.paths.workspace) if self.paths.workspace else None,
            supervisor_pid=os.getpid(),
            boot=self.boot,
            previous_exit=previous_exit(worker),
            **settings_args(self.settings, worker.spec.role),
            log_format=self.log_format,
            keys_dir=self.sockets.keys_dir,
        )
        return args if self.link is None else self.link.child_args(args)

    def _after_exit(self, worker: Worker, generation: int) -> None:
        """Kill what the dead process of `worker` at `generation` left behind: its lanes'
        cgroups (a shard), and orphans reparented to us (we are the subreaper), identified by
        (pid, create time)."""
        endpoints = self.children.endpoints
        endpoint = endpoints.pop((worker.name, generation), None)
        # its socket file (or its shut door's), unless a live generation listens there too
        if endpoint and endpoint.startswith("ipc://") and endpoint not in endpoints.values():
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
            shut_path(Path(endpoint.removeprefix("ipc://"))).unlink(missing_ok=True)
        control = self.sockets.control
        if control is not None:  # requests in flight to it will never be answered
            control.fail_pending(routing_id(worker.name, generation), PeerDown(worker.name))
        if worker.spec.role == "shard" and self._cgroups is not None:
            subtree = self._cgroups / f"{worker.name}.{generation}"
            self.spawn(asyncio.to_thread(_bury, subtree))
        # (while a helper is being spawned, an unknown child may be that helper)
        if worker.state is not ChildState.STOPPING and not self.seam.spawning_helper():
            self.seam.kill_orphans()

    def _changed(self, worker: Worker) -> None:
        self.events.child(worker)
        children = self.children
        if worker.state is ChildState.STARTING:
            live = children.liveness[worker.name]
            live.lag_ms = live.beat = None  # a new process: no figures of its own yet
        if worker.state is ChildState.RUNNING:
            children.liveness[worker.name].last_beat = time.monotonic()
        if worker.leaving:
            self.reloads.changed(worker)
        if not children.adopting:
            children.broadcast_roster()
        if self.link is not None:  # its root's roster follows this host's at once
            self.link.changed()
        children.retitle()
        self.report_status()

    # --- control channel -------------------------------------------------------------------------

    def _on_control(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        body, children = env.body, self.children
        # Who sent it is the connection's routing id (name.generation), never what the frame
        # says: a heartbeat naming a child from some other socket keeps nothing alive.
        worker = next(
            (w for w in children.workers if routing_id(w.name, w.generation) == peer), None
        )
        match body:
            case f.Hello():
                self._on_hello(ep, peer, env, body)
            case f.Heartbeat() if worker is not None and worker.state is ChildState.RUNNING:
                if worker.name in children.unheard:
                    self._heard_again(worker, peer)
                live = children.liveness[worker.name]
                live.last_beat = time.monotonic()
                p50, p99, worst = body.loop_lag_p50_ms, body.loop_lag_p99_ms, body.loop_lag_max_ms
                if p50 is not None and p99 is not None and worst is not None:
                    live.lag_ms = (round(p50, 3), round(p99, 3), round(worst, 3))
                live.load = body.load
                if worker.leaving:
                    self.reloads.heard(worker, body)
                self.report_status()
                live.stale_frames = body.stale_frames
                live.bad_frames = body.bad_frames
                live.beat = body
            case f.Heartbeat():
                pass  # from a generation that is gone, or from no child at all
            case f.RecoverChild(name=name) if worker is not None and worker.name == "coordinator":
                target = children.by_name.get(name)
                if target is not None and target.expedite():
                    log.info("child %s: backoff ended early (the coordinator needs it)", name)
                ep.reply(env, peer, f.Ack())
            case _:  # a request: children send no other one-way frame than `Heartbeat`
                log.warning("supervisor: unexpected %s from %r", type(body).__name__, peer)
                message = f"the supervisor does not serve {type(body).__name__} from {peer!r}"
                ep.reply(env, peer, f.Error(code=ErrorCode.UNEXPECTED, message=message))

    def _heard_again(self, worker: Worker, peer: bytes | None) -> None:
        """An adopted child's first heartbeat since the re-exec: its DEALER has reconnected,
        so the roster, which could not reach it before, is sent to it now."""
        unheard, control = self.children.unheard, self.sockets.control
        unheard.discard(worker.name)
        if control is not None:
            with contextlib.suppress(PeerDown):
                control.send(self.children.roster(), to=peer)
        if not unheard and self.handoff is not None:
            log.info(
                "every adopted child heard again %.1f ms after the exec",
                (time.monotonic() - self.handoff.exec_at) * 1000,
            )

    def _on_hello(self, ep: Endpoint, peer: bytes | None, env: f.Envelope, hello: f.Hello) -> None:
        worker = self.children.by_name.get(hello.name)
        reason = skew(hello.name, hello.version, hello.proto_min, hello.proto_max)
        if reason is None and peer != routing_id(hello.name, hello.generation):
            reason = f"{hello.name} must connect as {hello.name}.{hello.generation}"
        elif reason is None:
            reason = self.seam.welcome(hello.name, hello.generation, hello.pid, worker)
        if reason is not None or worker is None:
            ep.reply(env, peer, f.Reject(reason=reason or f"no child named {hello.name!r}"))
            return
        worker.version = hello.version
        ep.reply(env, peer, f.Welcome(generation=worker.generation))


def resume(fd: int) -> int:
    """`orchestra-sup start --adopt FD`: the new image's whole life. Reads the `Handoff` at
    descriptor `fd`, then runs the tree it describes, adopted (`RootSupervisor.run`), and
    returns run's exit status. Logging is configured again from the hand-off (the old image's
    `--log-format`, this image's generation); until it is read, lines are text, `gen=?`.

    The old image is gone, so a new image that cannot adopt cannot roll back: it says why in
    one line on stderr, stops every child it inherited (`stop_children`) and returns
    `EXIT_FAILED_START`, so systemd restarts the tree afresh. What can fail here is what
    `release.probe` could not see before the exec: the hand-off unreadable (this release reads
    another schema), the locks not inherited, a socket that cannot be bound, or a tree of
    another shape (this release builds other children from the same settings).
    """
    settings, run_dir = None, None
    try:
        handoff = read_handoff(fd)
        configure(SUPERVISOR, handoff.generation, handoff.log_format)
        settings, run_dir = handoff.settings, Path(handoff.run_dir)
        return asyncio.run(RootSupervisor(handoff.paths(), handoff.settings, handoff=handoff).run())
    except (OrchestraError, OSError, zmq.ZMQError) as exc:
        log.error("the re-executed supervisor cannot go on: %s; stopping its children", exc)
        print(f"orchestra-sup: cannot adopt the tree: {exc}", file=sys.stderr)
        sup_settings = settings.supervisor if settings is not None else SupervisorSettings()
        stop_children(sup_settings.shutdown_timeout_s + SHARD_STOP_MARGIN_S)
        cgroups = tree_path(run_dir) if run_dir is not None else None
        if cgroups is not None:
            kill_tree_sync(cgroups)
            v1cgroups.sweep(cgroups.name)
        return EXIT_FAILED_START


def _bury(subtree: Path) -> None:
    """Kill what a dead shard generation's lanes left (its cgroup `subtree`), then remove its
    directories in the v1 hierarchies (blocking: run off the loop)."""
    kill_tree_sync(subtree)
    v1cgroups.sweep(subtree.parent.name, subtree.name)
