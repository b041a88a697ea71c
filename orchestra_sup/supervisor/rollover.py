"""Rollovers: moving running children onto another release, one process at a time.

`ctl rollover NAME --release PYTHON` (ARCHITECTURE.md §9; the coordinator separation write-up in
seeds/ gives the semantics: quiet points, generation bumps, version skew). Before anything moves,
the release is probed (`release.probe`) and its protocol range checked against the tree's; a
release that cannot be used is refused in one line and nothing changes. Then each target moves in
turn, each the way its role allows:

- coordinator, custodian (`_replace`): asked for a quiet point (`Quiesce`: the coordinator holds
  its turns, wakes and unread inbox; the custodian lets the write in flight land and holds the
  next), then stopped (SIGTERM: it flushes its state) and started on the new release at the next
  generation. Nothing else stops: lanes keep running, and what they report waits in the shards'
  durable outboxes until the new coordinator is up. A new process that never becomes ready is
  rolled back: the child starts again on its old release.
- a shard (`_surge`): the next generation starts beside the running one (`Worker.start_beside`),
  new lanes go to it, the old one drains (`Drain`: each lane parks at its next quiet point and
  resumes on the new one; a lane that finds none within the drain timeout is stopped and re-runs
  its step there, flagged partial), then it is retired (SIGTERM). A new generation that never
  becomes ready is rolled back: the old one goes on as if nothing happened.

- the supervisor itself (`_reexec`): re-executed in place on the release (same pid), re-adopting
  its running children without restarting them (`supervisor.reexec`, ADR 0007). The rollover's
  record travels across the exec (`Carried`), and the new image finishes it once it has adopted
  every child. A refused re-exec leaves the old image running.

Targets: a child's name, `supervisor`, `shards` (each shard in turn) or `all` (custodian,
coordinator, each shard, then the supervisor; on a host's agent, which does not re-execute
itself (`seam.pinned`), its shards). A rollover stops at the first target that rolls back or
fails, and reports it.
Progress is a list of `RolloverEvent`s that `ctl rollover` long-polls (`CtlRolloverStatus`).
Only one rollover runs at a time, and none during a config reload (both hold `gate.ChangeGate`);
restarts of the child being moved wait for it (the rollover holds its supervisor's restart
lock), and stopping the tree cancels it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time

import msgspec

from orchestra_sup import release as releases
from orchestra_sup.errors import (
    ChildStartError,
    ErrorCode,
    RelayError,
    ReleaseError,
    RemoteError,
    SupervisionError,
)
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import routing_id
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.gate import ChangeGate
from orchestra_sup.supervisor.helper_cgroup import HelperCgroup
from orchestra_sup.supervisor.reexec import reexec
from orchestra_sup.supervisor.rolloverrecord import Rollover
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.views import ReexecHost

log = logging.getLogger("orchestra_sup.supervisor")

REPLY_MARGIN_S = 5.0
"""Seconds a quiesce or drain request waits beyond the timeout it gives the child."""
HISTORY = 8
"""Finished rollovers whose reports `ctl rollover` can still ask for."""
FLUSH_S = 1.0
"""Seconds a supervisor about to re-execute waits for its pollers to have been answered."""
SUPERVISOR = "supervisor"


class RolloverFailed(SupervisionError):
    """A step did not complete; `str()` is the one line the report's `error` carries."""


