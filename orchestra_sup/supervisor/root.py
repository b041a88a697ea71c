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
  endpoint for a remote operator (ADR 0012);
- what a dead child leaves behind: orphans reparented here and, for a shard, its lanes' cgroups;
- re-executing itself onto another release with its children left running (`supervisor.reexec`):
  a `RootSupervisor` given a `Handoff` adopts the tree instead of starting it;
- SIGHUP: the config file read again and applied child by child (`supervisor.reload`).

Exit statuses: `EXIT_OK` after a requested stop, `EXIT_FAILED_START` when the tree could not
start, `EXIT_INTENSITY` when the root's restart intensity was exceeded.
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

from orchestra_sup.config import Paths, Settings
from orchestra_sup.errors import ChildStartError, ConfigError, ErrorCode, PeerDown
from orchestra_sup.histogram import figures_ms
from orchestra_sup.logformat import LogFormat
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.connections import ConnectionGuard, shut_path, watch
from orchestra_sup.protocol.curve import Gate
from orchestra_sup.protocol.endpoint import Endpoint, Handler, routing_id
from orchestra_sup.protocol.keys import ServerKeys, load_server_keys
from orchestra_sup.release import describe, protocol_range
from orchestra_sup.runtime.looplag import LoopLag
from orchestra_sup.supervisor import notify
from orchestra_sup.supervisor.colocated import ColocatedSeam
from orchestra_sup.supervisor.core import ExitCause, Seam, Supervisor, Worker
from orchestra_sup.supervisor.ctl import CtlService, RemoteCtl
from orchestra_sup.supervisor.metrics import MetricsServer, start_server
from orchestra_sup.supervisor.process import kill_orphans
from orchestra_sup.supervisor.reexec import HELD_SIGNALS, Handoff, adopt, check
from orchestra_sup.supervisor.reload import ConfigSource, Reloads
from orchestra_sup.supervisor.rollover import Rollovers
from orchestra_sup.supervisor.runlock import DirLock, RunLock, StateLock
from orchestra_sup.supervisor.seam import ProcessSeam
from orchestra_sup.supervisor.shape import FIXED, child_spec, flags, settings_args, shard_names
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.template import template_for
from orchestra_sup.system import descriptors, linux
from orchestra_sup.system.cgroups import kill_tree_sync, tree_path
from orchestra_sup.system.proctitle import ProcTitle, supervisor_title

log = logging.getLogger("orchestra_sup.supervisor")

EXIT_OK = 0
EXIT_FAILED_START = 1
EXIT_INTENSITY = 3
"""Exit status when restart intensity was exceeded at the root (documented in the README)."""

UP = (ChildState.RUNNING, ChildState.STOPPING)
STOP_ANNOUNCE_S = 2.0
"""Seconds a stop waits for the coordinator to hear the tree is stopping (`_announce_stop`)."""


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


def build_tree(settings: Settings, seam: Seam, on_give_up: Any) -> Supervisor:
    """The tree in start order: custodian, coordinator, then the shards' sub-supervisor
    (`supervisor.shape` says what each child is under `settings`)."""
    tree_flags = flags(settings)

    def worker(name: str) -> Worker:
        return Worker(child_spec(settings, name), tree_flags, seam)

    shards = Supervisor("shards", tree_flags, [worker(n) for n in shard_names(settings)], seam)
    return Supervisor(
        "root",
        tree_flags,
        [*(worker(name) for name in FIXED), shards],
        seam,
        on_give_up=on_give_up,
    )


