"""Configuration: the tree's settings and where its files live.

Settings come from an optional TOML file, then CLI flags override them. Every value is validated
once, here; an unknown key or a bad value raises `ConfigError` naming the key and the value.

```toml
[supervisor]
max_restarts = 5          # restarts allowed within max_seconds before escalation
max_seconds = 30.0        # the intensity window, seconds (monotonic clock)
shutdown_timeout_s = 5.0  # SIGTERM -> SIGKILL grace for each child, seconds
watchdog_s = 10.0         # a child silent (no heartbeat) this long is killed and restarted
backoff_initial_s = 0.1   # delay before a repeated restart, doubling ...
backoff_max_s = 5.0       # ... up to this cap
spawn = "fork"            # children fork from a pre-imported template, or "exec" a fresh
                          # interpreter each (docs/adr/0005-fork-template.md)
drain_timeout_s = 30.0    # `ctl rollover`: how long a shard's lanes have to reach a quiet point
                          # (then they are stopped and re-run on the new generation, flagged
                          # partial), and the coordinator or custodian to reach one
probe_timeout_s = 30.0    # `ctl rollover`: how long a release has to answer its probe (then it,
                          # and everything it started, is killed, and the release refused)
metrics_port = 9464       # serve Prometheus metrics on this port (0: any free one; default:
                          # not served); `start --metrics-port` replaces it
metrics_host = "127.0.0.1"  # ... on this address (`start --metrics-host`)
ctl_connections = 32      # ctl clients served at once on ctl.ipc; one more is answered busy

[shards]
count = 2                 # worker-host shards
lanes_per_shard = 8       # lanes one shard hosts at most
capabilities = ["python"] # what every shard offers a task's `requires` (default: nothing)
tenants = []              # tenants every shard serves (default, empty: every tenant)

[shards.shard-1]          # one shard's own capabilities and tenants, replacing the above
capabilities = ["python", "gpu"]
tenants = ["acme"]

[relay]
deadline_s = 55.0         # every relayed tool call's deadline, seconds (the seed's relay bound)

[lanes]
max_worker_loss = 3       # a task whose worker process (shard) is lost this many times fails;
                          # before that, each loss pauses it and it is re-placed
nice = 10                 # niceness added to every lane's command (0..19): lanes yield the CPU to
                          # the tree's own processes, so a busy lane cannot slow the coordinator
programs = []             # lane programs ("module:Class") plans may name besides "shell"; each
                          # runs as Python inside its shard, so list only code you trust

[coordinator]
programs = []             # coordinator programs ("module:Class") plans may name besides the
                          # built-ins (dag, fanout, refine, bisect); each runs as Python inside
                          # the coordinator process, importable from the tree's PYTHONPATH

[quotas.acme]             # ceilings for plans with tenant = "acme", checked before a lane is
                          # placed; a breach starts nothing and fails the task with quota_breach
                          # (on_failure = "retry" waits it out). Each key is optional.
concurrency = 4           # lanes live at once
rate = 100                # lanes started per window
wall_s = 3600.0           # wall seconds spent by lanes that ended within the window
cpu_s = 1800.0            # CPU seconds spent by lanes that ended within the window
window_s = 3600.0         # the rolling window, seconds (default one hour)

[isolation]               # how lanes' commands are confined (system/isolation.py)
mode = "auto"             # "auto": bubblewrap where it works here, else "none"; "bwrap": refuse
                          # to start without it; "none": process group, rlimits, cgroups only
max_memory_bytes = 4294967296  # address space per process, resident memory per lane (cgroup v1)
max_open_files = 4096     # descriptors per process
max_file_bytes = 4294967296    # largest file written; size of each private tmpfs under bwrap
max_processes = 1024      # tasks per lane (cgroup v1 pids controller, where there is one)
lane_user = "auto"        # a tree run as root: "auto" runs each lane as its sandbox's own uid
                          # where it can, "dynamic" always, "tree" never (laneuser.py)

[cpu]                     # the CPU policy by role (system/cpupolicy.py; README, "CPU policy")
realtime = "off"          # "auto": the control plane in SCHED_FIFO where allowed; "on": refuse
                          # to start where it is not; "off": SCHED_OTHER, as before
rt_priority = 5           # the supervisor's SCHED_FIFO priority; coordinator, custodian one below
rttime_s = 1.0            # RLIMIT_RTTIME: CPU seconds a real-time thread may run without
                          # blocking before SIGXCPU (SIGKILL one second later)
reserved_cpus = ""        # CPUs the control plane is pinned to ("0", "0,2-3"); "": not pinned
lanes = "nice"            # "idle": lanes in a cpu.idle cgroup, else SCHED_IDLE; "nice": as before
busy_poll_s = 0.0002      # the custodian's front polls without sleeping this long after a frame
                          # (0..0.01; not in real time, nor on one CPU); 0: it sleeps at once

[retention]               # what a tree keeps of what ended (coordinator/retention.py)
plans_s = 2592000         # a finished plan's record, inbox entries and session: 30 days
keys_s = 7776000          # its idempotency key still answers a re-send: 90 days (>= plans_s)
sandboxes_s = 86400       # a finished lane's sandbox, removed a day after the lane ended
transcripts_s = 604800    # a finished lane's transcript (`ctl logs`): 7 days
events_s = 2592000        # an event of the event log (`ctl events`): 30 days
every_s = 60.0            # seconds between two prunes (`ctl prune`: now)

[http]                    # the HTTP API (web/api.py; README, "HTTP API")
listen = "127.0.0.1:8080" # serve it here (default "": not served); `start --http` replaces it
cert = ""                 # PEM certificate chain and key: TLS, and then any address; without
key = ""                  #   them, a loopback address only
max_connections = 256     # open connections at most; one more is answered 503 and closed
idle_s = 15.0             # seconds a connection may stay open without a whole request
request_s = 60.0          # seconds a request may take (an event stream: each write, idle_s)
releases = []             # interpreters a rollover over HTTP may name, beside the supervisor's

[state]                   # the state directory's disk (system/reserve.py)
min_free = "5%"           # below this free space (bytes, or a share "N%") new plans and lanes
                          # are refused; what was accepted runs on; space back: accepted again

[cluster]                 # a tree past one machine (cluster/settings.py has every key, ADR 0021)
etcd = []                 # etcd endpoints, "https://10.0.0.5:2379", ...; []: one host, no etcd
lease_ttl_s = 10          # a host's lease, whole seconds
keepalive_s = 1.0         # seconds between two keep-alives of a host's lease
```
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from orchestra_sup.cluster.settings import ClusterSettings, cluster_section
from orchestra_sup.configfile import bounded, read_toml, toml_value
from orchestra_sup.errors import ConfigError, did_you_mean
from orchestra_sup.protocol.childargs import Quota, RetentionSettings
from orchestra_sup.protocol.httplisten import HttpSettings, http_section, with_listen
from orchestra_sup.protocol.patterns import NAME_PATTERN, PROGRAM_PATTERN
from orchestra_sup.system.cpupolicy import (
    LANE_CLASSES,
    REALTIME,
    RT_PRIORITY_MAX,
    CpuSettings,
    check_realtime,
    check_reserved,
)
from orchestra_sup.system.isolation import MODES, IsolationSettings, resolve, resolve_lane_user
from orchestra_sup.system.laneuser import LANE_USERS
from orchestra_sup.system.reserve import DEFAULT_MIN_FREE, MinFree, parse_min_free

ISOLATION_ENV = "ORCHESTRA_SUP_ISOLATION"
"""Environment variable that replaces `[isolation] mode` ("auto", "bwrap", "none"), as `--shards`
replaces `[shards] count`: e.g. a test suite whose lanes write marker files outside their
sandboxes runs its trees with "none"."""

LANE_USER_ENV = "ORCHESTRA_SUP_LANE_USER"
"""Environment variable that replaces `[isolation] lane_user` ("auto", "dynamic", "tree"), as
`ISOLATION_ENV` replaces the mode: a test suite whose lanes write outside their sandboxes runs
its trees with "tree"."""


class SupervisorSettings(msgspec.Struct, frozen=True, kw_only=True):
    max_restarts: int = 5
    max_seconds: float = 30.0
    shutdown_timeout_s: float = 5.0
    watchdog_s: float = 10.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    spawn: Literal["fork", "exec"] = "fork"
    drain_timeout_s: float = 30.0
    probe_timeout_s: float = 30.0
    """Seconds a release has to answer its probe, and its start check, before `ctl rollover`
    refuses it (`release.probe`): a cold interpreter importing every module."""
    metrics_port: int | None = None
    """Where `start` serves Prometheus metrics (`supervisor.metrics`); 0: a free port; None:
    not served."""
    metrics_host: str = "127.0.0.1"
    """The address the metrics are served on (a name or an IPv4/IPv6 address)."""
    ctl_connections: int = 32
    """Ctl connections served at once on `ctl.ipc` (`protocol.connections`): a client that
    connects beyond them is answered `Error(busy)`. Each holds one descriptor of the
    supervisor's; `ctl plan --wait`, `ctl logs --follow` and `ctl top` hold theirs while they
    run."""


class ShardProfile(msgspec.Struct, frozen=True, kw_only=True):
    """What a `[shards.shard-N]` table says of one shard; None: as `[shards]` says for all."""

    capabilities: tuple[str, ...] | None = None
    tenants: tuple[str, ...] | None = None


class ShardSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`count` shards of `lanes_per_shard` lanes each. `capabilities` (names a task's `requires`
    may ask for) and `tenants` (whom a shard serves; empty: every tenant) apply to every shard,
    except where a shard's own table in `profiles` replaces them. Names match
    `coordinator.placement.NAME_PATTERN`."""

    count: int = 2
    lanes_per_shard: int = 8
    capabilities: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    profiles: dict[str, ShardProfile] = {}

    def offers(self, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(capabilities, tenants) of shard `name`."""
        own = self.profiles.get(name, ShardProfile())
        return (
            self.capabilities if own.capabilities is None else own.capabilities,
            self.tenants if own.tenants is None else own.tenants,
        )


class LaneSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`max_worker_loss`: losses of a task's worker process after which the task fails with the
    failure class `worker_process_loss` (1: the first loss fails it; no re-placement).
    `nice`: niceness added to every lane's command (0..19, default 10, as systemd's `Nice=`), so
    the CPU goes to the supervisor, the coordinator and the custodian first when lanes are busy
    (`bench isolation` measures what that buys). `programs`: the lane programs (`module:Class`,
    `shards.program`) a task may name besides `shell`; they run as Python inside the shard,
    outside any sandbox, so the default allows none."""

    max_worker_loss: int = 3
    nice: int = 10
    programs: tuple[str, ...] = ()


class RelaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """`deadline_s`: seconds a relayed tool call (`coordinator.toolkit`) waits for its answer
    before it fails as outcome-unknown (default 55 s, the relay bound of seeds/000)."""

    deadline_s: float = 55.0


class CoordinatorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`programs`: the coordinator programs (`module:Class`, `coordinator.context`) a plan may
    name besides the built-ins; each is Python run inside the coordinator process with the
    tree's rights, so the default allows none. Its module must be importable there (the tree's
    `PYTHONPATH`)."""

    programs: tuple[str, ...] = ()


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    supervisor: SupervisorSettings = SupervisorSettings()
    shards: ShardSettings = ShardSettings()
    lanes: LaneSettings = LaneSettings()
    relay: RelaySettings = RelaySettings()
    coordinator: CoordinatorSettings = CoordinatorSettings()
    quotas: dict[str, Quota] = {}
    """Tenant -> its ceilings (`[quotas.<tenant>]`, `coordinator.quota.Quota`)."""
    isolation: IsolationSettings = IsolationSettings()
    """`[isolation]`: how lanes' commands are confined (`system.isolation`)."""
    cpu: CpuSettings = CpuSettings()
    """`[cpu]`: the CPU policy by role (`system.cpupolicy`)."""
    retention: RetentionSettings = RetentionSettings()
    """`[retention]`: what the tree keeps of what ended (`coordinator.retention`)."""
    min_free: MinFree = MinFree()
    """`[state] min_free`: the state disk's reserve (`system.reserve`)."""
    http: HttpSettings = HttpSettings()
    """`[http]`: where the HTTP API is served (`protocol.httplisten`, `web.api`)."""
    cluster: ClusterSettings = ClusterSettings()
    """`[cluster]`: the etcd cluster of a tree past one machine (`cluster.settings`)."""