class Rollovers:
    """The rollovers of the tree `host`: at most one running, and none during a config reload
    (both hold `gate`); the last `HISTORY` kept. `carried` is what the image this one
    re-executed from passed on (`Rollover.carry`), or None."""

    def __init__(self, host: ReexecHost, gate: ChangeGate, carried: bytes | None = None):
        self.host = host
        self.gate = gate
        self.history: dict[str, Rollover] = {}
        self._task: asyncio.Task[None] | None = None
        self._resumed: Rollover | None = None
        if carried:  # this image was re-executed by a rollover: it takes its record up
            try:
                self._resumed = Rollover.carried(carried)
                self._resumed.told = host.events
            except msgspec.DecodeError as exc:
                log.error("the rollover record passed across the re-exec is unreadable: %s", exc)
            else:
                self.history[self._resumed.id] = self._resumed

    def adopted(self, children: int, exec_at: float) -> None:
        """This image has adopted `children` children of the one that re-executed it at
        `exec_at` (monotonic seconds): the rollover that asked for it is done."""
        rollover, self._resumed = self._resumed, None
        if rollover is None:
            return
        rollover.event(
            SUPERVISOR,
            f"re-executed in place (pid {os.getpid()}) on orchestra-sup "
            f"{releases.version()}: {children} children re-adopted, none restarted",
            time.monotonic() - exec_at,
        )
        rollover.event("", f"done: every target runs orchestra-sup {rollover.release.version}")
        rollover.finish(None)

    # --- ctl -------------------------------------------------------------------------------------

    async def begin(self, req: f.CtlRollover) -> f.RolloverReport:
        """Check everything, then start rollover `req` in the background; its first report.
        The targets are read again once the release is probed: a reload may have retired,
        added or restarted children meanwhile (it is not excluded until the gate is entered).

        Raises `RemoteError`: `bad_request` for a colocated tree, `supervisor` on a host's agent
        (`seam.pinned`), a tree that is stopping, a target that is not running, a bad drain
        timeout, or a release that cannot be probed;
        `not_found` for an unknown target; `busy` while another rollover runs;
        `version_skew` for a release whose protocol range does not overlap the tree's.
        """
        host = self.host
        if host.seam.unmovable is not None:
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"{host.seam.unmovable}; stop it and start it on the new release instead",
            )
        pinned = host.seam.pinned
        if pinned is not None and req.name == SUPERVISOR:
            raise RemoteError(ErrorCode.BAD_REQUEST, f"{pinned}; its shards roll over (`shards`)")
        if host.stopping:
            raise RemoteError(ErrorCode.BAD_REQUEST, "the tree is stopping")
        running = self.running()
        if running is not None:
            raise RemoteError(
                ErrorCode.BUSY, f"rollover {running.id} of {running.target} is still running"
            )
        drain_s = host.settings.supervisor.drain_timeout_s
        if req.drain_timeout_s is not None:
            if not 0 < req.drain_timeout_s <= 3600:
                raise RemoteError(
                    ErrorCode.BAD_REQUEST, "the drain timeout must be > 0 and <= 3600 seconds"
                )
            drain_s = req.drain_timeout_s
        self.movable(req.name)
        itself = req.name in (SUPERVISOR, "all") and pinned is None
        python = req.release or host.seam.release
        try:
            info = await releases.probe(
                python,
                host.settings.supervisor.probe_timeout_s,
                hold=host.seam.helpers,
                tracker=HelperCgroup(host.seam, host.paths.run_dir),
            )
        except ReleaseError as exc:
            raise RemoteError(ErrorCode.BAD_REQUEST, str(exc)) from None
        if not releases.compatible_with(info):
            raise RemoteError(ErrorCode.VERSION_SKEW, releases.refusal(info))
        # Again, now: the probe took time, and another rollover, a stop or a reload may have begun.
        if host.stopping:
            raise RemoteError(ErrorCode.BAD_REQUEST, "the tree is stopping")
        if self.gate.reloading():
            raise RemoteError(ErrorCode.BUSY, "a config reload is in progress; roll over after")
        running = self.running()
        if running is not None:
            raise RemoteError(
                ErrorCode.BUSY, f"rollover {running.id} of {running.target} is still running"
            )
        workers = self.movable(req.name)  # a reload during the probe may have retired some
        rollover = Rollover(req.name, info)
        rollover.told = host.events
        moving = [w.name for w in workers] + ([SUPERVISOR] if itself else [])
        rollover.event(
            "",
            f"release {info.python}: orchestra-sup {info.version}, protocol "
            f"{info.proto_min}..{info.proto_max}; moving {', '.join(moving)}",
        )
        self.history[rollover.id] = rollover
        while len(self.history) > HISTORY:
            del self.history[next(iter(self.history))]
        self._task = host.spawn(self._run(rollover, workers, drain_s, itself))
        self.gate.enter(self._task, rollover)
        return rollover.report()

    async def status(self, req: f.CtlRolloverStatus) -> f.RolloverReport:
        """Events of rollover `req.id` after `req.after_seq` (a long poll of `req.wait_s`
        seconds). Raises `RemoteError(not_found)` for an unknown id."""
        rollover = self.history.get(req.id)
        if rollover is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no rollover {_shown(req.id)}")
        await rollover.wait(req.after_seq, req.wait_s)
        return rollover.report(req.after_seq)

    def running(self) -> Rollover | None:
        """The rollover in progress, if any."""
        held = self.gate.rollover()
        return held if isinstance(held, Rollover) and not held.done else None

    def summary(self) -> str | None:
        """The rollover in progress in one line, for `ctl status`; None when none runs."""
        running = self.running()
        if running is None:
            return None
        last = running.events[-1].text if running.events else "starting"
        took = time.monotonic() - running.began
        return f"{running.id} of {running.target} for {took:.1f} s: {last}"

    def movable(self, name: str) -> list[Worker]:
        """The children `name` moves (`targets`), each running. Raises `RemoteError`:
        `not_found` for an unknown target, `bad_request` for a target that is not running."""
        workers = self.targets(name)
        for worker in workers:
            if worker.state is not ChildState.RUNNING:
                raise RemoteError(
                    ErrorCode.BAD_REQUEST,
                    f"{worker.name} is {worker.state}; try again when it is running",
                )
        return workers

    def targets(self, name: str) -> list[Worker]:
        """The children `name` moves, in order (`supervisor`: none; `all`: every child, then the
        supervisor moves too). Raises `RemoteError(not_found)`."""
        children = self.host.children
        by_role = {w.spec.role: w for w in children.workers if w.spec.role != "shard"}
        shards = [w for w in children.workers if w.spec.role == "shard"]
        if name == SUPERVISOR:
            return []
        if name == "shards":
            return shards
        if name == "all":
            fixed = [by_role[role] for role in ("custodian", "coordinator") if role in by_role]
            return [*fixed, *shards]
        worker = children.by_name.get(name)
        if worker is None:
            known = ", ".join([*children.by_name, SUPERVISOR, "shards", "all"])
            raise RemoteError(ErrorCode.NOT_FOUND, f"no rollover target {_shown(name)} ({known})")
        return [worker]

    async def cancel(self) -> None:
        """Stop the running rollover, if any (the tree is stopping); a shard caught in its
        surge has its retiring generation stopped first."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- the steps -------------------------------------------------------------------------------

    async def _run(
        self, rollover: Rollover, workers: list[Worker], drain_s: float, itself: bool
    ) -> None:
        try:
            for worker in workers:
                step = self._surge if worker.spec.role == "shard" else self._replace
                await step(rollover, worker, drain_s)
            if itself:
                await self._reexec(rollover)  # returns only when it was refused
        except RolloverFailed as exc:
            rollover.finish(str(exc))
        except asyncio.CancelledError:
            rollover.event("", "cancelled: the tree is stopping")
            rollover.finish("cancelled: the tree is stopping")
            raise
        except Exception as exc:  # a bug here must still end the record its caller follows
            log.exception("rollover %s failed", rollover.id)
            rollover.event("", f"stopped by an internal error: {exc!r}")
            rollover.finish(f"internal error: {exc!r} (see the supervisor's log)")
        else:
            took = time.monotonic() - rollover.began
            rollover.event("", f"done: every target runs orchestra-sup {rollover.release.version}")
            log.info("rollover %s of %s done in %.3f s", rollover.id, rollover.target, took)
            rollover.finish(None)

    async def _replace(self, rollover: Rollover, worker: Worker, quiet_s: float) -> None:
        """Coordinator or custodian: quiet point, stop, start on the new release; roll back
        to the old release when the new process never becomes ready. Only the swap holds the
        restart lock of the child's supervisor, so other children restart as usual meanwhile
        (a child restarted while it was being quiesced is not moved)."""
        name, release = worker.name, rollover.release
        owner = worker.parent
        assert owner is not None
        if worker.state is not ChildState.RUNNING:
            raise RolloverFailed(f"{name} is {worker.state}; nothing moved")
        generation = worker.generation
        began = time.monotonic()
        rollover.event(name, f"asking generation {generation} for a quiet point")
        try:
            held = await self._request(worker, generation, f.Quiesce(timeout_s=quiet_s), quiet_s)
        except (RemoteError, RelayError) as exc:
            await self._resume(worker)
            raise RolloverFailed(f"{name} reached no quiet point: {exc}; nothing moved") from None
        detail = held.held if isinstance(held, f.Quiesced) and held.held else "quiet"
        rollover.event(name, f"quiet point: {detail}", time.monotonic() - began)
        async with owner._lock:
            if worker.generation != generation or worker.state is not ChildState.RUNNING:
                raise RolloverFailed(f"{name} was restarted at its quiet point; nothing moved")
            old_release = worker.release
            began = time.monotonic()
            await worker.stop()
            rollover.event(name, f"generation {generation} stopped", time.monotonic() - began)
            began = time.monotonic()
            worker.release = release.python
            try:
                await worker.start()
            except ChildStartError as exc:
                await worker.failed_start_gone()
                rollover.event(
                    name,
                    f"generation {worker.generation} on {release.python} never became ready "
                    f"({exc.reason}); rolling back",
                    time.monotonic() - began,
                )
                worker.release = old_release
                began = time.monotonic()
                try:
                    await worker.start()
                except ChildStartError as again:
                    raise RolloverFailed(
                        f"{name}: the new release never became ready ({exc.reason}) and neither "
                        f"did the old one ({again.reason}); it is restarted as any failed child"
                    ) from None
                raise _rolled_back(
                    rollover,
                    name,
                    f"rolled back: generation {worker.generation} runs the old release "
                    f"(pid {worker.pid})",
                    began,
                    exc,
                ) from None
            _ready(rollover, worker, began)

    async def _surge(self, rollover: Rollover, worker: Worker, drain_s: float) -> None:
        """A shard: surge, drain, retire; roll back when the new generation never becomes
        ready. Only the surge's start holds the restart lock of the shards' supervisor: during
        the drain every shard, the new generation too, restarts as usual. A drain that fails
        (the old generation did not answer in time or died) is not rolled back, since new lanes
        already run on the new generation: the old one is retired, the lanes it still had are
        lost (their tasks are paused and re-placed), and the rollover reports the failure."""
        name, release = worker.name, rollover.release
        owner = worker.parent
        assert owner is not None
        async with owner._lock:
            if worker.state is not ChildState.RUNNING:
                raise RolloverFailed(f"{name} is {worker.state}; nothing moved")
            old_release, old_generation = worker.release, worker.generation
            worker.release = release.python
            began = time.monotonic()
            rollover.event(
                name,
                f"starting generation {old_generation + 1} beside generation {old_generation}",
            )
            try:
                await worker.start_beside()
            except ChildStartError as exc:
                worker.release = old_release
                raise _rolled_back(
                    rollover,
                    name,
                    f"generation {old_generation + 1} never became ready ({exc.reason}); rolled "
                    f"back: generation {old_generation} goes on",
                    began,
                    exc,
                ) from None
            _ready(rollover, worker, began, "; new lanes go there")
        try:
            failure = await self._drain(rollover, worker, old_generation, drain_s)
        finally:
            await self._retire(rollover, worker, old_generation)
        if failure is not None:
            raise RolloverFailed(failure)

    async def _drain(
        self, rollover: Rollover, worker: Worker, old_generation: int, drain_s: float
    ) -> str | None:
        """Ask the old generation to hand its lanes over; one event per lane. Returns why the
        drain failed, or None."""
        name = worker.name
        began = time.monotonic()
        rollover.event(name, f"draining generation {old_generation} (at most {drain_s:g} s)")
        try:
            drained = await self._request(
                worker,
                old_generation,
                f.Drain(successor_gen=worker.generation, timeout_s=drain_s),
                drain_s,
            )
        except (RemoteError, RelayError) as exc:
            rollover.event(name, f"generation {old_generation} did not drain: {exc}")
            return f"{name}: generation {old_generation} did not drain ({exc})"
        lanes = drained.lanes if isinstance(drained, f.Drained) else []
        for move in lanes:
            detail = f": {move.detail}" if move.detail else ""
            rollover.event(name, f"lane {move.lane} {move.how}{detail}", move.elapsed_s)
        counts = collections.Counter(m.how for m in lanes)
        rollover.event(
            name,
            f"generation {old_generation} drained: {counts['moved']} moved, {counts['partial']} "
            f"re-run partial, {counts['finished']} finished there",
            time.monotonic() - began,
        )
        lost = [m.lane for m in lanes if m.how == "lost"]
        if lost:
            return f"{name}: lanes {', '.join(lost)} could not be handed over (re-placed)"
        return None

    async def _retire(self, rollover: Rollover, worker: Worker, generation: int) -> None:
        """Stop the set-aside generation: SIGTERM, SIGKILL after the child's shutdown grace;
        then the roster no longer lists it as draining. Runs even when the rollover is
        cancelled (the tree is stopping), so no retiring process outlives it."""
        seam = self.host.seam
        began = time.monotonic()
        seam.signal_retiring(worker.name, generation, signal.SIGTERM)
        grace = worker.spec.shutdown_s
        try:
            async with asyncio.timeout(grace):
                await seam.wait_retired(worker.name, generation)
        except TimeoutError:
            log.warning("%s generation %d ignored SIGTERM; killing", worker.name, generation)
            seam.signal_retiring(worker.name, generation, signal.SIGKILL)
            await seam.wait_retired(worker.name, generation)
        worker.retired()
        rollover.event(worker.name, f"generation {generation} retired", time.monotonic() - began)

    async def _reexec(self, rollover: Rollover) -> None:
        """The supervisor itself: re-execute in place on the release (`supervisor.reexec`).
        The event saying so reaches the pollers before the exec; the new image finishes the
        rollover (`adopted`). Raises `RolloverFailed` when the re-exec was refused."""
        host = self.host
        began = time.monotonic()
        python = rollover.release.python
        try:  # no old image to roll back to once exec'd: its start must work first
            await releases.check_start(
                python,
                host.settings.supervisor.probe_timeout_s,
                hold=host.seam.helpers,
                tracker=HelperCgroup(host.seam, host.paths.run_dir),
            )
        except ReleaseError as exc:
            rollover.event(SUPERVISOR, f"not re-executed: {exc}", time.monotonic() - began)
            raise RolloverFailed(f"supervisor: {exc}; nothing moved") from None
        rollover.reexecuting = True
        rollover.event(SUPERVISOR, f"re-executing pid {os.getpid()} on {python}")
        await rollover.answered(FLUSH_S)
        try:
            await reexec(host, python, rollover.carry())
        except ReleaseError as exc:
            rollover.reexecuting = False
            rollover.event(SUPERVISOR, f"not re-executed: {exc}", time.monotonic() - began)
            raise RolloverFailed(f"supervisor: {exc}") from None

    async def _request(
        self, worker: Worker, generation: int, body: f.Body, timeout_s: float
    ) -> f.Body:
        control = self.host.sockets.control
        assert control is not None
        return await control.request(
            body,
            to=routing_id(worker.name, generation),
            timeout_s=timeout_s + REPLY_MARGIN_S,
            dest_gen=generation,
        )

    async def _resume(self, worker: Worker) -> None:
        """Tell a child that was asked for a quiet point to go on (best effort: one that does
        not answer is not waited for)."""
        with contextlib.suppress(RemoteError, RelayError):
            await self._request(worker, worker.generation, f.Resume(), 0.0)


def _ready(rollover: Rollover, worker: Worker, began: float, more: str = "") -> None:
    """The event of `worker`'s new generation being ready, `began` (monotonic) after its start."""
    rollover.event(
        worker.name,
        f"generation {worker.generation} ready on orchestra-sup {worker.version or '?'} "
        f"(pid {worker.pid}){more}",
        time.monotonic() - began,
    )


def _rolled_back(
    rollover: Rollover, name: str, text: str, began: float, exc: ChildStartError
) -> RolloverFailed:
    """`name` rolled back after its new release never became ready (`exc`): the event `text`,
    `began` (monotonic) being when the step it ends began, and the failure to raise."""
    rollover.event(name, text, time.monotonic() - began)
    return RolloverFailed(f"{name}: the new release never became ready ({exc.reason}); rolled back")


def _shown(name: str) -> str:
    """`name` as an error message quotes it: at most 64 characters of it."""
    return repr(name) if len(name) <= 64 else f"{name[:64]!r}... ({len(name)} characters)"
