"""Which isolation layers this machine offers a shard's lanes, and why not (`orchestra-sup doctor`).

Each layer is probed the way the shard would use it (bubblewrap by a trial run, cgroups by the
writability of the directory a lane's cgroup would be made in), so "available" means it would
work for a tree started here by this user, not merely that the kernel has it.
"""

from __future__ import annotations

import ctypes
import os
import resource
from pathlib import Path

import msgspec

from orchestra_sup.paths import default_state_dir
from orchestra_sup.system.cgroups import cgroup2_root
from orchestra_sup.system.doctorlayer import Layer
from orchestra_sup.system.isolation import bwrap_problem, resolve, resolve_lane_user, uid_problem
from orchestra_sup.system.laneuser import FIRST_UID, decide, lane_needs
from orchestra_sup.system.v1cgroups import v1_controller

__all__ = ["Layer", "Report", "diagnose"]


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """Every layer, in the order they are listed, the mode `auto` would pick here, and whether
    `lane_user = "auto"` would run lanes as uids of their own (`auto_own_uids`)."""

    layers: list[Layer]
    auto_mode: str
    auto_own_uids: bool = False


_SYS_LANDLOCK_CREATE_RULESET = 444  # x86_64 and aarch64 alike (the generic syscall table)
_LANDLOCK_CREATE_RULESET_VERSION = 1
_PR_GET_SECCOMP = 21


def _namespace(kind: str) -> tuple[bool, str]:
    """Whether this kernel offers `kind` namespaces ("user", "net", "pid")."""
    if not Path(f"/proc/self/ns/{kind}").exists():
        return False, f"the kernel has no {kind} namespaces (/proc/self/ns/{kind} is missing)"
    if kind == "user":
        try:
            most = int(Path("/proc/sys/user/max_user_namespaces").read_text())
        except (OSError, ValueError):
            most = 1
        if most == 0:
            return False, "disabled: /proc/sys/user/max_user_namespaces is 0"
    return True, f"/proc/self/ns/{kind}"


def _landlock() -> tuple[bool, str]:
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 0:
        return False, f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    return True, f"ABI {abi}; not applied by orchestra-sup yet (bubblewrap's mounts do its work)"


def _seccomp() -> tuple[bool, str]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return False, f"prctl(PR_GET_SECCOMP): {os.strerror(ctypes.get_errno())}"
    return True, "the kernel has it; no filter applied by orchestra-sup yet"


def _lane_uids(auto: str) -> tuple[Layer, bool]:
    """The "lane uid" layer, and whether "auto" uses it, for a tree started here with the
    default state directory and this interpreter."""
    if auto == "bwrap":
        problem = uid_problem()
        own = resolve_lane_user("auto", "bwrap") == "dynamic"
        detail = problem or "bubblewrap hands each lane's command to its sandbox's own uid"
    else:
        workspace = default_state_dir() / "workspace"
        decision = decide("auto", lane_needs(default_state_dir(), workspace))
        own = decision.own_uids
        problem = None if own else decision.reason
        detail = problem or "each lane's command runs as its sandbox's own uid"
    if problem is None:
        detail += f" (from {FIRST_UID}): the tree's files, 0600 and 0700, are closed to lanes"
    else:
        detail += "; lanes run as the tree's uid, which can read the tree's files"
    return Layer(name="lane uid", available=problem is None, detail=detail, used=own), own


def diagnose() -> Report:
    """Probe every layer (~20 ms: a trial run of bubblewrap, and as root one of bubblewrap
    running a command as a lane's uid). Never raises."""
    auto = resolve("auto")
    problem = bwrap_problem()
    uids, own = _lane_uids(auto)
    layers = [
        Layer(
            name="bwrap",
            available=problem is None,
            detail=problem
            or "bubblewrap runs here with every namespace lanes get; it hides the state, run "
            "and keys directories and the home",
            used=auto == "bwrap",
        ),
        uids,
        Layer(
            name="private state",
            available=True,
            detail="state files 0600, directories 0700 (0711 for the state, sandboxes and "
            "inboxes directories where lanes of their own uid walk to theirs in mode none)",
            used=True,
        ),
    ]
    for kind in ("user", "net", "pid"):
        ok, detail = _namespace(kind)
        layers.append(
            Layer(
                name=f"{kind} namespace", available=ok, detail=detail, used=ok and auto == "bwrap"
            )
        )
    v2 = cgroup2_root()
    layers.append(
        Layer(
            name="cgroup v2 tracking",
            available=v2 is not None,
            detail=str(v2) if v2 else "no writable cgroup2 mount (not root, or read-only)",
            used=v2 is not None,
        )
    )
    for controller in ("memory", "pids"):
        path = v1_controller(controller)
        detail = str(path) if path else "no writable v1 hierarchy of this controller"
        layers.append(
            Layer(
                name=f"cgroup v1 {controller}",
                available=path is not None,
                detail=detail,
                used=path is not None,
            )
        )
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    layers.append(
        Layer(
            name="rlimits",
            available=True,
            detail="address space, CPU seconds, open files, file size (set before exec)"
            + ("" if hard == resource.RLIM_INFINITY else f"; hard RLIMIT_AS here {hard}"),
            used=True,
        )
    )
    for name, probe in (("landlock", _landlock), ("seccomp", _seccomp)):
        ok, detail = probe()
        layers.append(Layer(name=name, available=ok, detail=detail, used=False))
    return Report(layers=layers, auto_mode=auto, auto_own_uids=own)
