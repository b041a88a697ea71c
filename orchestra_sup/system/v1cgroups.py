"""Where this process's own cgroup is in a cgroup v1 hierarchy (`v1_controller`).

On hybrid machines (these ones: notes/isolation.md) the v1 hierarchies hold the controllers that
limit (memory, pids) and rank (cpu) a lane; cgroup v2 only tracks (`system.cgroups`). A cgroup
made for a lane is nested under this process's own cgroup of that controller, read from
`/proc/self/cgroup` (the memory one differs per machine). A shard removes its own directories
as it stops; what a killed one (or a killed tree) leaves the supervisor removes (`sweep`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from orchestra_sup.system.cgroups import ENV_SWITCH, TOP


def _own_path(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of `controller` ("/process_api/ab12..."),
    from /proc/self/cgroup; None when that controller has no v1 hierarchy."""
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        _id, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _mount(controller: str) -> tuple[Path, str] | None:
    """(mount point, root inside the hierarchy) of the v1 hierarchy of `controller`."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup":
            continue
        if controller in tail[2].split(","):
            return Path(fields[4]), fields[3]
    return None


def v1_controller(controller: str) -> Path | None:
    """This process's own cgroup directory in the v1 hierarchy of `controller` ("memory",
    "pids", "cpu"), when it exists and this process may create cgroups in it; else None (also under
    `ORCHESTRA_SUP_CGROUP=off`). Never raises."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "off":
        return None
    mount, own = _mount(controller), _own_path(controller)
    if mount is None or own is None:
        return None
    point, root = mount
    try:
        inner = Path(own).relative_to(root)
    except ValueError:  # our cgroup is outside what is mounted here
        return None
    path = point / inner
    return path if os.access(path, os.W_OK | os.X_OK) else None


SWEPT = ("cpu", "memory", "pids")
"""The v1 controllers lanes get directories in (`system.lanecpu`, `shards.limits`)."""


def sweep(tree_id: str, shard: str | None = None) -> None:
    """Remove what a dead shard generation (`shard`: "<name>.<generation>") or, with None, a
    whole tree left in the v1 hierarchies (`SWEPT`), deepest first, where it is empty: a shard
    that is SIGKILLed (or a tree whose supervisor is) never removes its own, and its next
    generation makes directories of its own beside them. Call once their processes are gone
    (`system.cgroups.kill_tree_sync`); a directory still in use stays. Never raises."""
    for controller in SWEPT:
        own = v1_controller(controller)
        if own is None:
            continue
        tree = own / TOP / tree_id
        top = tree / shard if shard is not None else tree
        with contextlib.suppress(OSError):
            below = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for path in [*below, top, *([tree] if shard is not None else [])]:
                with contextlib.suppress(OSError):
                    path.rmdir()