_LIMITS: dict[tuple[str, str], tuple[type, float, float]] = {
    ("supervisor", "max_restarts"): (int, 0, 10_000),
    ("supervisor", "max_seconds"): (float, 0.001, 86_400),
    ("supervisor", "shutdown_timeout_s"): (float, 0, 3_600),
    ("supervisor", "watchdog_s"): (float, 0.1, 3_600),
    ("supervisor", "backoff_initial_s"): (float, 0, 60),
    ("supervisor", "backoff_max_s"): (float, 0, 3_600),
    ("supervisor", "drain_timeout_s"): (float, 0.1, 3_600),
    ("supervisor", "probe_timeout_s"): (float, 0.1, 3_600),
    ("supervisor", "metrics_port"): (int, 0, 65_535),
    ("supervisor", "ctl_connections"): (int, 1, 100_000),
    ("shards", "count"): (int, 1, 256),
    ("shards", "lanes_per_shard"): (int, 1, 100_000),
    ("lanes", "max_worker_loss"): (int, 1, 100),
    ("lanes", "nice"): (int, 0, 19),
    ("relay", "deadline_s"): (float, 0.1, 3_600),
    ("quotas", "concurrency"): (int, 1, 1_000_000),
    ("quotas", "rate"): (int, 1, 1_000_000_000),
    ("quotas", "wall_s"): (float, 0.001, 1e12),
    ("quotas", "cpu_s"): (float, 0.001, 1e12),
    ("quotas", "window_s"): (float, 1, 366 * 86_400),
    ("isolation", "max_memory_bytes"): (int, 64 << 20, 1 << 50),
    ("isolation", "max_open_files"): (int, 64, 1 << 20),
    ("isolation", "max_file_bytes"): (int, 1 << 20, 1 << 50),
    ("isolation", "max_processes"): (int, 8, 1 << 22),
    ("cpu", "rt_priority"): (int, 2, RT_PRIORITY_MAX),
    ("cpu", "rttime_s"): (float, 0.05, 60),
    ("cpu", "busy_poll_s"): (float, 0, 0.01),
    ("retention", "plans_s"): (float, 0, 10 * 365 * 86_400),
    ("retention", "keys_s"): (float, 0, 10 * 365 * 86_400),
    ("retention", "sandboxes_s"): (float, 0, 10 * 365 * 86_400),
    ("retention", "transcripts_s"): (float, 0, 10 * 365 * 86_400),
    ("retention", "events_s"): (float, 0, 10 * 365 * 86_400),
    ("retention", "every_s"): (float, 0.1, 86_400),
}
_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("supervisor", "spawn"): ("fork", "exec"),
    ("isolation", "mode"): MODES,
    ("isolation", "lane_user"): LANE_USERS,
    ("cpu", "realtime"): REALTIME,
    ("cpu", "lanes"): LANE_CLASSES,
}
_SECTIONS = (
    "supervisor", "shards", "lanes", "relay", "coordinator", "quotas", "isolation", "cpu",
    "retention", "state", "http", "cluster",
)  # fmt: skip
_CHECKED_APART = {
    "supervisor": ("metrics_host",),
    "shards": ("capabilities", "tenants", "[shards.shard-N] tables"),
    "lanes": ("programs",),
    "coordinator": ("programs",),
    "cpu": ("reserved_cpus",),
    "state": ("min_free",),
    "http": ("listen", "cert", "key", "max_connections", "idle_s", "request_s", "releases"),
}
"""Keys each section accepts that `_check` does not see (their own checks run apart), so that
an unknown-key error still lists every key the section takes."""


