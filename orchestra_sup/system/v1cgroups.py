"""Where this process's own cgroup is in a cgroup v1 hierarchy (`v1_controller`).

On hybrid machines (these ones: notes/isolation.md) the v1 hierarchies hold the controllers that
limit (memory, pids) and rank (cpu) a lane; cgroup v2 only tracks (`system.cgroups`). A cgroup
made for a lane is nested under this process's own cgroup of that controller, read from
`/proc/self/cgroup` (the memory one differs per machine).
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestra_sup.system.cgroups import ENV_SWITCH


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
