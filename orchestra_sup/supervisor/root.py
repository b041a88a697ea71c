"""The root supervisor: starts the tree, restarts what dies, stops it all in reverse order.

Shape (ARCHITECTURE.md §4): one_for_one over custodian, coordinator and the shards, started in
that order and stopped in reverse. Each child is its own OS process and process group, spawned
from the loop thread (so `PR_SET_PDEATHSIG` stays armed for the supervisor's life) and watched
through a pidfd on the loop. The supervisor is a child subreaper: what a dead child leaves behind
is reparented here, killed and reaped.

A child counts as running only once it has said `Hello` and been welcomed, under a deadline. A
child that exits is restarted with its generation bumped; more than `max_restarts` restarts within
`max_seconds` stop the whole tree with `EXIT_INTENSITY`, so systemd's `Restart=on-failure` can take
over. A child that stops heartbeating for `watchdog_s` is killed, then restarted as any exit is.

The supervisor never sits on the data path between children and never awaits a child inline: ctl
requests that a child must answer are forwarded as tasks, so `ctl status` is always answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import Any

import zmq

from orchestra_sup import linux
from orchestra_sup.config import Paths, Settings
from orchestra_sup.errors import ChildStartError
from orchestra_sup.node.args import ChildArgs, encode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.endpoint import Endpoint, routing_id
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN, compatible
from orchestra_sup.supervisor import notify
from orchestra_sup.supervisor.intensity import Backoff, RestartIntensity
from orchestra_sup.supervisor.process import ChildProcess, kill_orphans, reap_orphans
from orchestra_sup.supervisor.runlock import RunLock, StateLock
from orchestra_sup.supervisor.spec import ALLOWED, ChildSpec, ChildState, Restart

log = logging.getLogger("orchestra_sup.supervisor")

EXIT_OK = 0
EXIT_FAILED_START = 1
EXIT_INTENSITY = 3
"""Exit status when restart intensity was exceeded at the root (documented in the README)."""

HANDSHAKE_TIMEOUT_S = 15.0


class Child:
    """The control record of one child: spec, generation, process, counters, lifecycle state."""

    def __init__(self, spec: ChildSpec, settings: Settings):
        self.spec = spec
        self.generation = 0
        self.state = ChildState.STOPPED
        self.proc: ChildProcess | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.operator_restarts = 0
        self.last_exit: f.ExitInfo | None = None
        self.last_beat = 0.0
        self.lag_p99_ms: float | None = None
        self.load = 0
        self.welcomed: asyncio.Future[None] | None = None
        self.exited: asyncio.Future[None] | None = None
        sup = settings.supervisor
        self.backoff = Backoff(sup.backoff_initial_s, sup.backoff_max_s, sup.max_seconds)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def routing_id(self) -> bytes:
        """The routing id this generation of the child connects with."""
        return routing_id(self.name, self.generation)

    def transition(self, new: ChildState) -> None:
        """The only writer of `state`; refuses a transition the lifecycle does not allow."""
        if new not in ALLOWED[self.state]:
            raise AssertionError(f"{self.name}: {self.state} -> {new} is not a transition")
        log.info("child %s gen=%d %s -> %s", self.name, self.generation, self.state, new)
        self.state = new

    def info(self, paths: Paths) -> f.ChildInfo:
        up = self.state in (ChildState.RUNNING, ChildState.STOPPING)
        return f.ChildInfo(
            name=self.name,
            role=self.spec.role,
            pid=self.proc.pid if self.proc and self.proc.exit is None else None,
            generation=self.generation,
            state=str(self.state),
            restarts=self.restarts,
            operator_restarts=self.operator_restarts,
            uptime_s=round(time.monotonic() - self.started_at, 3) if up else 0.0,
            last_exit=self.last_exit,
            endpoint=paths.endpoint(self.name),
            capacity=self.spec.capacity,
            loop_lag_p99_ms=self.lag_p99_ms,
        )


def child_specs(settings: Settings) -> list[ChildSpec]:
    """The tree in start order: custodian, coordinator, shard-0 .. shard-N-1."""
    grace = settings.supervisor.shutdown_timeout_s
    specs = [
        ChildSpec(name="custodian", role="custodian", shutdown_s=grace),
        ChildSpec(name="coordinator", role="coordinator", shutdown_s=grace),
    ]
    specs += [
        ChildSpec(
            name=f"shard-{i}",
            role="shard",
            shutdown_s=grace,
            capacity=settings.shards.lanes_per_shard,
        )
        for i in range(settings.shards.count)
    ]
    return specs


class RootSupervisor:
    """Runs one tree in the foreground until asked to stop; `run()` returns the exit status."""

    def __init__(self, paths: Paths, settings: Settings):
        self.paths = paths
        self.settings = settings
        self.children = [Child(spec, settings) for spec in child_specs(settings)]
        self.by_name = {c.name: c for c in self.children}
        self._by_pid: dict[int, Child] = {}
        sup = settings.supervisor
        self.intensity = RestartIntensity(sup.max_restarts, sup.max_seconds)
        self.codec = Codec()
        self.ctx: zmq.Context | None = None
        self.control: Endpoint | None = None
        self.ctl: Endpoint | None = None
        self._stop = asyncio.Event()
        self._stopping = False
        self._booting = True
        self._exit_code = EXIT_OK
        self._tasks: set[asyncio.Task[Any]] = set()
        self.started_at = time.monotonic()

    # --- the whole tree --------------------------------------------------------------------------

    async def run(self) -> int:
        from orchestra_sup.supervisor.ctl import CtlService

        lock = RunLock(self.paths.run_dir)
        try:
            state_lock = StateLock(self.paths.state_dir)
        except BaseException:
            lock.release()
            raise
        linux.set_child_subreaper()
        loop = asyncio.get_running_loop()
        self.ctx = zmq.Context()
        self.control = Endpoint(
            self.ctx,
            zmq.ROUTER,
            name="supervisor",
            generation=1,
            codec=self.codec,
            handler=self._on_control,
        )
        self.ctl = Endpoint(
            self.ctx,
            zmq.ROUTER,
            name="supervisor",
            generation=1,
            codec=self.codec,
            handler=CtlService(self).handle,
        )
        for ep, name in ((self.control, "supervisor"), (self.ctl, "ctl")):
            ep.bind(self.paths.endpoint(name))
            os.chmod(self.paths.run_dir / f"{name}.ipc", 0o600)
            ep.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGCHLD, self._on_sigchld)
        try:
            try:
                for child in self.children:
                    await self._start_child(child)
            except ChildStartError as exc:
                log.error("%s; stopping what was started", exc)
                print(f"orchestra-sup: {exc}", file=sys.stderr)
                self._exit_code = EXIT_FAILED_START
                self._stop.set()
            else:
                self._booting = False
                self.spawn(self._watchdog())
                log.info(
                    "tree ready: %d children, run dir %s", len(self.children), self.paths.run_dir
                )
                notify.send(f"READY=1\nSTATUS={self.summary()}")
            await self._stop.wait()
            notify.send("STOPPING=1")
            await self._stop_all()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                loop.remove_signal_handler(sig)
            for task in list(self._tasks):
                task.cancel()
            self.control.close()
            self.ctl.close()
            self.ctx.term()
            state_lock.release()
            lock.release()
        return self._exit_code

    def request_stop(self, exit_code: int = EXIT_OK) -> None:
        """Stop the tree (SIGTERM, SIGINT, `ctl stop`, or escalation with `EXIT_INTENSITY`)."""
        if exit_code != EXIT_OK:
            self._exit_code = exit_code
        self._stop.set()

    def summary(self) -> str:
        running = sum(c.state == ChildState.RUNNING for c in self.children)
        return f"{running}/{len(self.children)} children running"

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _stop_all(self) -> None:
        self._stopping = True
        for child in reversed(self.children):
            await self.stop_child(child)
        kill_orphans(set(self._by_pid))
        self._on_sigchld()

    # --- one child -------------------------------------------------------------------------------

    async def _start_child(self, child: Child) -> None:
        """Spawn `child` with the next generation and wait for its handshake.

        Raises `ChildStartError` when it exits first or misses the deadline (it is killed then).
        """
        loop = asyncio.get_running_loop()
        child.generation += 1
        args = ChildArgs(
            role=child.spec.role,
            name=child.name,
            generation=child.generation,
            run_dir=str(self.paths.run_dir),
            state_dir=str(self.paths.state_dir),
            workspace=str(self.paths.workspace) if self.paths.workspace else None,
            lanes_per_shard=self.settings.shards.lanes_per_shard,
            supervisor_pid=os.getpid(),
            heartbeat_s=min(0.5, self.settings.supervisor.watchdog_s / 4),
        )
        argv = [sys.executable, "-m", "orchestra_sup.node", encode(args)]
        child.transition(ChildState.STARTING)
        child.welcomed = loop.create_future()
        try:
            proc = ChildProcess.spawn(argv)
        except OSError as exc:
            child.transition(ChildState.EXITED)
            raise ChildStartError(child.name, f"cannot exec {argv[0]}: {exc}") from exc
        child.proc = proc
        self._by_pid[proc.pid] = child
        proc.watch(loop.add_reader, lambda: self._on_exit(child, proc))
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await asyncio.shield(child.welcomed)
        except TimeoutError:
            proc.signal(signal.SIGKILL)
            raise ChildStartError(
                child.name, f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s"
            ) from None

    async def stop_child(self, child: Child) -> None:
        """Ask, wait, kill, reap: SIGTERM, up to `shutdown_s`, then SIGKILL (brutal_kill: SIGKILL
        at once). Returns once the process has been reaped."""
        proc = child.proc
        if proc is None or proc.exit is not None:
            if child.state in (ChildState.EXITED, ChildState.BACKOFF):
                child.transition(ChildState.STOPPED)
            return
        child.transition(ChildState.STOPPING)
        child.exited = asyncio.get_running_loop().create_future()
        if child.spec.shutdown_s is None:
            proc.signal(signal.SIGKILL)
        else:
            proc.signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(child.spec.shutdown_s):
                    await asyncio.shield(child.exited)
            except TimeoutError:
                log.warning(
                    "child %s ignored SIGTERM for %g s; killing", child.name, child.spec.shutdown_s
                )
                proc.signal(signal.SIGKILL)
        await child.exited
        child.transition(ChildState.STOPPED)

    async def operator_restart(self, child: Child) -> None:
        """`ctl restart`: a graceful stop and a start with the next generation. Not a failure: it
        counts in `operator_restarts`, never towards intensity, and waits for no backoff."""
        child.operator_restarts += 1
        await self.stop_child(child)
        await self._start_child(child)

    def _on_exit(self, child: Child, proc: ChildProcess) -> None:
        loop = asyncio.get_running_loop()
        exit_info = proc.reap(loop.remove_reader)
        if exit_info is None or child.proc is not proc:
            return
        self._by_pid.pop(proc.pid, None)
        child.last_exit = exit_info
        log.info(
            "child %s gen=%d pid=%d exited: %s",
            child.name,
            child.generation,
            proc.pid,
            f"signal {exit_info.signal}" if exit_info.signal else f"status {exit_info.status}",
        )
        if child.state is not ChildState.STOPPING:
            kill_orphans(set(self._by_pid))
        was = child.state
        child.transition(ChildState.EXITED)
        self.broadcast_roster()
        if was is ChildState.STOPPING:
            if child.exited is not None and not child.exited.done():
                child.exited.set_result(None)
            return
        if child.welcomed is not None and not child.welcomed.done():
            child.welcomed.set_exception(ChildStartError(child.name, _describe(exit_info)))
            child.welcomed.exception()  # retrieved here; the starter re-raises it
        if self._stopping or self._booting:
            return
        self._after_failure(child, exit_info)

    def _after_failure(self, child: Child, exit_info: f.ExitInfo) -> None:
        abnormal = exit_info.signal is not None or exit_info.status != 0
        if child.spec.restart is Restart.TEMPORARY or (
            child.spec.restart is Restart.TRANSIENT and not abnormal
        ):
            child.transition(ChildState.STOPPED)
            return
        if not self.intensity.record():
            log.error(
                "restart intensity exceeded (%d in %g s); stopping the tree",
                self.intensity.max_restarts,
                self.intensity.max_seconds,
            )
            self.request_stop(EXIT_INTENSITY)
            return
        child.restarts += 1
        delay = child.backoff.next_delay(time.monotonic() - child.started_at)
        self.spawn(self._restart(child, delay))

    async def _restart(self, child: Child, delay_s: float) -> None:
        if delay_s > 0:
            child.transition(ChildState.BACKOFF)
            await asyncio.sleep(delay_s)
        if self._stopping or child.state not in (ChildState.EXITED, ChildState.BACKOFF):
            return
        try:
            await self._start_child(child)
        except ChildStartError as exc:
            log.error("%s", exc)  # its exit, already handled, scheduled the next attempt

    def _on_sigchld(self) -> None:
        reap_orphans(self._by_pid.keys(), self._reap_known)

    def _reap_known(self, pid: int) -> None:
        child = self._by_pid.get(pid)
        if child is not None and child.proc is not None and child.proc.pid == pid:
            self._on_exit(child, child.proc)

    # --- control channel -------------------------------------------------------------------------

    def _on_control(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        body = env.body
        # Who sent it is the connection's routing id (name.generation), never what the frame
        # says: a heartbeat naming a child from some other socket keeps nothing alive.
        child = next((c for c in self.children if c.routing_id == peer), None)
        match body:
            case f.Hello():
                self._on_hello(ep, peer, env, body)
            case f.Heartbeat() if child is not None and child.state is ChildState.RUNNING:
                child.last_beat = time.monotonic()
                child.lag_p99_ms = round(body.loop_lag_p99_ms, 3)
                child.load = body.load
            case f.Heartbeat():
                pass  # from a generation that is gone, or from no child at all
            case _:
                log.warning("supervisor: unexpected %s from %s", type(body).__name__, env.sender)

    def _on_hello(self, ep: Endpoint, peer: bytes | None, env: f.Envelope, hello: f.Hello) -> None:
        child = self.by_name.get(hello.name)
        reason = None
        if child is None:
            reason = f"no child named {hello.name!r}"
        elif not compatible(hello.proto_min, hello.proto_max):
            reason = (
                f"{hello.name} speaks protocol {hello.proto_min}..{hello.proto_max}, "
                f"the supervisor {PROTOCOL_MIN}..{PROTOCOL_MAX}"
            )
        elif (
            child.state is not ChildState.STARTING
            or peer != routing_id(hello.name, hello.generation)
            or hello.generation != child.generation
            or child.proc is None
            or hello.pid != child.proc.pid
        ):
            reason = f"{hello.name} generation {hello.generation} pid {hello.pid} is not expected"
        if reason is not None or child is None:
            ep.reply(env, peer, f.Reject(reason=reason or "rejected"))
            return
        ep.reply(env, peer, f.Welcome(generation=child.generation))
        child.transition(ChildState.RUNNING)
        child.started_at = child.last_beat = time.monotonic()
        if child.welcomed is not None and not child.welcomed.done():
            child.welcomed.set_result(None)
        self.broadcast_roster()
        notify.send(f"STATUS={self.summary()}")

    def roster(self) -> f.Roster:
        return f.Roster(
            peers=[
                f.PeerState(
                    name=c.name,
                    role=c.spec.role,
                    generation=c.generation,
                    up=c.state in (ChildState.RUNNING, ChildState.STOPPING),
                    endpoint=self.paths.endpoint(c.name),
                    capacity=c.spec.capacity,
                )
                for c in self.children
            ]
        )

    def broadcast_roster(self) -> None:
        """Tell every running child who is up, where, and at which generation."""
        assert self.control is not None
        roster = self.roster()
        for child in self.children:
            if child.state in (ChildState.RUNNING, ChildState.STOPPING):
                with contextlib.suppress(Exception):
                    self.control.send(roster, to=child.routing_id)

    async def _watchdog(self) -> None:
        limit = self.settings.supervisor.watchdog_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for child in self.children:
                if child.state is ChildState.RUNNING and now - child.last_beat > limit:
                    log.error(
                        "child %s gen=%d silent for %.1f s (watchdog %g s); killing",
                        child.name,
                        child.generation,
                        now - child.last_beat,
                        limit,
                    )
                    assert child.proc is not None
                    child.proc.signal(signal.SIGKILL)


def _describe(exit_info: f.ExitInfo) -> str:
    if exit_info.signal is not None:
        return f"killed by signal {exit_info.signal}"
    return f"exited with status {exit_info.status}"