_MOVED = {("lanes", "transcript_retention_s"): "[retention] transcripts_s"}
"""Keys an earlier release read, and where their setting is now."""


def _check(section: str, key: str, value: Any) -> Any:
    choices = _CHOICES.get((section, key))
    if choices is not None:
        if value not in choices:
            allowed = ", ".join(toml_value(c) for c in choices)
            shown = toml_value(value)
            near = did_you_mean(value, choices)
            raise ConfigError(f"[{section}] {key} = {shown}: expected one of {allowed}{near}")
        return value
    spec = _LIMITS.get((section, key))
    if spec is None:
        keys = [k for s, k in [*_LIMITS, *_CHOICES] if s == section]
        known = ", ".join([*keys, *_CHECKED_APART.get(section, ())])
        raise ConfigError(
            f"[{section}] unknown key {key!r}{_near_key(section, key)} (known: {known})"
        )
    kind, low, high = spec
    ok_type = isinstance(value, int | float) if kind is float else isinstance(value, int)
    shown = toml_value(value)
    if isinstance(value, bool) or not ok_type:
        expected = "a number" if kind is float else "an integer"
        raise ConfigError(f"[{section}] {key} = {shown}: expected {expected}")
    if not low <= value <= high:
        raise ConfigError(f"[{section}] {key} = {shown}: must be between {low:g} and {high:g}")
    return kind(value)


