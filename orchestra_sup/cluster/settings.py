"""`[cluster]`: where the root listens for hosts (ADR 0022), the etcd cluster a tree of more than
one machine keeps its membership in, and the lease its hosts hold (ADR 0021). A tree whose
`etcd` is empty and that has no `listen` (the defaults) is one host and needs neither.

```toml
[cluster]
listen = "tcp://10.0.0.2:7450"                   # hosts' agents join here, with CURVE only
coordinator_listen = "tcp://10.0.0.2:7451"       # hosts' shards reach the coordinator here
custodian_listen = "tcp://10.0.0.2:7452"         #   and their mirrors the custodian (defaults:
                                                 #   listen's port + 1 and + 2)
keys = "/var/lib/orchestra-sup/keys"             # what it serves and admits (default STATE/keys)
etcd = ["https://10.0.0.5:2379", "https://10.0.0.6:2379", "https://10.0.0.7:2379"]
etcd_ca = "/etc/orchestra-sup/etcd-ca.pem"       # the CA that signed the members' certificates
etcd_cert = "/etc/orchestra-sup/etcd-client.pem" # a client certificate, where etcd asks for one
etcd_key = "/etc/orchestra-sup/etcd-client.key"  #   (--client-cert-auth), and its key
etcd_user = "orchestra"                          # etcd's own users (`etcdctl auth enable`),
etcd_password_file = "/etc/orchestra-sup/etcd-password"  # the password alone in a file
prefix = "/orchestra-sup/"                       # where this tree's keys live in etcd
lease_ttl_s = 10                                 # a host's lease, whole seconds
keepalive_s = 1.0                                # seconds between two keep-alives
```

A host's agent (`orchestra-sup host --config FILE`) takes only what it needs to reach etcd
itself (`HOST_KEYS`): its own credentials, and `etcd` when it reaches the members at other
addresses than the root does (default: the ones the root's welcome names). The rest is the
root's to say (`check_host_cluster`).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from orchestra_sup.errors import ConfigError

if TYPE_CHECKING:  # aiohttp is imported by the processes that talk to etcd, not by every one
    from orchestra_sup.cluster.etcd import Etcd

PREFIX = "/orchestra-sup/"
TTL_S = 10
"""A host's lease by default, in seconds (etcd counts leases in whole seconds)."""
KEEPALIVE_S = 1.0
"""Seconds between two keep-alives of a host's lease by default."""
FILES = ("etcd_ca", "etcd_cert", "etcd_key", "etcd_password_file")
DATA = ("coordinator_listen", "custodian_listen")
"""The data ports on the root's side (ADR 0021, step 3): the coordinator's and the custodian's
own CURVE ROUTERs, where hosts' keys only are admitted. Defaults: `listen`'s port + 1 and + 2."""
HOST_KEYS = ("etcd", *FILES, "etcd_user")
"""What a host's agent's own `[cluster]` may give: how it reaches etcd, with its own user."""
KEYS = (
    "listen",
    *DATA,
    "keys",
    "etcd",
    *FILES,
    "etcd_user",
    "prefix",
    "lease_ttl_s",
    "keepalive_s",
)


class ClusterSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`[cluster]` (module docstring). Paths are as given (absolute or relative to where the
    tree starts); `lease_ttl_s` in whole seconds, `keepalive_s` in seconds. `keys` None is
    `<state_dir>/keys` (`protocol.keys.default_keys_dir`). `coordinator_listen` and
    `custodian_listen` are set (given, or derived from `listen`) exactly when `listen` is."""

    listen: str | None = None
    coordinator_listen: str | None = None
    custodian_listen: str | None = None
    keys: str | None = None
    etcd: tuple[str, ...] = ()
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password_file: str | None = None
    prefix: str = PREFIX
    lease_ttl_s: int = TTL_S
    keepalive_s: float = KEEPALIVE_S


def cluster_section(body: dict[str, Any]) -> ClusterSettings:
    """`[cluster]` checked: URLs, files that exist, options that need each other, and a lease
    long enough to be kept alive. Raises `ConfigError` naming the key."""
    for key in body:
        if key not in KEYS:
            raise ConfigError(f"[cluster] unknown key {key!r} (known: {', '.join(KEYS)})")
    out: dict[str, Any] = {}
    endpoints = body.get("etcd", [])
    if not isinstance(endpoints, list) or not all(isinstance(u, str) for u in endpoints):
        raise ConfigError(f"[cluster] etcd = {endpoints!r}: expected an array of URLs")
    for url in endpoints:
        if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
            raise ConfigError(f"[cluster] etcd: {url!r} is not an http:// or https:// URL")
    out["etcd"] = tuple(dict.fromkeys(endpoints))
    for key in ("listen", *DATA, "keys", *FILES, "etcd_user", "prefix"):
        if key in body:
            if not isinstance(body[key], str) or not body[key]:
                raise ConfigError(f"[cluster] {key} = {body[key]!r}: expected a non-empty string")
            out[key] = body[key]
    for key in FILES:
        if key in out and not Path(out[key]).is_file():
            raise ConfigError(f"[cluster] {key} = {out[key]!r}: no such file")
    listen = out.get("listen")
    if listen is not None and not is_tcp_address(listen):
        raise ConfigError(f"[cluster] listen = {listen!r}: give a tcp://HOST:PORT address")
    for key, offset in zip(DATA, (1, 2), strict=True):
        if key in out and listen is None:
            raise ConfigError(f"[cluster] {key} needs listen: hosts reach it once they joined")
        if listen is not None:
            out[key] = out.get(key) or next_port(listen, offset, key)
            if not is_tcp_address(out[key]):
                raise ConfigError(f"[cluster] {key} = {out[key]!r}: give a tcp://HOST:PORT address")
    taken = [out[k] for k in ("listen", *DATA) if k in out]
    if len(set(taken)) != len(taken):
        raise ConfigError(f"[cluster] listen and {' and '.join(DATA)} must be three addresses")
    if listen is not None and not out["etcd"]:
        raise ConfigError(
            "[cluster] listen needs etcd: hosts' membership and their lanes' fencing are kept "
            "in etcd (ADR 0021)"
        )
    if ("etcd_cert" in out) != ("etcd_key" in out):
        raise ConfigError("[cluster] etcd_cert and etcd_key go together: give both or neither")
    if ("etcd_user" in out) != ("etcd_password_file" in out):
        raise ConfigError(
            "[cluster] etcd_user and etcd_password_file go together: give both or neither"
        )
    prefix = out.get("prefix", PREFIX)
    if not prefix.startswith("/") or not prefix.endswith("/"):
        raise ConfigError(f"[cluster] prefix = {prefix!r}: must begin and end with /")
    ttl = body.get("lease_ttl_s", TTL_S)
    every = body.get("keepalive_s", KEEPALIVE_S)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 2 <= ttl <= 3600:
        raise ConfigError(f"[cluster] lease_ttl_s = {ttl!r}: expected whole seconds, 2 to 3600")
    if isinstance(every, bool) or not isinstance(every, int | float) or not 0.05 <= every <= 60:
        raise ConfigError(f"[cluster] keepalive_s = {every!r}: expected seconds, 0.05 to 60")
    if ttl <= 2 * every:
        raise ConfigError(
            f"[cluster] lease_ttl_s = {ttl} must be more than twice keepalive_s = {every:g}: a "
            "host stops its lanes one keep-alive before its lease ends, and needs one to renew it"
        )
    out["lease_ttl_s"], out["keepalive_s"] = ttl, float(every)
    return ClusterSettings(**out)


def is_tcp_address(address: str) -> bool:
    """True for `tcp://HOST:PORT`, the port a number 1..65535."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    digits = port.isascii() and port.isdigit()
    return address.startswith("tcp://") and bool(host) and digits and 0 < int(port) < 65536


def next_port(address: str, offset: int, key: str) -> str:
    """`tcp://HOST:PORT` with PORT + `offset`; raises `ConfigError` naming `key` past 65535."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if int(port) + offset > 65535:
        raise ConfigError(f"[cluster] {key}: listen's port + {offset} is past 65535; give it")
    return f"tcp://{host}:{int(port) + offset}"


def check_host_cluster(settings: ClusterSettings) -> None:
    """`[cluster]` as a host's agent's config gives it: only `HOST_KEYS`, and credentials that
    can be read now (`credentials`). Raises `ConfigError` naming the first key that is the
    root's to say, or the file that cannot be read."""
    defaults = ClusterSettings()
    for key in KEYS:
        if key not in HOST_KEYS and getattr(settings, key) != getattr(defaults, key):
            raise ConfigError(
                f"[cluster] {key} is the root's to say (its welcome does); a host's config "
                f"gives only {', '.join(HOST_KEYS)}"
            )
    credentials(settings)


def connect(settings: ClusterSettings, *, timeout_s: float | None = None) -> Etcd:
    """An `Etcd` client of `settings`' cluster (use with `async with`), with its `credentials`.
    Raises `ConfigError` when `etcd` is empty or a file cannot be read as what it should be."""
    from orchestra_sup.cluster.etcd import Etcd

    if not settings.etcd:
        raise ConfigError("[cluster] etcd is empty: this tree is one host and uses no etcd")
    context, password = credentials(settings)
    extra = {} if timeout_s is None else {"timeout_s": timeout_s}
    return Etcd(settings.etcd, ssl=context, user=settings.etcd_user, password=password, **extra)


def credentials(settings: ClusterSettings) -> tuple[ssl.SSLContext | None, str | None]:
    """The TLS context made from `etcd_ca`, `etcd_cert` and `etcd_key` (None: plain http), and
    the password read from `etcd_password_file` (its first line; None: no user). Raises
    `ConfigError` when a file cannot be read as what it should be."""
    context = None
    if settings.etcd_ca is not None or settings.etcd_cert is not None:
        try:
            context = ssl.create_default_context(cafile=settings.etcd_ca)
            if settings.etcd_cert is not None:
                context.load_cert_chain(settings.etcd_cert, settings.etcd_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[cluster] TLS files: {exc}") from None
    password = None
    if settings.etcd_password_file is not None:
        try:
            text = Path(settings.etcd_password_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"[cluster] etcd_password_file: {exc}") from None
        password = text.splitlines()[0] if text else ""
        if not password:
            raise ConfigError(
                f"[cluster] etcd_password_file = {settings.etcd_password_file!r}: its first line "
                "is empty (it holds the password alone)"
            )
    return context, password
