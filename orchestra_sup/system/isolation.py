"""How a lane's command is confined: the isolation mode, its bubblewrap argv, its rlimits.

Every command of a lane runs as `[*wrap, "/bin/sh", "-c", command]` (`shards.shell.run_shell`),
where `wrap` is empty in mode "none" and a bubblewrap (`bwrap`) invocation in mode "bwrap", with
`preexec` between fork and exec: join the lane's cgroups (`system.cgroups`, `shards.limits`), then
the resource limits of `rlimits` (inherited by bwrap and everything inside it), then, in mode
"none" for a lane of a uid of its own (`laneuser`), that uid (`as_uid_fn`); then `nice`.

What bubblewrap adds (`bwrap_argv`; docs/adr/0011-lane-isolation.md and
docs/adr/0016-lanes-see-only-their-sandbox.md say why each):

- `/` read-only; the lane's sandbox the only writable host path; private tmpfs on `/tmp` and
  the home, a fresh `/dev` and `/proc`;
- the tree's state, run and keys directories hidden under empty tmpfs (a lane sees no other
  lane's sandbox, no LMDB, no socket, no key), after the interpreter (`$ORCHESTRA_PYTHON`) is
  bound back, so a directory of the interpreter's that holds one of them does not bring it
  back; then the object store the sandbox borrows, the lane's own inbox file and its sandbox,
  all at their resolved paths;
- new user, mount, network (loopback only), pid, ipc, uts and cgroup namespaces; no capabilities
  (`--cap-drop ALL`, so root inside cannot unmount what hides the host); no nested user
  namespaces; SIGKILL when its parent (the shard) dies;
- for a lane of a uid of its own, that uid outside the namespace too: a root bubblewrap makes
  the mounts and hands the command to the uid (`bwrap_argv`'s `lane_uid`).

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import msgspec

from orchestra_sup.errors import ConfigError
from orchestra_sup.system import linux
from orchestra_sup.system.laneuser import FIRST_UID, LaneUser, check, impassable

__all__ = [
    "CPU_MARGIN_S",
    "MODES",
    "IsolationSettings",
    "Mode",
    "Mounts",
    "as_uid_fn",
    "bwrap_argv",
    "bwrap_binary",
    "bwrap_problem",
    "describe",
    "effective",
    "resolve",
    "resolve_lane_user",
    "rlimits",
    "set_rlimits_fn",
    "setpriv_binary",
    "uid_problem",
    "with_veils",
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
    - `lane_user`: "auto" (default), "dynamic" or "tree": whether a tree running as root gives
      each sandbox a uid of its own to run its lane as (`laneuser`). Resolved by
      `resolve_lane_user`; "auto" stays "auto" only in mode "none", where the custodian decides
      from the modes on the way to what a lane needs (`laneuser.decide`).
    """

    mode: Literal["auto", "bwrap", "none"] = "auto"
    max_memory_bytes: int = 4 * GiB
    max_open_files: int = 4096
    max_file_bytes: int = 4 * GiB
    max_processes: int = 1024
    lane_user: LaneUser = "auto"


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
    return _trial([*argv, *_namespace_flags(), "--", "/bin/true"], path)


