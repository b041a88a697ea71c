"""The cgroup a supervisor's helper runs in (a release's probe, its start check), so nothing the
helper starts outlives it.

A helper runs in a process group of its own, but a descendant that calls `setsid` or
double-forks leaves the group, and can hold the helper's output pipe for as long as it lives.
`HelperCgroup` is a `release.Tracker`: the helper joins a cgroup v2 of its own between fork and
exec (`linux.cgroup_joiner`), so everything it ever forks is born inside, and `kill` kills the
cgroup's whole content and removes it (`system.cgroups.kill_tree_sync` and `tree_path`: the two
names the supervisor already takes from there, for what a dead shard's lanes leave).

Where::

    <tree's cgroups>/probe-<8 hex digits>     (the tree's: `system.cgroups.tree_path(run_dir)`)

so a supervisor that dies while a helper runs leaves it to the next start's, or its own stop's,
kill of the whole tree. Where cgroups are unavailable (`tree_path` is None, or the directory
cannot be made), `kill` falls back on the supervisor being a child subreaper: what the helper
left, once its parent is gone, is reparented to the supervisor, and is killed as any dead
child's orphans are (`process.kill_orphans`, by pid and create time). That is later than at the
deadline for a process whose parent still lives; the cgroup has no such gap.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestra_sup.supervisor.process import kill_orphans
from orchestra_sup.system import linux
from orchestra_sup.system.cgroups import kill_tree_sync, tree_path

if TYPE_CHECKING:
    from orchestra_sup.supervisor.seam import ProcessSeam

log = logging.getLogger("orchestra_sup.supervisor")

PREFIX = "probe-"
"""How a helper's cgroup is named under the tree's (shards' are `<shard>.<generation>`)."""


class HelperCgroup:
    """A cgroup v2 for one helper of the tree whose run directory is `run_dir`, below the tree's
    cgroups (`tree_path(run_dir)`); `seam` says which children are the supervisor's own, for the
    orphan fallback. Used once, for one helper: pass it as `release.probe`'s `tracker`.

    Nothing is made until `preexec()`; `path` is then the cgroup's directory, or None (no
    cgroups, or mkdir failed: logged, and the helper runs tracked by the subreaper only).
    """

    def __init__(self, seam: ProcessSeam, run_dir: Path):
        self._seam = seam
        self._tree = tree_path(run_dir)
        self.path: Path | None = None

    def preexec(self) -> Callable[[], None] | None:
        """Make the cgroup; the function that moves the helper into it between fork and exec,
        or None when there is no cgroup. Never raises."""
        if self._tree is None:
            return None
        path = self._tree / f"{PREFIX}{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            log.warning("a release probe gets no cgroup (%s); tracked by the subreaper only", exc)
            return None
        self.path = path
        return linux.cgroup_joiner([path], "release probe not tracked by cgroup")

    async def kill(self) -> None:
        """Kill everything in the cgroup, wait (at most `system.cgroups.KILL_TIMEOUT_S`, off the
        loop) until it is empty, and remove it; without a cgroup, or when some of it could not
        be killed, kill the supervisor's orphans instead. Then reap the orphans: one that died
        while the helper itself was still unreaped had its SIGCHLD handled with the helper in
        the way (`process.reap_orphans` stops at a known child), and no other SIGCHLD may come.
        A second call finds the cgroup gone. Never raises."""
        gone = False
        if self.path is not None:
            try:
                gone = await asyncio.to_thread(kill_tree_sync, self.path)
            except ValueError as exc:  # not below the tree's cgroups: never made so here
                log.error("release probe cgroup %s: %s", self.path, exc)
        if not gone and not self._seam.spawning_helper():  # unknown: maybe that helper
            kill_orphans(self._seam.known_pids())
        self._seam.on_sigchld()
