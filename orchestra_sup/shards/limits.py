"""Memory and process limits of a whole lane, through the cgroup v1 memory and pids controllers.

On hybrid machines (these ones: notes/isolation.md) cgroup v2 only tracks (`system.cgroups`): its
hierarchy has no memory or pids controller. The v1 hierarchies have them, so each lane gets, per
controller that is mounted and writable, a directory nested under this process's own cgroup of
that controller (read from `/proc/self/cgroup`: the memory one differs per machine)::

    <v1 mount of CTRL>/<own path>/orchestra-sup/<tree_id>/<shard>.<generation>/<lane>

with `memory.limit_in_bytes` (the lane's resident memory, page cache and tmpfs included: past
it the kernel reclaims, then OOM-kills inside the lane only) and `pids.max` (tasks, threads
included: a fork past it fails with EAGAIN, so a fork bomb stalls instead of filling the
machine). The command joins them between fork and exec (`join_fn`), like its v2 cgroup.

v1 has no `cgroup.kill`: killing stays the job of the v2 cgroup and of the process group; these
directories are removed once the command's processes are gone (`remove`), and a shard removes
what a previous incarnation of it left (`remove_all`). Where a controller is missing (pure v2, no
root, `ORCHESTRA_SUP_CGROUP=off`) it is skipped: the rlimits of `system.isolation` remain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from orchestra_sup.system.cgroups import TOP
from orchestra_sup.system.linux import cgroup_joiner
from orchestra_sup.system.v1cgroups import v1_controller

__all__ = ["CONTROLLERS", "LaneLimits"]

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids")
"""The cgroup v1 controllers used, in the order a command joins them."""

_LIMIT_FILE = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}


class LaneLimits:
    """The v1 limit cgroups of one shard's lanes (see the module docstring).

    `shard` is the shard's directory name (`<name>.<generation>`, as `LaneCgroups`). With no
    usable controller every method is a no-op (`create` returns []).
    """

    def __init__(self, tree_id: str, shard: str):
        self.bases: dict[str, Path] = {}
        """Controller -> this shard's directory in it (made on the first `create`)."""
        for controller in CONTROLLERS:
            own = v1_controller(controller)
            if own is not None:
                self.bases[controller] = own / TOP / tree_id / shard

    def create(self, lane: str, *, memory_bytes: int, processes: int) -> list[Path]:
        """Make the lane's cgroups with their limits and return them (to `join_fn`). A
        controller whose directory or limit cannot be written is skipped, logged: the lane then
        runs without that limit, never fails for it. Never raises OSError."""
        made = []
        for controller, base in self.bases.items():
            path = base / lane
            value = memory_bytes if controller == "memory" else processes
            for _attempt in range(3):  # a parent may vanish meanwhile (a sibling's `remove`)
                try:
                    path.mkdir(parents=True, exist_ok=True)
                    (path / _LIMIT_FILE[controller]).write_text(str(value))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    log.warning("lane %s: no %s limit (%s)", lane, controller, exc)
                    break
                made.append(path)
                break
        return made

    @staticmethod
    def join_fn(paths: list[Path]) -> Callable[[], None]:
        """A function for the child between fork and exec that moves it into every cgroup of
        `paths` (writes "0" to each `cgroup.procs`). Plain `os` calls only; a failed move is one
        line on the child's stderr (the lane's output) and the command runs without that limit
        (the same choice as `LaneCgroups.join_fn`)."""
        return cgroup_joiner(paths, "no cgroup limit")

    def remove(self, lane: str) -> None:
        """Remove the lane's cgroups, and the shard's and tree's directories when empty. Call
        once its processes are gone (the v2 kill); a cgroup still in use stays (logged), for
        `remove_all`. Never raises OSError."""
        for base in self.bases.values():
            _rmdir(base / lane, log_busy=True)
            _rmdir(base)
            _rmdir(base.parent)

    def remove_all(self) -> None:
        """Remove this shard's directories (what a previous incarnation left, or everything
        at stop) where they are empty. Never raises OSError."""
        for base in self.bases.values():
            if base.is_dir():
                for lane in base.iterdir():
                    if lane.is_dir():
                        _rmdir(lane, log_busy=True)
            _rmdir(base)
            _rmdir(base.parent)


def _rmdir(path: Path, *, log_busy: bool = False) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:  # EBUSY: processes still in it, or other lanes below it
        if log_busy:
            log.warning("cgroup %s not removed: %s", path, exc)
