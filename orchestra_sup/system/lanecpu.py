"""The lanes' CPU class under `[cpu] lanes = "idle"`: below the tree's own processes.

Layers, the first this machine allows (`LaneCpu.layer`):

1. "cpu.idle": a cgroup of the v1 cpu controller (cgroup v2's hierarchy here has none:
   notes/isolation.md), `<v1 cpu>/<own path>/orchestra-sup` with `cpu.idle = 1`, so the kernel
   treats that whole group as SCHED_IDLE against its siblings, the control plane and the hosts
   among them (sched(7), Linux 5.15). Below it, one directory per shard,
   `<tree_id>/<shard>.<generation>`, that every lane command of the shard joins between fork and
   exec; the lanes share the CPU fairly among themselves.
2. "cpu.shares": the same group where the kernel has no `cpu.idle`, at the least weight
   (`cpu.shares = 2`, against 1,024 for every other group and task).
3. "sched_idle": no usable cpu controller: each lane command switches itself to SCHED_IDLE
   between fork and exec (allowed unprivileged, sched(7)).

`[lanes] nice` is applied in every case, as before. With `lanes = "nice"` (the default) nothing
here is used (`LaneCpu.layer` is "nice").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from orchestra_sup.system.cgroups import TOP
from orchestra_sup.system.linux import cgroup_joiner
from orchestra_sup.system.v1cgroups import v1_controller

log = logging.getLogger(__name__)

IDLE_SHARES = 2
"""The least `cpu.shares` the kernel takes (against 1,024 by default)."""


def layer_here(lanes: str) -> str:
    """The layer `LaneCpu` takes here for `[cpu] lanes` = `lanes`, found without making
    anything: "nice", "cpu.idle", "cpu.shares" or "sched_idle" (a group that then fails to be
    made falls back to "sched_idle", logged by its shard). Never raises."""
    if lanes == "nice":
        return "nice"
    own = v1_controller("cpu")
    if own is None:
        return "sched_idle"
    return "cpu.idle" if (own / "cpu.idle").exists() else "cpu.shares"


class LaneCpu:
    """The CPU class of one shard's lanes. `lanes` is `[cpu] lanes`; `shard` is the shard's
    directory name (`<name>.<generation>`, as `LaneCgroups`).

    `layer` is what is in force: "nice", "cpu.idle", "cpu.shares" or "sched_idle". The group is
    made at construction (off the loop: it writes cgroup files); a group that cannot be made is
    logged and the next layer is used. Never raises OSError."""

    def __init__(self, lanes: str, tree_id: str, shard: str):
        self.group: Path | None = None
        """The shard's directory in the idle group, or None."""
        self.layer = "nice" if lanes == "nice" else self._make_group(tree_id, shard)

    def _make_group(self, tree_id: str, shard: str) -> str:
        own = v1_controller("cpu")
        if own is None:
            return "sched_idle"
        top = own / TOP
        try:
            top.mkdir(exist_ok=True)
            layer = _mark_idle(top)
            group = top / tree_id / shard
            group.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("lanes: no idle cpu cgroup (%s): SCHED_IDLE instead", exc)
            return "sched_idle"
        self.group = group
        return layer

    def join_fn(self) -> Callable[[], None] | None:
        """What a lane command runs between fork and exec for its class (plain `os` calls only):
        join the shard's group, or switch to SCHED_IDLE; None under "nice"."""
        if self.group is not None:
            return cgroup_joiner([self.group], "no idle cpu cgroup")
        if self.layer == "sched_idle":
            return _sched_idle
        return None

    def remove(self) -> None:
        """Remove the shard's directory, and the tree's when empty (at the shard's stop, once
        its lanes are gone). A directory still in use stays; never raises OSError."""
        if self.group is None:
            return
        for path in (self.group, self.group.parent):
            with contextlib.suppress(OSError):
                path.rmdir()


def _mark_idle(group: Path) -> str:
    """Make `group` idle: `cpu.idle = 1`, else the least `cpu.shares`. Returns the layer.
    Raises OSError when neither can be written."""
    try:
        (group / "cpu.idle").write_text("1")
        return "cpu.idle"
    except FileNotFoundError:
        (group / "cpu.shares").write_text(str(IDLE_SHARES))
        return "cpu.shares"


def _sched_idle() -> None:
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
