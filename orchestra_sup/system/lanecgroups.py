"""The cgroups of one shard's lanes (`LaneCgroups`): one cgroup v2 per lane, so none of a lane's
processes outlives the lane or its shard.

Layout, below the base `system.cgroups` finds (`cgroups_base()`)::

    <base>/orchestra-sup/<tree_id>/<shard name>/<lane id>

A lane's command joins its cgroup between fork and exec (`LaneCgroups.join_fn`, as Popen's
`preexec_fn`), so everything it ever forks is born inside, and `LaneCgroups.kill` kills the
cgroup's whole content once the lane ends. Where cgroups are unavailable every method is a no-op
(see `system.cgroups` for when, and for how a kill is done).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from orchestra_sup.system.cgroups import (
    KILL_TIMEOUT_S,
    TOP,
    cgroups_base,
    check_component,
    kill_and_remove,
    kill_tree_sync,
    send_kill,
)
from orchestra_sup.system.linux import cgroup_joiner

log = logging.getLogger(__name__)


class LaneCgroups:
    """The cgroups of one shard's lanes: `<base>/orchestra-sup/<tree_id>/<shard_name>/`.

    Usage by a shard, per lane::

        path = cgroups.create(lane_id)
        try:
            await run_shell(
                ...,
                preexec=LaneCgroups.join_fn(path) if path else None,
                on_stop=lambda: cgroups.kill_now(lane_id),
            )
        finally:
            await cgroups.kill(lane_id)

    and `kill_all_sync()` when the shard starts (leftovers of a previous incarnation) and stops.
    When cgroups are unavailable (`cgroups_base()` is None at construction) `base` is None,
    `create` returns None and the kills are no-ops that return True.

    Raises (constructor): ValueError when `tree_id` or `shard_name` is not a single path
    component (empty, contains "/" or NUL, or starts with ".").
    """

    def __init__(self, tree_id: str, shard_name: str):
        check_component(tree_id, "tree id")
        check_component(shard_name, "shard name")
        root = cgroups_base()
        self.base: Path | None = None if root is None else root / TOP / tree_id / shard_name
        """This shard's cgroup directory (created on the first `create`), or None."""

    @property
    def available(self) -> bool:
        """Whether lanes are tracked by cgroups (False: everything here is a no-op)."""
        return self.base is not None

    def path(self, lane: str) -> Path | None:
        """The lane's cgroup directory (it may not exist), or None when unavailable.

        Raises ValueError when `lane` is not a single path component (see the class)."""
        check_component(lane, "lane id")
        return None if self.base is None else self.base / lane

    def create(self, lane: str) -> Path | None:
        """Make the lane's cgroup (and the shard's and tree's above it) and return its path.

        Returns None, without raising, when cgroups are unavailable or the directory cannot be
        made (logged as a warning): the lane then runs untracked. An existing cgroup of that name
        is reused. Raises ValueError when `lane` is not a single path component.
        """
        path = self.path(lane)
        if path is None:
            return None
        for _attempt in range(3):
            try:
                path.mkdir(parents=True, exist_ok=True)
                return path
            except FileNotFoundError:
                continue  # a parent was removed between two mkdirs (another shard's cleanup)
            except OSError as exc:
                log.warning("lane %s: no cgroup (%s); tracked by process group only", lane, exc)
                return None
        log.warning("lane %s: no cgroup (its parent keeps disappearing)", lane)
        return None

    @staticmethod
    def cpu_s(path: Path) -> float:
        """CPU seconds (user + system) used so far by every process that was ever in the cgroup
        at `path` (`cpu.stat` `usage_usec`, present in every cgroup v2 whatever the controllers;
        a small file, read on the caller's thread). 0.0 when it cannot be read (the cgroup is
        gone, an old kernel): the lane's CPU is then not counted, never an error."""
        try:
            with open(path / "cpu.stat", "rb") as fh:
                for line in fh.read().splitlines():
                    key, _, value = line.partition(b" ")
                    if key == b"usage_usec":
                        return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return 0.0

    @staticmethod
    def join_fn(path: Path) -> Callable[[], None]:
        """A function for Popen's `preexec_fn` that moves the calling process into the cgroup at
        `path` (writes "0" to its `cgroup.procs`).

        It runs in the child between fork and exec, so the command is in the cgroup before it
        runs and before it can fork. It uses only `os.open`/`os.write`/`os.close` on a path
        prepared here. It never raises: if the move fails (the cgroup was removed meanwhile, ...)
        it writes one line saying so to the child's stderr (the lane's output) and lets the
        command run untracked, rather than fail the spawn with an opaque SubprocessError.
        """
        return cgroup_joiner([path], "not tracked by cgroup")

    def kill_now(self, lane: str) -> None:
        """Send the kill to every process in the lane's cgroup (sub-cgroups included) now, on
        the caller's thread, without waiting for it to empty or removing it (`kill` does both):
        `cgroup.kill` (Linux >= 5.14: one write), else freeze, SIGKILL every listed pid, thaw.
        For the moment a lane's command is stopped, so nothing in its cgroup (a setsid'ed
        daemon) spends on while its pipes drain. A no-op when cgroups are unavailable or the
        cgroup does not exist. Never raises for the cgroup's files (an OSError is logged);
        raises ValueError when `lane` is not a single path component."""
        path = self.path(lane)
        if path is not None:
            send_kill(path)

    async def kill(self, lane: str, timeout_s: float = KILL_TIMEOUT_S) -> bool:
        """Kill every process in the lane's cgroup (sub-cgroups included), wait until it is
        empty, and remove it (sub-cgroups deepest first).

        The kill is sent before the first await (`cgroup.kill`, or freeze + SIGKILL + thaw on
        Linux < 5.14); the wait is at most `timeout_s` seconds (typically ~15 ms) on change
        notifications of `cgroup.events` and never blocks the loop.

        Returns True when the cgroup is gone, including when it never existed (an unknown lane)
        or cgroups are unavailable; the shard's and the tree's directories are then removed too
        if no other lane or shard has a cgroup there. Returns False (logged) when live processes
        remained at the deadline, the cgroup could not be removed, or a control file could not
        be read or written (no OSError is raised: this runs in `finally` clauses); the cgroup is
        then left for `kill_all_sync` to retry.

        Raises:
            ValueError: `lane` is not a single path component, or its cgroup contains the
                calling process.
            asyncio.CancelledError: the caller was cancelled while waiting; the kill has been
                sent, the cgroup may be left for `kill_all_sync`.
        """
        path = self.path(lane)
        if path is None:
            return True
        gone = await kill_and_remove(path, timeout_s)
        if gone:
            self._prune()
        return gone

    def kill_all_sync(self, timeout_s: float = KILL_TIMEOUT_S) -> bool:
        """Kill every lane of this shard, remove the shard's cgroup directory, and the tree's if
        that is now empty; blocking, at most `timeout_s` seconds. For shard start (what a
        previous incarnation left) and stop. Returns and raises as `kill_tree_sync`
        (True as well when cgroups are unavailable or nothing exists)."""
        if self.base is None:
            return True
        gone = kill_tree_sync(self.base, timeout_s)
        if gone:
            self._prune()
        return gone

    def _prune(self) -> None:
        """Remove the shard's and the tree's directories if they hold no cgroup (EBUSY while
        another lane or shard has one: left alone). `create` makes them again as needed, so an
        idle shard leaves nothing behind, even if it is later killed without a `kill_all_sync`."""
        assert self.base is not None
        for directory in (self.base, self.base.parent):
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # EBUSY / ENOTEMPTY: in use
                return