class RootSupervisor:
    """Runs one tree in the foreground until asked to stop; `run()` returns the exit status.

    With `handoff` (this process is a supervisor that re-executed itself, `supervisor.reexec`)
    `run()` adopts the tree the old image left running instead of starting one; `carried` is
    then the old image's `carry` (None otherwise). `remote_ctl` (or the hand-off's) also
    serves ctl on a CURVE `tcp://` endpoint. `log_format` (or the hand-off's) is how the
    children write their logs, as this process does; `generation` counts this supervisor's
    images (1, one more after each re-exec), for its log lines. `config` (or the hand-off's) is
    where `settings` came from, read again on SIGHUP and `ctl reload` (`supervisor.reload`;
    None: nothing to re-read). Raises `SupervisionError` when the hand-off's children are not
    this tree's, `ConfigError` when `remote_ctl`'s keys cannot be read.
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
    ):
        self.paths = paths
        self.settings = settings
        self.colocated = colocated
        """Every role a component of this process and loop (`supervisor/colocated.py`)."""
        self.ctx = zmq.Context()
        self.seam: ProcessSeam | ColocatedSeam
        if colocated:
            self.seam = ColocatedSeam(self.ctx, self._child_args, self._after_exit, self._changed)
        else:
            self.seam = ProcessSeam(
                self._child_args,
                self._after_exit,
                self._changed,
                template_for(settings.supervisor),
            )
        self.tree = build_tree(settings, self.seam, lambda: self.request_stop(EXIT_INTENSITY))
        self.workers = list(self.tree.workers())
        self.by_name = {w.name: w for w in self.workers}
        self.liveness = {w.name: Liveness() for w in self.workers}
        self.lag = LoopLag()
        self.codec = Codec()
        self.control: Endpoint | None = None
        self.ctl: Endpoint | None = None
        self.remote_ctl = handoff.remote_ctl if handoff is not None else remote_ctl
        self.remote_keys: ServerKeys | None = None
        if self.remote_ctl is not None:
            self.remote_keys = load_server_keys(Path(self.remote_ctl.keys_dir))
        self.remote: Endpoint | None = None
        """The ctl service on `remote_ctl.endpoint`, while the sockets are open."""
        self.guards: dict[Endpoint, ConnectionGuard] = {}
        """The guards of `control` and `ctl` (`protocol.connections`), while they are open."""
        self.gate: Gate | None = None
        """The ZAP handler that admits `remote_keys`' clients, while `remote` is open."""
        self.ctl_service = CtlService(self)
        self._stop = asyncio.Event()
        self._exit_code = EXIT_OK
        self._tasks: set[asyncio.Task[Any]] = set()
        self.debug_hooks = os.environ.get("ORCHESTRA_SUP_DEBUG_HOOKS") == "1"
        self._cgroups = tree_path(paths.run_dir)
        self._last_summary = ""
        self.endpoints: dict[tuple[str, int], str] = {}
        """Where the live process of each (child, generation) listens."""
        self.boot = uuid.uuid4().hex[:12] if handoff is None else handoff.boot
        """This run of the tree; generations start again at 1 in the next, boot ids do not (a
        re-exec is the same run)."""
        self.handoff = handoff
        self.carried = handoff.carry if handoff is not None else None
        """What the image this one re-executed from passed on (`reexec`'s `carry`), or None;
        set before `rollovers` is built, so it can take up a rollover in progress."""
        self.rollovers = Rollovers(self)
        self.reloads = Reloads(self, handoff.config if handoff is not None else config)
        self.unheard: set[str] = set()
        self.adopting = False
        """`supervisor.reexec.adopt` is taking the children back one by one: no roster goes out
        until all are (one sent midway would show the rest down, and the coordinator would
        lose their lanes)."""
        """Adopted children not heard from since the re-exec: each is sent the roster again
        at its first heartbeat (until its DEALER has reconnected, a send to it fails)."""
        self.dir_locks: tuple[DirLock, DirLock] | None = None
        """The run and state directories' locks, while `run()` holds them."""
        self.title = ProcTitle()
        self.log_format = handoff.log_format if handoff is not None else log_format
        self.generation = handoff.generation if handoff is not None else 1
        self.metrics: MetricsServer | None = None
        """The Prometheus endpoint (`[supervisor] metrics_port`), while `run()` serves it."""
        if handoff is not None:
            check(handoff, self.workers)
            self.seam.release = handoff.release

    # --- the whole tree --------------------------------------------------------------------------

    async def run(self) -> int:
        before, now = descriptors.raise_limit()
        if before != now:
            log.info("open-file limit raised from %d to %d (its hard limit)", before, now)
        lock, state_lock = self.dir_locks = self._lock_dirs()
        self._retitle()
        if not self.colocated:  # components' lane commands are waited for by asyncio
            linux.set_child_subreaper()  # kept across a re-exec's execve; said again anyway
        if self._cgroups is not None and self.handoff is None:
            kill_tree_sync(self._cgroups)  # what a crashed tree on this run dir left running
        loop = asyncio.get_running_loop()
        try:
            self.open_sockets()
            self._serve_metrics()  # a port in use fails here, before any child starts
        except BaseException:
            self.close_sockets(0.0)
            state_lock.release()
            lock.release()
            raise
        if self.handoff is not None:
            adopt(self, self.handoff)  # before anything awaits: see `reexec.adopt`
        self.spawn(self.lag.run())
        self.spawn(watch(lambda: self.guards.values()))
        if (ping := notify.watchdog_interval()) is not None:  # a re-exec's new image too
            self.spawn(notify.keep_alive(ping))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.reloads.on_sighup)
        if not self.colocated:
            loop.add_signal_handler(signal.SIGCHLD, self.seam.on_sigchld)
        # Blocked across the exec (`reexec.HELD_SIGNALS`), or SIGHUP since `start` began: one
        # sent meanwhile lands now, on its handler.
        signal.pthread_sigmask(
            signal.SIG_UNBLOCK, HELD_SIGNALS if self.handoff is not None else {signal.SIGHUP}
        )
        if self.handoff is not None:
            self.seam.on_sigchld()  # orphans whose SIGCHLD fell into the exec
        try:
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
            if not self.colocated:
                kill_orphans(self.seam.known_pids())
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
            self._close_endpoints(0.0)
            # colocated: a component SIGKILLed (cancelled) may still hold sockets of this context
            self.ctx.destroy(linger=0) if self.colocated else self.ctx.term()
            state_lock.release()
            lock.release()
        log.info("tree stopped (exit status %d)", self._exit_code)
        return self._exit_code

    def open_sockets(self) -> None:
        """Bind and start `supervisor.ipc` (the children's control socket, `control`) and
        `ctl.ipc` (`ctl`), each made mode 0600, and with `remote_ctl` the ZAP `gate` and the
        CURVE `tcp://` ctl endpoint (`remote`), on `ctx`. On the loop. Raises `zmq.ZMQError`
        when an ipc socket cannot be bound, `ConfigError` when the tcp endpoint cannot (what
        was opened stays open: `close_sockets` closes it)."""

        def router(handler: Handler) -> Endpoint:
            return Endpoint(
                self.ctx,
                zmq.ROUTER,
                name="supervisor",
                generation=1,
                codec=self.codec,
                handler=handler,
            )

        self.control, self.ctl = router(self._on_control), router(self.ctl_service.handle)
        self.guards = {
            self.control: ConnectionGuard(
                self.control.sock,
                self.paths.run_dir / "supervisor.ipc",
                name="supervisor",
                process="the supervisor",
            ),
            self.ctl: self.ctl_service.guard(self.ctl.sock, self.paths.run_dir / "ctl.ipc"),
        }
        for ep, name in ((self.control, "supervisor"), (self.ctl, "ctl")):
            self.guards[ep].start()
            ep.bind(self.paths.endpoint(name))
            os.chmod(self.paths.run_dir / f"{name}.ipc", 0o600)
            ep.start()
        if self.colocated:
            self.control.bind(self.child_endpoint("supervisor"))
        if self.remote_ctl is not None and self.remote_keys is not None:
            self.gate = Gate(self.ctx, self.remote_keys)
            self.gate.start()  # before the bind: a CURVE socket with no ZAP handler admits all
            self.remote = router(self.ctl_service.handle)
            try:
                self.remote.bind(self.remote_ctl.endpoint, self.remote_keys)
            except zmq.ZMQError as exc:
                raise ConfigError(
                    f"ctl endpoint {self.remote_ctl.endpoint}: cannot bind it: {exc}"
                ) from exc
            self.gate.watch(self.remote.sock)
            self.remote.start()
            log.info("ctl also served on %s (CURVE)", self.remote_ctl.endpoint)

    def close_sockets(self, linger_s: float) -> None:
        """Close the sockets and terminate `ctx`, giving frames already sent `linger_s`
        seconds to leave (blocks the loop that long at most); `ctx` is then a fresh context,
        for `open_sockets` should the caller need them again. Not for a colocated tree once
        its components run."""
        self._close_endpoints(linger_s)
        self.ctx.destroy(linger=round(linger_s * 1000))
        self.ctx = zmq.Context()

    def _close_endpoints(self, linger_s: float) -> None:
        if self.gate is not None:
            self.gate.close()
        for ep in (self.control, self.ctl, self.remote):
            if ep is not None:
                ep.close(linger_s)
        for guard in self.guards.values():  # once their sockets are closed
            guard.close()
        self.guards = {}

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
        return self.ctl_service.refused + (self.gate.refused if self.gate is not None else 0)

    def _lock_dirs(self) -> tuple[DirLock, DirLock]:
        """Take the run and state directories' locks, or, adopting, the ones the old image
        held (no gap, and the children's sockets in the run directory are left alone).
        Raises `DirBusy` or `ConfigError`."""
        if self.handoff is not None:
            return (
                RunLock.inherited(self.handoff.run_lock_fd, self.paths.run_dir),
                StateLock.inherited(self.handoff.state_lock_fd, self.paths.state_dir),
            )
        lock = RunLock(self.paths.run_dir)
        try:
            return lock, StateLock(self.paths.state_dir)
        except BaseException:
            lock.release()
            raise

    async def _start_tree(self) -> None:
        try:
            await self.tree.start()
        except ChildStartError as exc:
            log.error("%s; stopped what was started", exc)
            print(f"orchestra-sup: {exc}", file=sys.stderr)
            self._exit_code = EXIT_FAILED_START
            self._stop.set()
        else:
            self.spawn(self._watchdog())
            log.info("tree ready: %d children, run dir %s", len(self.workers), self.paths.run_dir)
            notify.ready(self.summary())

    def _adopted(self) -> None:
        """The adopted tree is ready: each child gets a full `watchdog_s` from now to be heard
        again (its DEALER reconnects within a few hundred ms), and the roster is sent out."""
        now = time.monotonic()
        for name in self.unheard:
            self.liveness[name].last_beat = now
        self.broadcast_roster()
        self.spawn(self._watchdog())
        log.info("tree adopted: %d children, run dir %s", len(self.workers), self.paths.run_dir)
        notify.ready(self.summary())
        if self.handoff is not None:
            self.rollovers.adopted(len(self.workers), self.handoff.exec_at)

    async def _announce_stop(self) -> None:
        """Tell the coordinator the tree is stopping (bounded: a wedged one is not waited for)."""
        coordinator = self.by_name["coordinator"]
        if self.control is None or coordinator.state is not ChildState.RUNNING:
            return
        with contextlib.suppress(Exception):
            await self.control.request(
                f.TreeStopping(),
                to=routing_id(coordinator.name, coordinator.generation),
                timeout_s=STOP_ANNOUNCE_S,
                dest_gen=coordinator.generation,
            )

    @property
    def stopping(self) -> bool:
        """The tree has been asked to stop."""
        return self._stop.is_set()

    def request_stop(self, exit_code: int = EXIT_OK) -> None:
        """Stop the tree (SIGTERM, SIGINT, `ctl stop`, or escalation with `EXIT_INTENSITY`)."""
        if exit_code != EXIT_OK:
            self._exit_code = exit_code
        self._stop.set()

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

    def report_status(self) -> None:
        """Send systemd `STATUS=` with `summary()` when it differs from the last one sent."""
        summary = self.summary()
        if summary != self._last_summary:
            self._last_summary = summary
            notify.send(f"STATUS={summary}")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- seam callbacks --------------------------------------------------------------------------

    def _child_args(self, worker: Worker) -> ChildArgs:
        # A surge generation binds beside the running one, which still holds `<name>.ipc`; a
        # component binds `inproc://<name>.<generation>`, since libzmq unbinds a closed inproc
        # socket later, on its reaper thread, and the next generation binds at once.
        beside = worker.retiring is not None or self.colocated
        name = f"{worker.name}.{worker.generation}" if beside else worker.name
        endpoint = self.child_endpoint(name)
        self.endpoints[(worker.name, worker.generation)] = endpoint
        return ChildArgs(
            endpoint=endpoint,
            role=worker.spec.role,
            name=worker.name,
            generation=worker.generation,
            run_dir=str(self.paths.run_dir),
            state_dir=str(self.paths.state_dir),
            workspace=str(self.paths.workspace) if self.paths.workspace else None,
            supervisor_pid=os.getpid(),
            boot=self.boot,
            **settings_args(self.settings, worker.spec.role),
            log_format=self.log_format,
            keys_dir=self.remote_ctl.keys_dir if self.remote_ctl is not None else None,
        )

    def _after_exit(self, worker: Worker, generation: int) -> None:
        """Kill what the dead process of `worker` at `generation` left behind: its lanes'
        cgroups (a shard), and orphans reparented to us (we are the subreaper), identified by
        (pid, create time)."""
        endpoint = self.endpoints.pop((worker.name, generation), None)
        # its socket file (or its shut door's), unless a live generation listens there too
        if endpoint and endpoint.startswith("ipc://") and endpoint not in self.endpoints.values():
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
            shut_path(Path(endpoint.removeprefix("ipc://"))).unlink(missing_ok=True)
        if self.control is not None:  # requests in flight to it will never be answered
            self.control.fail_pending(routing_id(worker.name, generation), PeerDown(worker.name))
        if worker.spec.role == "shard" and self._cgroups is not None:
            subtree = self._cgroups / f"{worker.name}.{generation}"
            self.spawn(asyncio.to_thread(kill_tree_sync, subtree))
        # (while a helper is being spawned, an unknown child may be that helper)
        if (
            worker.state is not ChildState.STOPPING
            and not self.colocated
            and not self.seam.spawning_helper()
        ):
            kill_orphans(self.seam.known_pids())

    def _changed(self, worker: Worker) -> None:
        if worker.state is ChildState.STARTING:
            live = self.liveness[worker.name]
            live.lag_ms = live.beat = None  # a new process: no figures of its own yet
        if worker.state is ChildState.RUNNING:
            self.liveness[worker.name].last_beat = time.monotonic()
        if worker.leaving:
            self.reloads.changed(worker)
        if not self.adopting:
            self.broadcast_roster()
        self._retitle()
        self.report_status()

    def _retitle(self) -> None:
        running = sum(w.state is ChildState.RUNNING for w in self.workers)
        self.title.show(supervisor_title(running, len(self.workers)))

    # --- control channel -------------------------------------------------------------------------

    def _on_control(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        body = env.body
        # Who sent it is the connection's routing id (name.generation), never what the frame
        # says: a heartbeat naming a child from some other socket keeps nothing alive.
        worker = next((w for w in self.workers if routing_id(w.name, w.generation) == peer), None)
        match body:
            case f.Hello():
                self._on_hello(ep, peer, env, body)
            case f.Heartbeat() if worker is not None and worker.state is ChildState.RUNNING:
                if worker.name in self.unheard:
                    self._heard_again(worker, peer)
                live = self.liveness[worker.name]
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
                target = self.by_name.get(name)
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
        self.unheard.discard(worker.name)
        if self.control is not None:
            with contextlib.suppress(PeerDown):
                self.control.send(self.roster(), to=peer)
        if not self.unheard and self.handoff is not None:
            log.info(
                "every adopted child heard again %.1f ms after the exec",
                (time.monotonic() - self.handoff.exec_at) * 1000,
            )

    def _on_hello(self, ep: Endpoint, peer: bytes | None, env: f.Envelope, hello: f.Hello) -> None:
        worker = self.by_name.get(hello.name)
        low, high = protocol_range()
        if not (hello.proto_min <= high and hello.proto_max >= low):
            reason: str | None = (
                f"{hello.name} (orchestra-sup {hello.version or 'unknown'}) speaks protocol "
                f"{hello.proto_min}..{hello.proto_max}, the supervisor (orchestra-sup "
                f"{describe().version}) {low}..{high}"
            )
        elif peer != routing_id(hello.name, hello.generation):
            reason = f"{hello.name} must connect as {hello.name}.{hello.generation}"
        else:
            reason = self.seam.welcome(hello.name, hello.generation, hello.pid, worker)
        if reason is not None or worker is None:
            ep.reply(env, peer, f.Reject(reason=reason or f"no child named {hello.name!r}"))
            return
        worker.version = hello.version
        ep.reply(env, peer, f.Welcome(generation=worker.generation))

    def child_endpoint(self, name: str) -> str:
        """Where child `name` (or, for "supervisor", the control socket) is reached by the
        children: `ipc://` in the run directory, or `inproc://` when colocated."""
        return f"inproc://{name}" if self.colocated else self.paths.endpoint(name)

    def endpoint(self, worker: Worker, generation: int | None = None) -> str:
        """Where `worker`'s process at `generation` (default: its current one) listens."""
        generation = worker.generation if generation is None else generation
        return self.endpoints.get((worker.name, generation), self.child_endpoint(worker.name))

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
        self._retitle()

    def roster(self) -> f.Roster:
        return f.Roster(peers=[self.peer_state(w) for w in self.workers])

    def broadcast_roster(self) -> None:
        """Tell every running child who is up, where, and at which generation."""
        if self.control is None:
            return
        roster = self.roster()
        for worker in self.workers:
            live = [worker.generation] if worker.state in UP else []
            if worker.retiring is not None:  # it finds its successor in the roster
                live.append(worker.retiring)
            for generation in live:
                with contextlib.suppress(Exception):
                    self.control.send(roster, to=routing_id(worker.name, generation))

    def child_info(self, worker: Worker) -> f.ChildInfo:
        """One worker as `ctl status` shows it."""
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
            loop_lag_ms=self.liveness[worker.name].lag_ms,
            capabilities=list(worker.spec.capabilities),
            tenants=list(worker.spec.tenants),
            release=(worker.release or self.seam.release) if worker.pid is not None else "",
            version=worker.version if worker.pid is not None else "",
            stale_frames=self.liveness[worker.name].stale_frames,
            bad_frames=self.liveness[worker.name].bad_frames,
            **self._beat_info(self.liveness[worker.name].beat),
        )

    @staticmethod
    def _beat_info(beat: f.Heartbeat | None) -> dict[str, Any]:
        """`ChildInfo`'s fields from a child's last heartbeat: relay (p50, p99, max) in ms
        estimated from its histogram (`histogram.figures_ms`: bucket upper bounds), lanes by
        state, inbox and write-behind depths, requests answered `internal`, descriptors."""
        if beat is None:
            return {}
        return {
            "internal_errors": beat.internal_errors,
            "relay_ms": figures_ms(beat.relay),
            "lanes": dict(beat.lanes),
            "inbox_depth": beat.inbox_depth,
            "persist_depth": beat.persist_depth,
            "descriptors": beat.descriptors,
        }

    async def _watchdog(self) -> None:
        """SIGKILL a running child whose heartbeats stopped for `watchdog_s`. Silence is only
        the child's fault if this loop was there to hear it: when the watchdog itself wakes more
        than half of `watchdog_s` late (the supervisor was stopped, swapped out, its VM paused),
        every child's silence is forgiven from now, instead of every child being killed for
        the supervisor's own stall."""
        while True:
            limit = self.settings.supervisor.watchdog_s  # a config reload may change it
            period = min(1.0, limit / 4)
            asked = time.monotonic()
            await asyncio.sleep(period)
            now = time.monotonic()
            if now - asked - period > limit / 2:
                log.warning(
                    "supervisor loop stalled %.1f s; children's silence forgiven", now - asked
                )
                for live in self.liveness.values():
                    live.last_beat = max(live.last_beat, now)
                continue
            for worker in self.workers:
                silent = now - self.liveness[worker.name].last_beat
                if worker.state is ChildState.RUNNING and silent > limit:
                    log.error(
                        "child %s gen=%d silent for %.1f s (watchdog %g s); killing",
                        worker.name,
                        worker.generation,
                        silent,
                        limit,
                    )
                    worker.killed_for = ExitCause.WATCHDOG
                    self.seam.signal(worker, signal.SIGKILL)