def _near_key(section: str, key: str) -> str:
    """What `key`, unknown in `[section]`, was likely meant to be: a key of that section it is
    close to (`suggest.did_you_mean`), else the section it belongs in, else ""."""
    moved = _MOVED.get((section, key))
    if moved is not None:
        return f": it moved to {moved}"
    keys = [k for s, k in [*_LIMITS, *_CHOICES] if s == section]
    keys += [k for k in _CHECKED_APART.get(section, ()) if not k.startswith("[")]
    near = did_you_mean(key, keys)
    if near:
        return near
    home = next((s for s, k in [*_LIMITS, *_CHOICES] if k == key and s != section), None)
    home = home or next((s for s, ks in _CHECKED_APART.items() if key in ks), None)
    if home == "quotas":
        home = "quotas.<tenant>"
    return f": it belongs in [{home}]" if home is not None else ""


def settings_from_mapping(data: dict[str, Any]) -> Settings:
    """Validate a parsed TOML mapping. Raises `ConfigError` naming the key and the value."""
    sections: dict[str, dict[str, Any]] = {}
    for section, body in data.items():
        if section not in _SECTIONS:
            known = ", ".join(f"[{name}]" for name in _SECTIONS)
            near = did_you_mean(section, _SECTIONS, lambda name: f"[{name}]")
            raise ConfigError(f"unknown section [{section}]{near} (known: {known})")
        if not isinstance(body, dict):
            raise ConfigError(f"[{section}] must be a table, got {toml_value(body)}")
        if section == "shards":
            sections[section] = _shards_section(body)
        elif section in ("cluster", "state", "http"):
            continue  # checked as a whole below (`cluster_section`, `_state_section`, ...)
        elif section == "quotas":
            sections[section] = _quotas_section(body)
        elif section == "supervisor" and "metrics_host" in body:
            rest = {k: v for k, v in body.items() if k != "metrics_host"}
            sections[section] = {k: _check(section, k, v) for k, v in rest.items()}
            sections[section]["metrics_host"] = metrics_host(body["metrics_host"])
        elif section == "cpu" and "reserved_cpus" in body:
            rest = {k: v for k, v in body.items() if k != "reserved_cpus"}
            sections[section] = {k: _check(section, k, v) for k, v in rest.items()}
            sections[section]["reserved_cpus"] = _reserved_cpus(body["reserved_cpus"])
        elif section in ("lanes", "coordinator") and "programs" in body:
            rest = {k: v for k, v in body.items() if k != "programs"}
            sections[section] = {k: _check(section, k, v) for k, v in rest.items()}
            sections[section]["programs"] = _programs(section, body["programs"])
        else:
            sections[section] = {k: _check(section, k, v) for k, v in body.items()}
    sup = SupervisorSettings(**sections.get("supervisor", {}))
    if sup.backoff_max_s < sup.backoff_initial_s:
        raise ConfigError(
            f"[supervisor] backoff_max_s = {sup.backoff_max_s!r}: "
            f"below backoff_initial_s = {sup.backoff_initial_s!r}"
        )
    shards = ShardSettings(**sections.get("shards", {}))
    for name in shards.profiles:
        if int(name.removeprefix("shard-")) >= shards.count:
            raise ConfigError(
                f"[shards.{name}]: there is no such shard "
                f"(count = {shards.count}: shard-0 .. shard-{shards.count - 1})"
            )
    retention = RetentionSettings(**sections.get("retention", {}))
    if retention.keys_s < retention.plans_s:
        raise ConfigError(
            f"[retention] keys_s = {retention.keys_s:g} is below plans_s = {retention.plans_s:g}"
            ": a plan's idempotency key must outlive the plan"
        )
    return Settings(
        supervisor=sup,
        shards=shards,
        lanes=LaneSettings(**sections.get("lanes", {})),
        relay=RelaySettings(**sections.get("relay", {})),
        coordinator=CoordinatorSettings(**sections.get("coordinator", {})),
        quotas=sections.get("quotas", {}),
        isolation=IsolationSettings(**sections.get("isolation", {})),
        cpu=CpuSettings(**sections.get("cpu", {})),
        retention=retention,
        min_free=_state_section(data.get("state", {})),
        http=http_section(data.get("http", {})),
        cluster=cluster_section(data.get("cluster", {})),
    )


