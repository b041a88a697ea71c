"""How a lane's command is confined: the isolation mode, its bubblewrap argv, its rlimits.

Every command of a lane runs as `[*wrap, "/bin/sh", "-c", command]` (`shards.shell.run_shell`),
where `wrap` is empty in mode "none" and a bubblewrap (`bwrap`) invocation in mode "bwrap", with
`preexec` between fork and exec: join the lane's cgroups (`shards.cgroup`, `shards.limits`), then
the resource limits of `rlimits` (inherited by bwrap and everything inside it), then `nice`.

What bubblewrap adds (`bwrap_argv`; docs/adr/0011-lane-isolation.md says why each):

- `/` read-only; the lane's sandbox the only writable host path; private tmpfs on `/tmp`, a
  fresh `/dev` and `/proc`;
- the host's home, the tree's state and run directories hidden under empty tmpfs (a lane sees no
  other lane's sandbox, no LMDB, no socket), with the few paths inside them a lane needs bound
  back read-only: the shard's interpreter and import path (`$ORCHESTRA_PYTHON`), the object
  stores the sandbox borrows through git alternates, the lane's own inbox file;
- new user, mount, network (loopback only), pid, ipc, uts and cgroup namespaces; no capabilities
  (`--cap-drop ALL`, so root inside cannot unmount what hides the host); no nested user
  namespaces; SIGKILL when its parent (the shard) dies.

No `--new-session`: the command stays in the process group `run_shell` kills, and the cgroup
joined before exec holds whatever leaves the group (a pid namespace also ends with its first
process: a setsid'd daemon dies with the command).
"""

from __future__ import annotations

import functools
import math
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import msgspec

from orchestra_sup.errors import ConfigError

__all__ = [
    "CPU_MARGIN_S",
    "MODES",
    "IsolationSettings",
    "Mode",
    "bwrap_argv",
    "bwrap_binary",
    "bwrap_problem",
    "effective",
    "object_stores",
    "python_paths",
    "resolve",
    "rlimits",
    "set_rlimits_fn",
]

MODES = ("auto", "bwrap", "none")
"""What `[isolation] mode` may say: the strongest available, bubblewrap or nothing more."""

Mode = Literal["bwrap", "none"]
"""A mode in effect (what "auto" resolved to)."""

GiB = 1 << 30

CPU_MARGIN_S = 1.0
"""Seconds RLIMIT_CPU lies past the CPU a lane has left, so the budget stop comes first."""


class IsolationSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`[isolation]`: how lanes' commands are confined. Limits apply per process unless noted.

    - `mode`: "auto" (default: "bwrap" where bubblewrap works here, else "none"), "bwrap"
      (refused at start where it does not work: `resolve`) or "none" (process group, rlimits,
      scrubbed environment and cgroups only).
    - `max_memory_bytes`: address space of each process (RLIMIT_AS; an allocation beyond it
      fails, e.g. MemoryError) and the resident memory of the whole lane where a cgroup v1
      memory controller exists (the kernel's OOM killer stops it). Default 4 GiB.
    - `max_open_files`: file descriptors per process (RLIMIT_NOFILE), default 4096.
    - `max_file_bytes`: largest file a process may write (RLIMIT_FSIZE: SIGXFSZ beyond it), and
      the size of each private tmpfs in mode "bwrap". Default 4 GiB.
    - `max_processes`: tasks (processes and threads) of the whole lane, through the cgroup v1
      pids controller where it exists (forks beyond it fail with EAGAIN). Default 1024. Not an
      RLIMIT_NPROC: that counts every process of the uid, and is not enforced for root.
    """

    mode: Literal["auto", "bwrap", "none"] = "auto"
    max_memory_bytes: int = 4 * GiB
    max_open_files: int = 4096
    max_file_bytes: int = 4 * GiB
    max_processes: int = 1024


# --- the mode ------------------------------------------------------------------------------------

_PROBE_TIMEOUT_S = 10.0
"""How long the trial run of bubblewrap may take (it takes ~7 ms)."""


def _namespace_flags() -> list[str]:
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
    ]


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot confine a lane here, or None when it can.

    Looks for `bwrap` in `TRUSTED_PATH` and runs `/bin/true` in it with every namespace and flag
    `bwrap_argv` uses (~7 ms; the answer is cached for the life of the process). The reason is
    one line: "bwrap not found in the system's directories (apt-get install -y bubblewrap)",
    or bwrap's own error
    (e.g. user namespaces disabled). Never raises.
    """
    path = bwrap_binary()
    if path is None:
        return "bwrap not found in the system's directories (apt-get install -y bubblewrap)"
    argv = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    try:
        done = subprocess.run(
            [*argv, *_namespace_flags(), "--", "/bin/true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} cannot run: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{path} fails here: {said[-1] if said else f'exit status {done.returncode}'}"
    return None


def resolve(mode: str) -> Mode:
    """The mode in effect for `[isolation] mode = mode`: "auto" is "bwrap" where
    `bwrap_problem()` is None, else "none".

    Raises:
        ConfigError: `mode` is "bwrap" and bubblewrap does not work here (the message says why
            and how to install it), or `mode` is not one of `MODES`.
    """
    if mode not in MODES:
        raise ConfigError(f"[isolation] mode = {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return "none"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if mode == "bwrap":
        raise ConfigError(f'[isolation] mode = "bwrap": bubblewrap is not usable: {problem}')
    return "none"


def effective(settings: IsolationSettings) -> IsolationSettings:
    """`settings` with its mode resolved (`resolve`): what a shard is told to apply.
    Raises `ConfigError` as `resolve`."""
    return msgspec.structs.replace(settings, mode=resolve(settings.mode))


# --- resource limits -----------------------------------------------------------------------------


def rlimits(settings: IsolationSettings, cpu_s: float | None) -> dict[int, int]:
    """The rlimits of one command: resource -> limit (soft = hard, so the command cannot raise
    it), from `settings` and the CPU seconds the lane has left of its grant (`cpu_s`, None: no
    grant). RLIMIT_CPU is per process and a backstop: the lane's `BudgetWatch` stops the lane as
    a whole when it spends its grant (the `budget_exhaustion` the coordinator acts on), so the
    rlimit is one second past it (`CPU_MARGIN_S`; at least 1 s), for a process the watch could
    not see; SIGXCPU at the soft limit, SIGKILL one second later (`set_rlimits_fn`)."""
    limits = {
        resource.RLIMIT_AS: settings.max_memory_bytes,
        resource.RLIMIT_NOFILE: settings.max_open_files,
        resource.RLIMIT_FSIZE: settings.max_file_bytes,
    }
    if cpu_s is not None:
        limits[resource.RLIMIT_CPU] = max(1, math.ceil(cpu_s + CPU_MARGIN_S))
    return limits


def set_rlimits_fn(limits: dict[int, int]) -> Callable[[], None]:
    """A function for the child between fork and exec that sets `limits` (`rlimits`).

    Each limit is clamped in the parent, now, to the current hard limit (a process may lower it,
    never raise it without privilege); RLIMIT_CPU's hard limit is one second above its soft
    limit, so SIGXCPU comes first. The function only calls `resource.setrlimit`; an error there
    fails the spawn (Popen raises `SubprocessError`): a command never runs less bounded than
    asked.
    """
    pairs: list[tuple[int, int, int]] = []
    for which, limit in limits.items():
        _soft, hard = resource.getrlimit(which)
        top = hard if hard != resource.RLIM_INFINITY else limit + 1
        soft = min(limit, top)
        pairs.append((which, soft, min(soft + 1, top) if which == resource.RLIMIT_CPU else soft))

    def apply() -> None:
        for which, soft, hard in pairs:
            resource.setrlimit(which, (soft, hard))

    return apply


# --- the bubblewrap argv -------------------------------------------------------------------------


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """`paths` without those inside another of them, shortest first (the mount order)."""
    ordered = sorted({Path(os.path.abspath(p)) for p in paths}, key=lambda p: (len(p.parts), p))
    kept: list[Path] = []
    for path in ordered:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def bwrap_argv(
    bwrap: str,
    *,
    sandbox: Path,
    hidden: Iterable[Path],
    readable: Iterable[Path],
    files: Iterable[Path] = (),
    tmpfs_bytes: int,
) -> list[str]:
    """The argv prefix that runs a command under bubblewrap (the command follows "--").

    - `bwrap`: the bubblewrap executable (absolute path).
    - `sandbox`: the only writable host directory, bound at its own path, and the working
      directory.
    - `hidden`: directories covered by an empty private tmpfs (with `/tmp` always), e.g. the
      host's home and the tree's state and run directories.
    - `readable`: directories bound back read-only at their own path; only those inside a hidden
      directory (or `/tmp`) are bound, the rest are already visible read-only. Must exist.
    - `files`: files bound read-only at their own path (e.g. the lane's inbox, which the shard
      appends to while the command reads it); must exist.
    - `tmpfs_bytes`: the size cap of each private tmpfs (bytes).

    Pure: builds the list, touches nothing. Mount order is what makes it work: tmpfs first
    (outermost first), then the read-only binds, then the files and the sandbox, so a bind
    inside a hidden directory lands on the tmpfs (bwrap makes the mount point there).
    """
    covers = _outermost([Path("/tmp"), *hidden])
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in covers:
        argv += ["--size", str(tmpfs_bytes), "--tmpfs", str(path)]
    for path in _outermost(readable):
        if any(path.is_relative_to(c) for c in covers) and not path.is_relative_to(sandbox):
            argv += ["--ro-bind", str(path), str(path)]
    for path in files:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--bind", str(sandbox), str(sandbox), "--chdir", str(sandbox)]
    return [*argv, *_namespace_flags(), "--"]


def python_paths() -> list[Path]:
    """What this interpreter needs to run (it is the lanes' `$ORCHESTRA_PYTHON`): its prefixes
    (a venv's and the base installation's), the directory of its real executable, and every
    directory on its import path (editable installs included). Existing directories only."""
    found = [
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.base_exec_prefix),
        Path(os.path.realpath(sys.executable)).parent,
        *(Path(p) for p in sys.path if p and os.path.isabs(p)),
    ]
    return [p for p in found if p.is_dir()]


def object_stores(workspace: Path) -> list[Path]:
    """The object store a `git clone --shared` sandbox borrows (docs/adr/0002): the workspace's
    `.git/objects`, as the tree knows its workspace, when it is a directory; else nothing.
    Never raises.

    Never read from the sandbox's own `.git/objects/info/alternates`: the lane writes that
    file, and a path it named there would be mounted into its next command, over the very
    directories isolation hides (an attacker read the tree's CURVE secret key and steered it
    through `ctl.ipc` that way)."""
    objects = workspace / ".git" / "objects"
    return [Path(os.path.realpath(objects))] if objects.is_dir() else []


TRUSTED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where `bwrap` is looked for: the system's directories, never the shard's PATH (a `bwrap`
first on a PATH someone else can write to would be trusted to confine every lane)."""


@functools.cache
def bwrap_binary() -> str | None:
    """The `bwrap` the tree runs lanes under (`TRUSTED_PATH`), or None."""
    return shutil.which("bwrap", path=TRUSTED_PATH)
