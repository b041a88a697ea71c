"""What the root supervisor offers each of its collaborators: one narrow, typed view apiece.

The root supervisor (`supervisor.root`) owns the tree, its seam, its sockets and its children
table, and hands each collaborator only the view it needs, as a `Protocol` the root satisfies:
`TreeHost` to a config reload (`supervisor.reload`), `ReexecHost` to the re-exec and to a
rollover, whose last step may be one (`supervisor.reexec`, `supervisor.rollover`),
`MetricsHost` to the metrics (`supervisor.metrics`), `CtlHost` to the ctl service
(`supervisor.ctl`) and `AgentHost` to a host's link to its root (`supervisor.hostlink`).
No collaborator imports the root, and none reaches another through it: a reload and a rollover
exclude each other through the `gate.ChangeGate` both hold, and the ctl service is given the two
as `ReloadDesk` and `RolloverDesk`, what it asks of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from orchestra_sup.config import Settings
from orchestra_sup.logformat import LogFormat
from orchestra_sup.paths import Paths
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.looplag import LoopLag
from orchestra_sup.supervisor.children import Children
from orchestra_sup.supervisor.colocated import ColocatedSeam
from orchestra_sup.supervisor.core import Supervisor
from orchestra_sup.supervisor.cpu import SupervisorCpu
from orchestra_sup.supervisor.events import SupervisorEvents
from orchestra_sup.supervisor.gate import ChangeGate
from orchestra_sup.supervisor.hosts import Hosts
from orchestra_sup.supervisor.httpserve import HttpServer
from orchestra_sup.supervisor.runlock import DirLock
from orchestra_sup.supervisor.seam import ProcessSeam
from orchestra_sup.supervisor.sockets import RootSockets
from orchestra_sup.supervisor.source import ConfigSource
from orchestra_sup.system.reserve import DiskSpace

RootSeam = ProcessSeam | ColocatedSeam
"""The seam of a root supervisor: processes, or components of its own (`--colocated`)."""


class TreeHost(Protocol):
    """What every collaborator sees: the settings in force (a config reload replaces them),
    the tree, its children table, its seam and sockets, the event log it writes (`events`),
    whether the tree is stopping, and `spawn`, which runs a task of the tree's (cancelled
    when the tree stops)."""

    settings: Settings
    tree: Supervisor
    children: Children
    seam: RootSeam
    sockets: RootSockets
    events: SupervisorEvents

    @property
    def stopping(self) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


class ReexecHost(TreeHost, Protocol):
    """What re-executing the supervisor needs besides: what the `Handoff` records (the
    directories and their `dir_locks`, this run's `boot`, `log_format`, this image's
    `generation`, the `config` source, the address `http` is bound to), the sockets bound
    again after a failed exec (`open_sockets`), and a stop with an exit status when they
    cannot be (`request_stop`)."""

    paths: Paths
    http: HttpServer
    dir_locks: tuple[DirLock, DirLock] | None
    boot: str
    log_format: LogFormat
    generation: int

    @property
    def config(self) -> ConfigSource | None: ...

    def open_sockets(self) -> None: ...

    def request_stop(self, exit_code: int = ...) -> None: ...


class AgentHost(TreeHost, Protocol):
    """What a host's link to its root needs besides (`supervisor.hostlink`): this run's `boot`,
    the directories (where its shards listen), and `refuse`, which stops the agent for a
    reason only its operator can mend."""

    boot: str
    paths: Paths

    def refuse(self, reason: str) -> None: ...


class MetricsHost(Protocol):
    """What the metrics sample: the children table, the supervisor's own loop lag, its
    sockets' figures, the ctl requests and peers it refused (`ctl_refused`) and the state
    disk against its reserve (`state_disk`; None on a host's agent)."""

    children: Children
    lag: LoopLag
    sockets: RootSockets

    def ctl_refused(self) -> int: ...

    def state_disk(self) -> DiskSpace | None: ...


class ReloadDesk(Protocol):
    """What `ctl reload` asks of the config reloads (`reload.Reloads`)."""

    def begin(self) -> asyncio.Task[f.ReloadReport]: ...


class RolloverDesk(Protocol):
    """What `ctl rollover` and `ctl status` ask of the rollovers (`rollover.Rollovers`)."""

    async def begin(self, req: f.CtlRollover) -> f.RolloverReport: ...

    async def status(self, req: f.CtlRolloverStatus) -> f.RolloverReport: ...

    def summary(self) -> str | None: ...


class CtlHost(TreeHost, MetricsHost, Protocol):
    """What the ctl service needs besides: the directories, whether debug hooks are on, the
    supervisor's CPU policy (its guard's count), the metrics' URL, a stop, the change `gate`
    (`ctl restart` is refused while a change is in progress), the `hosts` that joined, and
    the `reloads` and `rollovers` it hands `ctl reload` and `ctl rollover` to."""

    paths: Paths
    debug_hooks: bool
    gate: ChangeGate
    http: HttpServer
    cpu: SupervisorCpu
    hosts: Hosts

    @property
    def metrics_url(self) -> str: ...

    @property
    def reloads(self) -> ReloadDesk: ...

    @property
    def rollovers(self) -> RolloverDesk: ...

    def request_stop(self, exit_code: int = ...) -> None: ...