def _state_section(body: dict[str, Any]) -> MinFree:
    """`[state]`: its one key, `min_free` (`system.reserve.parse_min_free`). Raises
    `ConfigError`."""
    unknown = sorted(set(body) - {"min_free"})
    if unknown:
        near = did_you_mean(unknown[0], ["min_free"])
        raise ConfigError(f"unknown key [state] {unknown[0]}{near} (known: min_free)")
    return parse_min_free(body.get("min_free", DEFAULT_MIN_FREE))


def _reserved_cpus(value: Any) -> str:
    """`[cpu] reserved_cpus`: a CPU list this process may run on (`cpupolicy.check_reserved`);
    raises `ConfigError`."""
    if not isinstance(value, str):
        raise ConfigError(f"[cpu] reserved_cpus = {toml_value(value)}: expected a CPU list")
    try:
        check_reserved(CpuSettings(reserved_cpus=value))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return value


def _quotas_section(body: dict[str, Any]) -> dict[str, Quota]:
    """`[quotas.<tenant>]` tables of ceilings; raises `ConfigError`."""
    out: dict[str, Quota] = {}
    for tenant, table in body.items():
        if not NAME_PATTERN.fullmatch(tenant):
            raise ConfigError(
                f"[quotas.{tenant}]: not a tenant name (must match {NAME_PATTERN.pattern})"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"[quotas] {tenant} = {toml_value(table)}: expected a table")
        if not table:
            raise ConfigError(f"[quotas.{tenant}] is empty: give at least one ceiling")
        try:
            out[tenant] = Quota(**{k: _check("quotas", k, v) for k, v in table.items()})
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("[quotas]", f"[quotas.{tenant}]", 1)) from None
    return out


