"""Reloading the config of a running tree: SIGHUP, `systemctl reload`, `ctl reload`.

The supervisor reads the config file `start` was given again, with the same command-line
overrides on top (`--shards`, `--lanes-per-shard` keep winning, as they would on a restart with
the same command line; `$ORCHESTRA_SUP_ISOLATION` is the supervisor's own environment, read
again). `plan` compares what the old and the new settings make of each child
(`supervisor.shape`: its spec and the settings-derived part of its `ChildArgs`), and `Reloads`
applies the difference, child by child:

- a child whose args change (`lanes_per_shard`, `[lanes]`, `[relay]`, `[quotas]` for the
  coordinator, `[isolation]` for shards, `shutdown_timeout_s` and a `watchdog_s` below 2 s for
  every child, through the lane grace and heartbeat interval they are given) is restarted the
  way `ctl restart` restarts it (stop, start at the next generation), one child at a time, so at
  most one shard is down at once;
- a child whose spec alone changes (a shard's capabilities or tenants, any child's shutdown
  grace) is updated in place: the roster tells the coordinator, the pid stays;
- a higher `[shards] count` adds shards, started and joining the roster; a lower one retires the
  highest shards: marked stopping in the roster at once (no new lane goes there), each is given
  up to `drain_timeout_s` for its lanes to end, then stopped (lanes still running are
  interrupted and their tasks re-run on the shards that stay, as when a shard is stopped) and
  taken out of the tree and of `ctl status`;
- `[supervisor]` intensity, backoff, `watchdog_s`, `drain_timeout_s`, `probe_timeout_s` and
  `ctl_connections`
  apply in place;
- every other child keeps its pid.

Refused, changing nothing (every pid, the settings in force): a file that cannot be read or
parsed, a bad value (the `ConfigError` line), a key that cannot change while the tree runs
(`IMMUTABLE`), and, as busy (`gate.Busy`), a reload while another one, a rollover, or a stop is
in progress (a reload and a rollover exclude each other through `gate.ChangeGate`). The state and
run directories, the workspace and `--colocated` come from the command line, which a reload does
not read again. A rollover or a `ctl restart` asked during a reload is refused busy
(`supervisor.ctl`).

To systemd (sd_notify): `RELOADING=1` with `MONOTONIC_USEC` when a reload begins, `READY=1`
with a `STATUS=` line when it ends, refused or not; a busy refusal says nothing (the reload in
progress will say READY).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

import msgspec

from orchestra_sup.config import Settings
from orchestra_sup.errors import ChildStartError, ConfigError, RelayError, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import routing_id
from orchestra_sup.supervisor import notify
from orchestra_sup.supervisor.core import Supervisor, Worker
from orchestra_sup.supervisor.gate import Busy, ChangeGate
from orchestra_sup.supervisor.shape import child_spec, child_specs, flags, settings_args
from orchestra_sup.supervisor.source import ConfigSource
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.views import TreeHost

log = logging.getLogger("orchestra_sup.supervisor")

IMMUTABLE = {
    "[supervisor] spawn": "the fork template is made once, when the tree starts",
    "[supervisor] metrics_port": "the metrics endpoint is bound once, when the tree starts",
    "[supervisor] metrics_host": "the metrics endpoint is bound once, when the tree starts",
    "[cluster] listen": "the hosts' endpoint is bound once, when the tree starts",
    **{
        f"[http] {key}": "the HTTP API is set up once, when the tree starts"
        for key in ("listen", "cert", "key", "max_connections", "idle_s", "request_s", "releases")
    },
    "[cluster] coordinator_listen": "hosts are told the data ports once, when they join",
    "[cluster] custodian_listen": "hosts are told the data ports once, when they join",
    "[cluster] keys": "its keys are read once, when the tree starts",
    **{
        f"[cpu] {key}": "the supervisor takes its CPU class, affinity and RLIMIT_RTTIME once, "
        'when the tree starts, and ranks its children below its own (README, "CPU policy")'
        for key in ("realtime", "rt_priority", "rttime_s", "reserved_cpus")
    },
}
"""Settings a running tree cannot take on, and why; a reload that changes one is refused."""


class ReloadPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What going from one settings to another does to the tree. `changed`: the settings that
    differ, as "[section] key" (or "[shards.shard-1] tenants", "[quotas.acme] rate"); children
    by name: `restart` (args change: restarted, start order), `update` (only the spec changes:
    in place), `add` (new shards, in order), `retire` (shards going away, highest first),
    `unchanged`; `refusal`: why the new settings cannot be taken live (None: they can)."""

    changed: list[str]
    restart: list[str]
    update: list[str]
    add: list[str]
    retire: list[str]
    unchanged: list[str]
    refusal: str | None = None


def changed_settings(old: Settings, new: Settings) -> list[str]:
    """The settings that differ between `old` and `new`, as "[section] key", sorted."""
    was, now = _flat(old), _flat(new)
    return sorted(key for key in was.keys() | now.keys() if was.get(key) != now.get(key))