def _trial(argv: list[str], path: str) -> str | None:
    """Run `argv` once: None when it succeeds, else why not in one line (naming `path`)."""
    try:
        done = subprocess.run(
            argv,
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


@functools.cache
def uid_problem() -> str | None:
    """Why bubblewrap cannot run a lane as a uid of its own here, or None when it can.

    Only root can: this process must be root, `setpriv` must be in `TRUSTED_PATH`, and the
    two-stage form of `bwrap_argv` (a root bubblewrap, `setpriv`, the namespaced bubblewrap as
    `laneuser.FIRST_UID`) must run `/bin/true` (~10 ms; cached). Root in a container without
    CAP_SYS_ADMIN, for one, cannot. The reason is one line. Never raises."""
    if os.geteuid() != 0:
        return f"the tree runs as uid {os.geteuid()}, not root"
    bwrap, setpriv = bwrap_binary(), setpriv_binary()
    if bwrap is None or setpriv is None:
        return "bwrap or setpriv not found in the system's directories"
    argv = [*_root_head(bwrap), *_as_uid(setpriv, FIRST_UID)]
    argv += [bwrap, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    return _trial([*argv, *_namespace_flags(), "--", "/bin/true"], bwrap)


def resolve_lane_user(setting: str, mode: Mode) -> str:
    """The `lane_user` in effect for `[isolation] lane_user = setting` under the resolved `mode`:
    "tree" when this process is not root; under "bwrap", "auto" is "dynamic" where
    `uid_problem()` is None, else "tree"; under "none", "auto" stays "auto" (`laneuser.decide`
    settles it where the paths are known).

    Raises:
        ConfigError: `setting` is not one of `laneuser.LANE_USERS`, or is "dynamic" where it
            cannot be honoured (not root; under "bwrap", `uid_problem()` says why).
    """
    check(setting)
    if os.geteuid() != 0:
        return "tree"
    if mode == "none" or setting == "tree":
        return setting
    problem = uid_problem()
    if problem is None:
        return "dynamic"
    if setting == "dynamic":
        raise ConfigError(
            f'[isolation] lane_user = "dynamic": bubblewrap cannot run a lane as another uid '
            f"here: {problem}"
        )
    return "tree"


def effective(settings: IsolationSettings) -> IsolationSettings:
    """`settings` with its mode resolved (`resolve`), then its lane user
    (`resolve_lane_user`): what a shard and the custodian are told to apply. Raises
    `ConfigError` as those do."""
    mode = resolve(settings.mode)
    return msgspec.structs.replace(
        settings, mode=mode, lane_user=resolve_lane_user(settings.lane_user, mode)
    )


def describe(mode: str, lane_uid: int | None) -> str:
    """Which of the layers that keep a lane from the tree's files hold for a lane of `lane_uid`
    (None: the tree's own) under `mode`, in a few words, for its transcript: e.g. "isolation
    bwrap (state, run and keys directories hidden), its own uid 1879048192 (the tree's files,
    0600 and 0700, closed to it)"."""
    what = (
        "isolation bwrap (state, run and keys directories hidden)"
        if mode == "bwrap"
        else "isolation none (nothing hidden)"
    )
    if lane_uid is not None:
        return f"{what}, its own uid {lane_uid} (the tree's files, 0600 and 0700, closed to it)"
    return f"{what}, the tree's uid {os.geteuid()} (the tree's files are open to it)"


def as_uid_fn(uid: int) -> Callable[[], None]:
    """A function for the child between fork and exec (mode "none", this process root) that
    makes it `uid` for good: no supplementary group, group `uid`, user `uid` (real, effective
    and saved), and no new privileges (a setuid program it runs gains nothing). Only `os` calls
    and one prctl; an error there fails the spawn (Popen raises `SubprocessError`): a command
    never runs as root when it should not."""

    def apply() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        linux.set_no_new_privs()

    return apply


# --- resource limits -----------------------------------------------------------------------------


def rlimits(settings: IsolationSettings, cpu_s: float | None) -> dict[int, int]:
    """The rlimits of one command: resource -> limit (soft = hard, so the command cannot raise
    it), from `settings` and the CPU seconds the lane has left of its grant (`cpu_s`, None: no
    grant). RLIMIT_CPU is per process and a backstop: the lane's `BudgetWatch` stops the lane as
    a whole when it spends its grant (the `budget_exhaustion` the coordinator acts on), so the
    rlimit is one second past it (`CPU_MARGIN_S`; at least 1 s), for a process the watch could
    not see; SIGXCPU at the soft limit, SIGKILL one second later (`set_rlimits_fn`).
    RLIMIT_RTPRIO is 0: a lane without CAP_SYS_NICE cannot take a real-time class and starve
    the control plane (`[cpu] realtime`; the unit's `RestrictRealtime=` cannot be kept then)."""
    limits = {
        resource.RLIMIT_AS: settings.max_memory_bytes,
        resource.RLIMIT_NOFILE: settings.max_open_files,
        resource.RLIMIT_FSIZE: settings.max_file_bytes,
        resource.RLIMIT_RTPRIO: 0,
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


@dataclass(frozen=True, kw_only=True)
class Mounts:
    """What one command's bubblewrap shows of the host. Every path absolute and resolved
    (`os.path.realpath`): bubblewrap mounts where a path leads, so a path through a symlink
    would hide the link's name and leave its target in view.

    - `sandbox`: the lane's sandbox, the only writable host directory, and the working directory.
    - `scratch`: directories replaced by a private, writable (1777) tmpfs: the home (`/tmp`
      always is).
    - `veiled`: directories replaced by an empty tmpfs (0711) before anything is bound back,
      e.g. those a lane's uid could not pass on the host (`/root` is 0700), so that what is bound
      inside them is reachable at its own path.
    - `readable`: directories bound back read-only, e.g. the interpreter (`laneuser.python_paths`);
      only those inside a tmpfs above (the rest are in view already), and never one that holds a
      `scratch` or `veiled` directory (binding it would undo the hiding).
    - `secret`: directories replaced by an empty tmpfs (0711) *after* `readable` is bound: the
      state, run and keys directories, hidden even when a readable directory holds them (a tree
      started from the directory its state lies in has that directory on its import path).
    - `stores`: directories bound read-only after `secret`: the object store a sandbox borrows
      (`laneuser.object_stores`), which may lie inside the state directory.
    - `files`: files bound read-only after `secret`: the lane's inbox.
    """

    sandbox: Path
    scratch: tuple[Path, ...] = ()
    veiled: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    secret: tuple[Path, ...] = ()
    stores: tuple[Path, ...] = ()
    files: tuple[Path, ...] = ()


def with_veils(mounts: Mounts, uid: int) -> Mounts:
    """`mounts` with `veiled` the directories a lane of `uid` could not pass on the host on the
    way to what is bound for it (`laneuser.impassable`; the interpreter under `/root`, 0700),
    those not hidden already: what is bound inside them is then reachable at its own path, and
    nothing else of them shows (it was closed to that uid anyway). Reads the modes on the way
    (not pure)."""
    hidden = [Path("/tmp"), *mounts.scratch, *mounts.secret]
    veils: dict[Path, None] = {}
    for path in (*mounts.readable, *mounts.stores, *mounts.files, mounts.sandbox):
        blocked = impassable(path.parent, uid, listed=False)
        if blocked is not None and not any(blocked.is_relative_to(h) for h in hidden):
            veils[blocked] = None
    return replace(mounts, veiled=tuple(veils))


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """`paths` without those inside another of them, shortest first (the mount order)."""
    ordered = sorted({Path(os.path.abspath(p)) for p in paths}, key=lambda p: (len(p.parts), p))
    kept: list[Path] = []
    for path in ordered:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


class _Layout:
    """The mount list being built, and what each path shows at that point: a directory inside a
    tmpfs exists only if made, so every one on the way to a mount point is made first (0711:
    passable, not listable), never left to bubblewrap (which makes them 0700 for a lane of
    another uid)."""

    def __init__(self, tmpfs_bytes: int):
        self.argv: list[str] = []
        self._layers: list[tuple[Path, bool]] = []  # (mount point, is a tmpfs), in order
        self._made: set[Path] = set()
        self._tmpfs_bytes = tmpfs_bytes

    def hidden(self, path: Path) -> bool:
        """Whether `path` lies under a tmpfs here (so it shows only what is bound back)."""
        return any(path.is_relative_to(p) for p, is_tmpfs in self._layers if is_tmpfs)

    def _skeleton(self, dest: Path) -> None:
        for step in reversed(dest.parents):
            owner = next((m for m in reversed(self._layers) if step.is_relative_to(m[0])), None)
            if owner is not None and owner[1] and owner[0] != step and step not in self._made:
                self.argv += ["--perms", "0711", "--dir", str(step)]
                self._made.add(step)

    def tmpfs(self, path: Path, perms: str) -> None:
        self._skeleton(path)
        self.argv += ["--perms", perms, "--size", str(self._tmpfs_bytes), "--tmpfs", str(path)]
        self._layers.append((path, True))

    def bind(self, flag: str, path: Path) -> None:
        self._skeleton(path)
        self.argv += [flag, str(path), str(path)]
        self._layers.append((path, False))


def bwrap_argv(
    bwrap: str,
    mounts: Mounts,
    *,
    tmpfs_bytes: int,
    lane_uid: int | None = None,
    setpriv: str = "setpriv",
) -> list[str]:
    """The argv prefix that runs a command under bubblewrap (the command follows "--"), showing
    the host as `mounts` says, with a private tmpfs of at most `tmpfs_bytes` bytes each.

    Mount order is what makes it work (docs/adr/0016): `/` read-only; the scratch and veiled
    tmpfs (outermost first); the readable binds; the secret tmpfs, over whatever a readable bind
    brought back of them; the stores and files; the sandbox.

    `lane_uid` None: one unprivileged bubblewrap, the command in a user namespace of this
    process's uid. A uid: this process is root, and the command runs as that uid and its group
    (`laneuser`): the mounts are made by a bubblewrap running as root (so they reach what that
    uid could not, such as an interpreter under `/root`), which keeps only CAP_SETUID and
    CAP_SETGID for `setpriv` to become that uid (no groups, no capabilities, no new privileges),
    which runs the namespaced bubblewrap as that uid: the same namespaces and flags as the first
    form, over the mounts made already.

    Pure: builds the list, touches nothing.
    """
    layout = _Layout(tmpfs_bytes)
    scratch = {Path("/tmp"), *mounts.scratch}
    for path in _outermost(scratch | set(mounts.veiled)):
        layout.tmpfs(path, "1777" if path in scratch else "0711")
    covers = [*scratch, *mounts.veiled]
    for path in _outermost(mounts.readable):
        if layout.hidden(path) and not any(c.is_relative_to(path) for c in covers):
            layout.bind("--ro-bind", path)
    for path in _outermost(mounts.secret):
        layout.tmpfs(path, "0711")
    for path in _outermost(mounts.stores):
        if layout.hidden(path):
            layout.bind("--ro-bind", path)
    for path in mounts.files:
        if layout.hidden(path):
            layout.bind("--ro-bind", path)
    layout.bind("--bind", mounts.sandbox)
    sandbox = str(mounts.sandbox)
    if lane_uid is None:
        head = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        return [*head, *layout.argv, "--chdir", sandbox, *_namespace_flags(), "--"]
    inner = [bwrap, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--chdir", sandbox]
    return [
        *_root_head(bwrap),
        *layout.argv,
        *_as_uid(setpriv, lane_uid),
        *inner,
        *_namespace_flags(),
        "--",
    ]


def _root_head(bwrap: str) -> list[str]:
    """The start of a root bubblewrap's argv: `/` read-only, a fresh `/dev` (the inner
    bubblewrap's `/dev` binds its nodes from there: from a read-only one, `/dev/null` could not
    be written), and the host's `/proc` writable (the inner one writes its user namespace's maps
    through it; the lane sees the inner's own `/proc` over it)."""
    return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--bind", "/proc", "/proc"]


def _as_uid(setpriv: str, uid: int) -> list[str]:
    """The end of a root bubblewrap's argv that hands its command to `uid` (and group `uid`,
    no other), with no capability left and no way to gain one."""
    return [
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CAP_SETUID",
        "--cap-add",
        "CAP_SETGID",
        "--die-with-parent",
        "--",
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--no-new-privs",
        "--",
    ]


TRUSTED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where `bwrap` is looked for: the system's directories, never the shard's PATH (a `bwrap`
first on a PATH someone else can write to would be trusted to confine every lane)."""


@functools.cache
def bwrap_binary() -> str | None:
    """The `bwrap` the tree runs lanes under (`TRUSTED_PATH`), or None."""
    return shutil.which("bwrap", path=TRUSTED_PATH)


@functools.cache
def setpriv_binary() -> str | None:
    """The `setpriv` (util-linux) that hands a root bubblewrap's command to a lane's uid
    (`TRUSTED_PATH`), or None."""
    return shutil.which("setpriv", path=TRUSTED_PATH)