_NAME_LISTS = ("capabilities", "tenants")
_SHARD_TABLE = re.compile(r"shard-(0|[1-9][0-9]{0,2})")


def _shards_section(body: dict[str, Any]) -> dict[str, Any]:
    """`[shards]`: numbers, the two name lists, and `[shards.shard-N]` tables of name lists."""
    out: dict[str, Any] = {}
    profiles: dict[str, ShardProfile] = {}
    for key, value in body.items():
        if key in _NAME_LISTS:
            out[key] = _names(f"[shards] {key}", value)
        elif isinstance(value, dict) and _SHARD_TABLE.fullmatch(key):
            for inner in value:
                if inner not in _NAME_LISTS:
                    raise ConfigError(
                        f"[shards.{key}] unknown key {inner!r}{did_you_mean(inner, _NAME_LISTS)} "
                        f"(known: {', '.join(_NAME_LISTS)})"
                    )
            profiles[key] = ShardProfile(
                **{k: _names(f"[shards.{key}] {k}", v) for k, v in value.items()}
            )
        elif isinstance(value, dict):
            raise ConfigError(f"[shards.{key}]: not a shard name (shard-0, shard-1, ...)")
        else:
            out[key] = _check("shards", key, value)
    if profiles:
        out["profiles"] = profiles
    return out


