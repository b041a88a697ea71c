"""`orchestra-sup systemd-unit`: a systemd service unit that runs `orchestra-sup start`.

`render(UnitSpec)` returns the unit's text; every directive is preceded by a comment line that
says why it is there (and the end of the unit says which hardening is left out, and why). The
unit passes `systemd-analyze verify` without a warning (tests/unit/test_unit.py).

The three variants:

- system (default): `/etc/systemd/system/orchestra-sup.service`, runs as root, `WantedBy=
  multi-user.target`, with mount-namespace hardening (`ProtectSystem=strict`, `ProtectHome=
  read-only`, `PrivateTmp=`);
- `user`: `~/.config/systemd/user/orchestra-sup.service`, `WantedBy=default.target`, no mount
  namespaces (a user manager cannot make one without `PrivateUsers=`, which systemd >= 253
  implies for them and which breaks bubblewrap);
- `template`: `orchestra-sup@.service`, one tree per instance name: config
  `%E/orchestra-sup/%i.toml` (`/etc` for the system manager, `$XDG_CONFIG_HOME` for a user's),
  state `orchestra-sup/%i`, run directory `orchestra-sup/%i`.

Values: each one is written so that systemd reads it back as itself (`exec_word` in
`ExecStart=`, `path_word` in `ReadWritePaths=`); one that no quoting can carry (a control
character, which would end the line and start a directive of its own, text that is not UTF-8,
a `%` that starts no specifier) is refused by `check`, naming the option.

Sizes: `TimeoutStopSec=` is `stop_budget_s` (above the longest stop the tree can take) and
`WatchdogSec=` is `watchdog_sec`, both from the config's `[supervisor]` and `[shards]` figures
(defaults when there is no config, or its path holds a systemd specifier such as `%i`).
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import msgspec

from orchestra_sup.config import Settings
from orchestra_sup.errors import ConfigError
from orchestra_sup.supervisor.root import STOP_ANNOUNCE_S
from orchestra_sup.supervisor.shape import SHARD_STOP_MARGIN_S
from orchestra_sup.system.cgroups import KILL_TIMEOUT_S
from orchestra_sup.system.cpupolicy import RTTIME_HARD_MARGIN_S, format_cpus, parse_cpus
from orchestra_sup.system.pathcheck import check_text, shown

NAME = "orchestra-sup"
EXIT_BAD_CONFIG = 2
"""`start`'s exit status for bad input (a config, a workspace, a directory in use: cli.EXIT_USAGE).
Restarting cannot fix any of them, so the unit does not (`RestartPreventExitStatus=`)."""
STOP_SLACK_S = 10.0
"""Seconds added to the stop budget for what is not a timeout: reaping, flushing LMDB, an
interpreter's exit."""
WATCHDOG_FLOOR_S = 30.0
"""Least `WatchdogSec=`: a few blocking steps (a cgroup kill, up to `KILL_TIMEOUT_S`) may hold
the supervisor's loop for seconds without it being wedged."""
TEMPLATE_CONFIG = "%E/orchestra-sup/%i.toml"
"""A template instance's config: `/etc/orchestra-sup/NAME.toml` (system manager) or
`$XDG_CONFIG_HOME/orchestra-sup/NAME.toml` (a user's)."""
_PRIVATE_TMP = ("/tmp", "/var/tmp")


class UnitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the unit is made from. `command`: the argv prefix that runs this installation's
    orchestra-sup (`installed_command`), absolute paths. `workspace`, `config`: absolute paths
    passed to `start` (None: not passed; a template's config defaults to `TEMPLATE_CONFIG`);
    they may hold systemd specifiers (`%i`, `%h`, ...). `settings`: the figures that size the
    timeouts (the config's, or the defaults)."""

    command: tuple[str, ...]
    user: bool = False
    template: bool = False
    workspace: str | None = None
    config: str | None = None
    settings: Settings = Settings()
    host: tuple[str, ...] = ()
    """A host's agent's unit: the words after `orchestra-sup host` (`--join`, `--keys`,
    `--name`, ...); () for a tree's."""


def installed_command() -> tuple[str, ...]:
    """The absolute argv prefix that runs this installation: the `orchestra-sup` script beside
    this interpreter (a venv's or a prefix's `bin/`) when it is there, else `python -m
    orchestra_sup` with this interpreter. The interpreter's path is kept as it is (a venv's
    `bin/python` is a symlink whose target would lose the venv)."""
    python = Path(sys.executable).absolute()
    script = python.parent / NAME
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (str(python), "-m", "orchestra_sup")


HOST_NAME = f"{NAME}-host"
"""A host's agent's unit, state and run directory name."""


def unit_name(template: bool, host: bool = False) -> str:
    """`orchestra-sup.service`, `orchestra-sup@.service` for the template, or
    `orchestra-sup-host.service` for a host's agent."""
    if host:
        return f"{HOST_NAME}.service"
    return f"{NAME}@.service" if template else f"{NAME}.service"


def stop_budget_s(settings: Settings) -> int:
    """Whole seconds above the longest stop `settings` allows (`RootSupervisor.run`'s stop,
    in order): the coordinator told the tree is stopping (`STOP_ANNOUNCE_S`); a shard's
    retiring generation, if a rollover was in its surge; every shard, one after the other
    (`shutdown_timeout_s` + `SHARD_STOP_MARGIN_S` each); the coordinator and the custodian
    (`shutdown_timeout_s` each); the lanes' cgroups killed (`KILL_TIMEOUT_S`); `STOP_SLACK_S`.
    A drain (`drain_timeout_s`) belongs to a rollover, which a stop cancels: not counted."""
    sup = settings.supervisor
    shard = sup.shutdown_timeout_s + SHARD_STOP_MARGIN_S
    total = (
        STOP_ANNOUNCE_S
        + shard * (settings.shards.count + 1)
        + 2 * sup.shutdown_timeout_s
        + KILL_TIMEOUT_S
        + STOP_SLACK_S
    )
    return math.ceil(total)


def watchdog_sec(settings: Settings) -> int:
    """`WatchdogSec=` in whole seconds: twice the children's `watchdog_s` (a supervisor whose
    loop stalls that long has been deaf to its children for two of their deadlines), at
    least `WATCHDOG_FLOOR_S`."""
    return math.ceil(max(WATCHDOG_FLOOR_S, 2 * settings.supervisor.watchdog_s))


_PLAIN = re.compile(r"[A-Za-z0-9/_.,:+=@%$-]+")
"""A word that needs no quotes (its `%` and `$` are still doubled as they need)."""
_SPECIFIER = re.compile(r"%[%ABCEGHIJLMNPSTUVWYabdfghijlmnopqstuvwy]")
"""A specifier systemd resolves in a unit file (systemd.unit(5), "Specifiers", systemd 252), or
`%%`. Any other `%` followed by a letter is a fatal error when systemd loads the unit."""
_UNSAFE_PROGRAM = frozenset("\\\"'")


def exec_word(arg: str, specifiers: bool = False) -> str:
    """`arg` as an argument on an `ExecStart=` command line that systemd hands the program as
    exactly `arg` (systemd.service(5) "Command lines", systemd.syntax(7) "Quoting"): `$`
    doubled (no variable is expanded), `%` doubled unless `specifiers` (then `%i` and the like
    are systemd's), and the word double-quoted with `\\` and `"` escaped when it holds
    anything but letters, digits and `/_.,:+=@%$-` (whitespace, quotes, backslashes, `;`,
    non-ASCII letters). `arg` must pass `check_value`."""
    return _path_word(arg.replace("$", "$$"), specifiers)


def program_word(path: str) -> str:
    """The program's absolute `path` as the first word of an `ExecStart=` command line: as
    `exec_word` quotes it, but `$` left alone (the program is never a variable, and systemd
    keeps a `$$` there as two). `path` must pass `check`'s rule for a program."""
    return _path_word(path, specifiers=False)


def path_word(path: str, specifiers: bool = False, prefix: str = "") -> str:
    """`prefix` + `path` as one item of a path list such as `ReadWritePaths=` (systemd.exec(5)):
    quoted and escaped as `exec_word` does, but `$` left alone (no variables there). `prefix`
    (`-`: a missing path is ignored) goes inside the quotes, where systemd looks for it after
    unquoting. `path` must pass `check_value`."""
    return _path_word(prefix + path, specifiers)


def _path_word(text: str, specifiers: bool) -> str:
    if not specifiers:
        text = text.replace("%", "%%")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_value(where: str, value: str, specifiers: bool = False) -> None:
    """Refuse a value that no quoting gives systemd back as itself; `where` names it (an
    option of `systemd-unit`). Raises `ConfigError` (one line) for a control character or a
    line separator (`pathcheck.check_text`), text that is not UTF-8 (a unit file must be), or,
    with `specifiers`, a `%` that starts no specifier (a literal one is written `%%`)."""
    check_text(where, value)
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ConfigError(f"{where} {shown(value)}: not UTF-8, which a unit file must be") from None
    if specifiers and _SPECIFIER.sub("", value).count("%"):
        raise ConfigError(
            f"{where} {shown(value)}: a '%' that starts no systemd specifier (%i, %h, ...); "
            "write a literal one as %%"
        )


def check(spec: UnitSpec) -> None:
    """`check_value` on every value of `spec` that goes into the unit; the program must be an
    absolute path (systemd reads a leading `-`, `@`, `+`, `!` or `:` as a flag) without a
    quote or a backslash (systemd refuses to load a unit whose program has one: "Executable
    name contains special characters"). Raises `ConfigError` naming it."""
    for arg in spec.command:
        check_value("the orchestra-sup command", arg)
    program = spec.command[0] if spec.command else ""
    if not program.startswith("/"):
        raise ConfigError(f"the orchestra-sup program {shown(program)}: not an absolute path")
    if _UNSAFE_PROGRAM.intersection(program):
        raise ConfigError(
            f"the orchestra-sup program {shown(program)}: systemd runs no program whose path "
            "holds a quote or a backslash; install it elsewhere"
        )
    check_value("--config", spec.config or "", specifiers=True)
    check_value("--workspace", spec.workspace or "", specifiers=True)
    for word in spec.host:
        check_value("a host's option", word)
    if spec.host and (spec.template or spec.workspace is not None):
        raise ConfigError("a host's unit has no --template and no --workspace (it runs shards)")


def _private_tmp_hides(spec: UnitSpec) -> list[str]:
    """Paths the unit needs that a private /tmp would hide (the program, the config, the
    workspace, a host's keys)."""
    paths = (spec.command[0], spec.config or "", spec.workspace or "", *spec.host)
    return [p for p in paths if any(p == t or p.startswith(t + "/") for t in _PRIVATE_TMP)]


def render(spec: UnitSpec) -> str:
    """The unit file's text (ends with a newline). Raises `ConfigError` for a value that
    cannot be written into a unit as itself (`check`)."""
    check(spec)
    lines: list[str] = []

    def directive(reason: str, line: str) -> None:
        lines.append(f"# {reason}")
        lines.append(line)

    instance = "/%i" if spec.template else ""
    config = (
        spec.config if spec.config is not None else (TEMPLATE_CONFIG if spec.template else None)
    )
    verb = ["host", *(exec_word(a) for a in spec.host)] if spec.host else ["start"]
    argv = [program_word(spec.command[0]), *(exec_word(a) for a in spec.command[1:]), *verb]
    dirs = HOST_NAME if spec.host else NAME
    if config is not None:
        argv += ["--config", exec_word(config, specifiers=True)]
    if spec.workspace is not None:
        argv += ["--workspace", exec_word(spec.workspace, specifiers=True)]
    sized = "the defaults" if spec.config is None or "%" in spec.config else spec.config

    name = unit_name(spec.template, bool(spec.host))
    lines += [f"# {name}: generated by `orchestra-sup systemd-unit`.", ""]
    lines.append("[Unit]")
    what = " %i" if spec.template else ""
    if spec.host:
        directive("Shown by systemctl status.", "Description=orchestra-sup host agent")
        directive(
            "The agent joins its root over tcp and registers in etcd: start once the network "
            "is configured, not merely up.",
            "After=network-online.target",
        )
        directive("Ask for the network to be configured at boot.", "Wants=network-online.target")
    else:
        directive("Shown by systemctl status.", f"Description=orchestra-sup supervision tree{what}")
        directive(
            "Lanes and a ctl --ctl-tcp endpoint may use the network: start after it is up.",
            "After=network.target",
        )
    lines += ["", "[Service]"]
    reloading = "" if spec.host else "RELOADING=1, "
    directive(
        "The supervisor says READY=1 once every child has completed its handshake, STATUS= "
        f"lines, {reloading}STOPPING=1 and WATCHDOG=1.",
        "Type=notify",
    )
    directive(
        "Only the supervisor speaks for the unit; children inherit NOTIFY_SOCKET but are ignored.",
        "NotifyAccess=main",
    )
    directive(
        "This installation's orchestra-sup; state and run directories come from "
        "$STATE_DIRECTORY and $RUNTIME_DIRECTORY.",
        "ExecStart=" + " ".join(argv),
    )
    if spec.host:
        lines.append(
            "# No ExecReload=: a host's agent re-reads nothing; restart it to change its options."
        )
    else:
        directive(
            "SIGHUP reloads the config: changed children are restarted, the others keep their "
            "pids.",
            "ExecReload=/bin/kill -HUP $MAINPID",
        )
    directive(
        "The supervisor exits non-zero when its restart intensity is exceeded (status 3) or "
        "the tree cannot start (1): start it afresh.",
        "Restart=on-failure",
    )
    directive(
        f"Exit status {EXIT_BAD_CONFIG} is bad input (config, workspace; a host's key or name "
        "its root refused): a restart cannot fix it.",
        f"RestartPreventExitStatus={EXIT_BAD_CONFIG}",
    )
    directive(
        "Pings come from the supervisor's own event loop every half of this: a wedged loop gets "
        f"the unit killed and restarted (twice [supervisor] watchdog_s, at least "
        f"{WATCHDOG_FLOOR_S:g} s).",
        f"WatchdogSec={watchdog_sec(spec.settings)}",
    )
    directive(
        "SIGTERM to the supervisor alone (it stops its children in reverse order, each with its "
        "grace); SIGKILL to whatever is left in the unit's cgroup afterwards.",
        "KillMode=mixed",
    )
    stopped = "each shard" if spec.host else "the stop announcement, each shard and a retiring one"
    others = "" if spec.host else " coordinator and custodian,"
    directive(
        f"Above the longest stop: {stopped} (shutdown_timeout_s + margin),{others} the lanes' "
        f"cgroups, slack; sized from {sized}.",
        f"TimeoutStopSec={stop_budget_s(spec.settings)}",
    )
    verb = "host" if spec.host else "start"
    directive(
        f"The durable state (LMDB, sandboxes, keys): $STATE_DIRECTORY, which {verb} uses.",
        f"StateDirectory={dirs}{instance}",
    )
    directive("Private to the tree's user.", "StateDirectoryMode=0700")
    directive(
        f"Sockets and the run lock: $RUNTIME_DIRECTORY, which {verb} uses; removed at stop.",
        f"RuntimeDirectory={dirs}{instance}",
    )
    directive("ctl's socket is guarded by this directory's mode.", "RuntimeDirectoryMode=0700")
    directive(
        "Per-lane cgroups are made below the unit's own cgroup (system/cgroups.py), so lanes "
        "are accounted to the unit and killed with it.",
        "Delegate=yes",
    )
    directive(
        "No setuid gains for anything the tree runs (bubblewrap needs none as root or with "
        "user namespaces).",
        "NoNewPrivileges=yes",
    )
    lines += _cpu_policy(spec)
    directive("Lanes cannot make setuid or setgid files.", "RestrictSUIDSGID=yes")
    directive("No execution-domain changes (personality(2)).", "LockPersonality=yes")
    if not spec.user:
        lines += _system_sandbox(spec)
    else:
        lines.append(
            "# No ProtectSystem=, ProtectHome=, PrivateTmp=, ProtectHostname=, "
            "ProtectKernelModules=: a user manager makes namespaces only with PrivateUsers=, "
            "which breaks bubblewrap. No LimitNOFILE=: it may not raise its hard limit."
        )
    lines.append(
        "# Not set, on purpose: RestrictNamespaces=, PrivateUsers=, SystemCallFilter= (bubblewrap "
        "needs unshare and mount); PrivateDevices=, ProtectClock=, DeviceAllow= (a device "
        "policy would hide GPUs from lanes); ProtectKernelTunables=, ProtectKernelLogs=, "
        "ProtectProc= (mounts over /proc stop a sandbox mounting its own); "
        "ProtectControlGroups= (Delegate= needs a writable cgroup tree); "
        "MemoryDenyWriteExecute= (JIT runtimes in lanes)."
    )
    lines += ["", "[Install]"]
    target = "default.target" if spec.user else "multi-user.target"
    directive(f"systemctl enable starts it with {target}.", f"WantedBy={target}")
    return "\n".join(lines) + "\n"


def _system_sandbox(spec: UnitSpec) -> list[str]:
    """The mount-namespace hardening of a system unit, as comment and directive lines."""
    lines: list[str] = []

    def add(reason: str, line: str) -> None:
        lines.extend((f"# {reason}", line))

    add(
        "ZeroMQ sockets and pidfds: a few per child and lane; systemd's default soft limit "
        "(1024) is low for a large tree.",
        "LimitNOFILE=65536",
    )
    add("No kernel module loading.", "ProtectKernelModules=yes")
    add(
        "Lanes cannot change the host name (the unit gets its own UTS namespace).",
        "ProtectHostname=yes",
    )
    below = ", and so does the workspace below" if spec.workspace is not None else ""
    add(
        f"The OS read-only; the state and run directories stay writable{below}.",
        "ProtectSystem=strict",
    )
    if spec.workspace is not None:
        add(
            "The custodian commits to the workspace ('-': a missing one is start's own "
            "one-line error, not a namespace failure).",
            "ReadWritePaths=" + path_word(spec.workspace, specifiers=True, prefix="-"),
        )
    add(
        "Homes read-only, not hidden: an installation or a config may live in one (a "
        "workspace there is writable through ReadWritePaths=).",
        "ProtectHome=read-only",
    )
    hidden = _private_tmp_hides(spec)
    if hidden:
        lines.append(
            "# No PrivateTmp=: the unit needs "
            + ", ".join(hidden)
            + ", which a private /tmp would hide."
        )
    else:
        add("The tree's temporary files are its own, removed at stop.", "PrivateTmp=yes")
    return lines


def _cpu_policy(spec: UnitSpec) -> list[str]:
    """The directives of `[cpu]` (`system.cpupolicy`): with real time off, lanes and tree alike
    are kept out of it (`RestrictRealtime=`); with it on, the limits that let the tree take it."""
    cpu = spec.settings.cpu
    if cpu.realtime == "off":
        return [
            "# Nothing in the unit can claim real-time scheduling and starve the tree "
            "([cpu] realtime is off).",
            "RestrictRealtime=yes",
        ]
    lines = [
        f"# [cpu] realtime = {cpu.realtime}: the supervisor takes SCHED_FIFO {cpu.rt_priority} "
        "itself once started, its control plane one below (system/cpupolicy.py). Not "
        "CPUSchedulingPolicy=: the interpreter's start-up would run in real time, under "
        "RLIMIT_RTTIME. Not RestrictRealtime=: it forbids the tree's own class; lanes get "
        "RLIMIT_RTPRIO 0 instead.",
    ]
    if spec.user:
        lines.append(
            "# No LimitRTPRIO=: a user manager cannot raise it; grant the user a hard "
            "RLIMIT_RTPRIO (limits.conf) or realtime = auto runs without real time."
        )
    else:
        lines += [
            f"# Real time up to the real-time guard's priority ({cpu.rt_priority + 1}, one above "
            "the tree) without CAP_SYS_NICE, should User= be set.",
            f"LimitRTPRIO={cpu.rt_priority + 1}",
        ]
    soft = round(cpu.rttime_s * 1e6)
    hard = soft + round(RTTIME_HARD_MARGIN_S * 1e6)
    lines += [
        f"# The runaway guard beside the watchdog: a real-time thread that runs {cpu.rttime_s:g} s "
        f"without blocking gets SIGXCPU, SIGKILL {RTTIME_HARD_MARGIN_S:g} s later ([cpu] "
        "rttime_s; the supervisor sets the same).",
        f"LimitRTTIME={soft}:{hard}",
    ]
    if cpu.reserved_cpus:
        lines += [
            "# [cpu] reserved_cpus: the supervisor starts on the control plane's CPUs; shards, and "
            "the lanes they start, widen back to the unit's cpuset (AllowedCPUs=).",
            f"CPUAffinity={format_cpus(parse_cpus(cpu.reserved_cpus)).replace(',', ' ')}",
        ]
    return lines