def _flat(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section, body in msgspec.to_builtins(settings).items():
        for key, value in body.items():
            if section == "shards" and key == "profiles":
                for shard, profile in value.items():
                    for name, offer in profile.items():
                        out[f"[shards.{shard}] {name}"] = offer
            elif section == "quotas":
                for name, ceiling in value.items():
                    out[f"[quotas.{key}] {name}"] = ceiling
            else:
                out[f"[{section}] {key}"] = value
    return out


def plan(old: Settings, new: Settings) -> ReloadPlan:
    """What reloading from `old` to `new` does to each child (pure; the isolation mode is
    resolved on this machine, as for a start). Raises `ConfigError` as
    `system.isolation.effective`."""
    changed = changed_settings(old, new)
    refusal = next(
        (
            f"{key} cannot change while the tree runs ({why}); restart the tree to change it"
            for key, why in IMMUTABLE.items()
            if key in changed
        ),
        None,
    )
    was, now = child_specs(old), child_specs(new)
    restart, update, unchanged = [], [], []
    for name, spec in was.items():
        if name not in now:
            continue
        if settings_args(old, spec.role) != settings_args(new, spec.role):
            restart.append(name)
        elif now[name] != spec:
            update.append(name)
        else:
            unchanged.append(name)
    return ReloadPlan(
        changed=changed,
        restart=restart,
        update=update,
        add=[name for name in now if name not in was],
        retire=[name for name in reversed(was) if name not in now],
        unchanged=unchanged,
        refusal=refusal,
    )


class Reloads:
    """The supervisor's config reloads of the tree `host`: at most one at a time, and none while
    a rollover runs (both hold `gate`)."""

    def __init__(self, host: TreeHost, gate: ChangeGate, source: ConfigSource | None):
        self.host = host
        self.gate = gate
        self.source = source
        """Where the settings in force came from; None: not from `start` (a tree built in
        process), nothing to re-read."""
        self._task: asyncio.Task[f.ReloadReport] | None = None
        self._idle: dict[str, asyncio.Event] = {}
        self._generations: dict[str, int] = {}
        """Retired shards' last generation: one added again later goes on from it, so no
        (name, generation) ever names two processes in one run of the tree."""

    def begin(self) -> asyncio.Task[f.ReloadReport]:
        """Start a reload; its task answers the `ReloadReport`. Raises `Busy` while the tree
        starts, or another reload, a rollover or a stop is in progress (then nothing is said to
        systemd)."""
        host = self.host
        if host.stopping:
            raise Busy("the tree is stopping")
        if not host.tree.running:
            raise Busy("the tree is starting; reload once it is ready")
        if self.gate.reloading():
            raise Busy("a config reload is already in progress")
        rollover = self.gate.rollover()
        if rollover is not None:
            raise Busy(
                f"rollover {rollover.id} of {rollover.target} is running; "
                "reload once it is done (ctl rollover prints when)"
            )
        self._task = host.spawn(self._reload())
        self.gate.enter(self._task)
        return self._task

    def on_sighup(self) -> None:
        """SIGHUP: reload, or log in one line why not."""
        try:
            self.begin()
        except Busy as exc:
            log.error("config reload refused: busy: %s", exc)

    async def cancel(self) -> None:
        """End the reload in progress, if any (the tree is stopping)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def heard(self, worker: Worker, beat: f.Heartbeat) -> None:
        """A heartbeat from a retiring shard: the drain ends at the first `quiet` one."""
        idle = self._idle.get(worker.name)
        if idle is not None and quiet(beat):
            idle.set()

    def changed(self, worker: Worker) -> None:
        """A retiring shard's state changed: once it is no longer running (it died while
        draining) there is nothing left to wait for."""
        idle = self._idle.get(worker.name)
        if idle is not None and worker.state is not ChildState.RUNNING:
            idle.set()

    # --- the reload ------------------------------------------------------------------------------

    async def _reload(self) -> f.ReloadReport:
        notify.reloading("reloading the config")
        report = f.ReloadReport(config="", refused=True, error="cancelled: the tree is stopping")
        try:
            report = await self._apply()
        except Exception as exc:  # a bug here must still answer the caller and systemd
            log.exception("config reload failed")
            config = self.source.path if self.source is not None else None
            report = f.ReloadReport(
                config=config or "",
                error=f"internal error: {exc!r} (see the supervisor's log)",
            )
        finally:
            status = self.host.children.summary()
            if report.error is not None:
                status += f"; config reload {'refused' if report.refused else 'failed'}"
            notify.ready(status)
        return report

    async def _apply(self) -> f.ReloadReport:
        host, children = self.host, self.host.children
        names = [w.name for w in children.workers]
        if self.source is None or self.source.path is None:
            log.info("config reload: the tree was started without --config; nothing to re-read")
            return f.ReloadReport(config="", unchanged=names)
        config = self.source.path
        old = host.settings
        try:
            new = await asyncio.to_thread(self.source.load)
            step = await asyncio.to_thread(plan, old, new)
        except ConfigError as exc:
            return _refused(config, names, str(exc))
        if step.refusal is not None:
            return _refused(config, names, f"config {config}: {step.refusal}")
        if host.stopping:
            return _refused(config, names, "the tree is stopping")
        changed = ", ".join(step.changed) or "nothing changed"
        log.info("config reload from %s: %s", config, changed)
        host.events.emit("reload.done", detail=f"from {config}: {changed}")
        host.settings = new
        for each in host.tree.supervisors():
            each.reconfigure(flags(new))
        for name in step.update:
            children.by_name[name].spec = child_spec(new, name)
        if step.update:
            children.broadcast_roster()
        errors: list[str] = []
        for name in step.add:
            await self._step(errors, self._add(name, new))
        for name in step.restart:
            await self._step(errors, self._restart(name, new))
        await self._retire(step.retire, new.supervisor.drain_timeout_s)
        return f.ReloadReport(
            config=config,
            changed=step.changed,
            restarted=step.restart,
            added=step.add,
            retired=step.retire,
            updated=step.update,
            unchanged=step.unchanged,
            error="; ".join(errors) or None,
        )

    async def _step(self, errors: list[str], work: Coroutine[Any, Any, None]) -> None:
        """Run one child's step; a child that does not start is left to supervision (it is
        restarted as any failed child) and the reload goes on with the next."""
        try:
            await work
        except ChildStartError as exc:
            errors.append(f"{exc} (restarted as any failed child)")
            log.error("config reload: %s", errors[-1])

    async def _add(self, name: str, settings: Settings) -> None:
        host = self.host
        worker = Worker(child_spec(settings, name), flags(settings), host.seam)
        worker.generation = self._generations.pop(name, 0)
        host.children.index([*host.children.workers, worker])
        log.info("config reload: adding %s", name)
        await _shards(host.tree).add_child(worker)

    async def _restart(self, name: str, settings: Settings) -> None:
        """`ctl restart`'s path: stop, start at the next generation with the new args."""
        worker = self.host.children.by_name[name]
        worker.spec = child_spec(settings, name)
        log.info("config reload: restarting %s for its new settings", name)
        await self.host.tree.restart_worker(worker)

    async def _retire(self, names: list[str], drain_s: float) -> None:
        """Mark every shard in `names` stopping at once, give them together up to `drain_s`
        seconds for their lanes to end, then stop and remove each, in the order given."""
        host, children = self.host, self.host.children
        if not names:
            return
        leaving = [children.by_name[name] for name in names]
        for worker in leaving:
            worker.leaving = True
        children.broadcast_roster()
        log.info("config reload: draining %s (at most %g s)", ", ".join(names), drain_s)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_s):
                    for worker in leaving:
                        await self._quiet(worker, drain_s)
            shards = _shards(host.tree)
            for worker in leaving:
                beat = children.liveness[worker.name].beat
                lanes = beat.load if beat is not None else 0
                unsent = beat.outbox_depth if beat is not None else 0
                log.log(
                    logging.WARNING if lanes or unsent else logging.INFO,
                    "config reload: retiring %s%s%s",
                    worker.name,
                    f" ({lanes} lanes interrupted, re-run elsewhere)" if lanes else "",
                    f" ({unsent} messages to the coordinator unacknowledged after the drain: "
                    "their tasks may run again)"
                    if unsent
                    else "",
                )
                await shards.remove_child(worker)
                self._generations[worker.name] = worker.generation
                children.index(list(host.tree.workers()))
                children.broadcast_roster()
        finally:
            self._idle.clear()

    async def _quiet(self, worker: Worker, timeout_s: float) -> None:
        """Return once retiring shard `worker` is `quiet`: a heartbeat after its answer to
        `ListLanes` says so (heartbeats and replies share one connection, so a later one is
        newer, and nothing is placed on it since the roster marked it leaving); at once when
        it is not running or cannot say."""
        control = self.host.sockets.control
        if worker.state is not ChildState.RUNNING or control is None:
            return
        try:
            reply = await control.request(
                f.ListLanes(),
                to=routing_id(worker.name, worker.generation),
                timeout_s=timeout_s,
                dest_gen=worker.generation,
            )
        except (RemoteError, RelayError):
            return
        if isinstance(reply, f.LaneList):
            idle = self._idle[worker.name] = asyncio.Event()
            await idle.wait()


def quiet(beat: f.Heartbeat) -> bool:
    """A retiring shard may go once it runs no lane and its outbox is empty (every result,
    pause and note acknowledged by the coordinator): retired with a result unsent, the result
    would be stranded in its LMDB and the task run again."""
    return beat.load == 0 and beat.outbox_depth == 0


def _refused(config: str, names: list[str], error: str) -> f.ReloadReport:
    log.error("config reload refused: %s", error)
    return f.ReloadReport(config=config, unchanged=names, refused=True, error=error)


def _shards(tree: Supervisor) -> Supervisor:
    return next(c for c in tree.children if isinstance(c, Supervisor) and c.name == "shards")