def metrics_host(value: Any, where: str = "[supervisor] metrics_host =") -> str:
    """`[supervisor] metrics_host` (or `--metrics-host`, with `where` naming it), checked for
    shape: a non-empty string with no whitespace; whether it resolves is found when the port is
    bound. Raises `ConfigError`."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ConfigError(f"{where} {toml_value(value)}: expected a host name or address")
    return value


def _programs(section: str, value: Any) -> tuple[str, ...]:
    """`[lanes] programs` or `[coordinator] programs`: an array of `module:Class` names; raises
    `ConfigError`."""
    if not isinstance(value, list):
        raise ConfigError(f"[{section}] programs = {toml_value(value)}: expected an array of names")
    for name in value:
        if not isinstance(name, str) or not PROGRAM_PATTERN.fullmatch(name) or name == "shell":
            raise ConfigError(
                f"[{section}] programs: {toml_value(name)} is not a 'module:Class' name"
            )
    return tuple(dict.fromkeys(value))


def _names(where: str, value: Any) -> tuple[str, ...]:
    """A TOML array of capability or tenant names, checked; raises `ConfigError`."""
    if not isinstance(value, list):
        raise ConfigError(f"{where} = {toml_value(value)}: expected an array of names")
    for name in value:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ConfigError(
                f"{where}: {toml_value(name)} is not a name (must match {NAME_PATTERN.pattern})"
            )
    return tuple(dict.fromkeys(value))


def load_settings(
    path: Path | None, *, shards: int | None = None, lanes_per_shard: int | None = None
) -> Settings:
    """Read `path` (None: defaults) and apply CLI overrides, `$ORCHESTRA_SUP_ISOLATION`
    (`ISOLATION_ENV`, replacing `[isolation] mode`) and `$ORCHESTRA_SUP_LANE_USER`
    (`LANE_USER_ENV`, replacing `lane_user`), then check that this machine can give the
    isolation asked for (`system.isolation.resolve`: `mode = "bwrap"` where bubblewrap does not
    work is refused here, before anything starts; so is `lane_user = "dynamic"` where lanes
    cannot run as uids of their own: `resolve_lane_user`; and `[cpu] realtime = "on"` where this
    process may not take SCHED_FIFO: `cpupolicy.check_realtime`). Raises `ConfigError`."""
    data = read_toml(path) if path is not None else {}
    try:
        for env, key in ((ISOLATION_ENV, "mode"), (LANE_USER_ENV, "lane_user")):
            value = os.environ.get(env)
            if value is not None:
                table = data.setdefault("isolation", {})
                if not isinstance(table, dict):
                    raise ConfigError(f"[isolation] must be a table, got {toml_value(table)}")
                table[key] = value
        overrides = {"count": shards, "lanes_per_shard": lanes_per_shard}
        for key, value in overrides.items():
            if value is not None:
                shards_table = data.setdefault("shards", {})
                if not isinstance(shards_table, dict):
                    raise ConfigError(f"[shards] must be a table, got {toml_value(shards_table)}")
                shards_table[key] = value
        settings = settings_from_mapping(data)
        resolve_lane_user(settings.isolation.lane_user, resolve(settings.isolation.mode))
        try:
            check_realtime(settings.cpu)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return settings
    except ConfigError as exc:
        where = f"config {path}: " if path else ""
        raise ConfigError(bounded(f"{where}{exc}")) from exc


def with_metrics(settings: Settings, port: int | None, host: str | None) -> Settings:
    """`settings` with `--metrics-port`/`--metrics-host` in place of the config's. Raises
    `ConfigError` for a malformed host, or a host given with no port anywhere."""
    sup = settings.supervisor
    if host is not None:
        sup = msgspec.structs.replace(sup, metrics_host=metrics_host(host, "--metrics-host"))
    if port is not None:
        sup = msgspec.structs.replace(sup, metrics_port=port)
    if host is not None and sup.metrics_port is None:
        raise ConfigError("--metrics-host needs --metrics-port (or [supervisor] metrics_port)")
    return msgspec.structs.replace(settings, supervisor=sup)


def with_http(settings: Settings, listen: str | None) -> Settings:
    """`settings` with `start --http` in place of `[http] listen` (None: not given). Raises
    `ConfigError` as `httplisten.http_listen`."""
    if listen is None:
        return settings
    return msgspec.structs.replace(settings, http=with_listen(settings.http, listen))
