"""`[http]`: where and how the supervisor serves its HTTP API (`web.api`, `start --http`)."""

from __future__ import annotations

import ipaddress
from typing import Any

import msgspec

from orchestra_sup.errors import ConfigError


class HttpSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`[http]`, every key bound once when the tree starts (a reload that changes one is
    refused: `supervisor.reload.IMMUTABLE`).

    - `listen`: "HOST:PORT" the API is served on ("": not served, the default). Port 0 takes
      any free one (`ctl status` shows the URL; a re-exec takes a free one again).
    - `cert`, `key`: paths of a PEM certificate chain and its private key ("": none, the
      default). With both, the API is served over TLS, and then from any address; without,
      from a loopback address only: a bearer token must not cross a network in the clear.
    - `max_connections`: open connections at most (default 256); one more is answered 503
      and closed at once, so silent connections cannot use up the supervisor's descriptors.
    - `idle_s`: seconds a connection may stay open without a whole request (default 15.0).
    - `request_s`: seconds a request may take, its body and the tree's answer included
      (default 60.0); an event stream is bounded instead by each write (`idle_s`).
    - `releases`: interpreter paths a rollover asked over HTTP may name, beside the
      supervisor's own (default none): `ctl rollover --release` runs a program as the
      supervisor's user, which a token alone must not choose.
    """

    listen: str = ""
    cert: str = ""
    key: str = ""
    max_connections: int = 256
    idle_s: float = 15.0
    request_s: float = 60.0
    releases: tuple[str, ...] = ()

    @property
    def tls(self) -> bool:
        return bool(self.cert and self.key)


_KEYS = ("listen", "cert", "key", "max_connections", "idle_s", "request_s", "releases")


def http_section(body: dict[str, Any]) -> HttpSettings:
    """`[http]` checked. Raises `ConfigError` naming the key: an unknown key, a value of the
    wrong type or range, a cert without a key (or a key without a cert), and a `listen` that
    `http_listen` refuses."""
    unknown = sorted(set(body) - set(_KEYS))
    if unknown:
        raise ConfigError(f"unknown key [http] {unknown[0]} (known: {', '.join(_KEYS)})")
    try:
        settings = msgspec.convert(body, HttpSettings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"[http]: {exc}") from None
    if bool(settings.cert) != bool(settings.key):
        raise ConfigError("[http] cert and key: TLS needs both (the certificate and its key)")
    if not 1 <= settings.max_connections <= 65_536:
        raise ConfigError(f"[http] max_connections = {settings.max_connections}: 1..65536")
    for name in ("idle_s", "request_s"):
        value = getattr(settings, name)
        if not 0.1 <= value <= 3600:
            raise ConfigError(f"[http] {name} = {value}: expected 0.1..3600 seconds")
    relative = [path for path in settings.releases if not path.startswith("/")]
    if relative:
        raise ConfigError(
            f"[http] releases: {relative[0]!r} is not an absolute path (a rollover over HTTP "
            "must not run what the supervisor's working directory happens to hold)"
        )
    http_listen(settings.listen, "[http] listen =", tls=settings.tls)
    return settings


def with_listen(settings: HttpSettings, listen: str) -> HttpSettings:
    """`settings` with `start --http LISTEN` in place of `[http] listen`. Raises
    `ConfigError` as `http_listen`."""
    return msgspec.structs.replace(settings, listen=http_listen(listen, "--http", settings.tls))


def http_listen(value: object, where: str = "[http] listen =", tls: bool = False) -> str:
    """`[http] listen` (or `start --http`, `where` naming it) checked: "" or "HOST:PORT" with
    a port 0..65535, and a loopback host (127.0.0.0/8, ::1 in brackets, or localhost) unless
    `tls`. Raises `ConfigError`."""
    if value == "":
        return ""
    if not isinstance(value, str):
        raise ConfigError(f'{where} {value!r}: expected "HOST:PORT"')
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65_535 or not host:
        raise ConfigError(f'{where} {value!r}: expected "HOST:PORT", such as 127.0.0.1:8080')
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        loopback = bare == "localhost" or ipaddress.ip_address(bare).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not tls:
        raise ConfigError(
            f"{where} {value!r}: only a loopback address (127.0.0.1, [::1], localhost) can be "
            "served without TLS; set [http] cert and key to serve it beyond this machine"
        )
    return value


def host_port(listen: str) -> tuple[str, int]:
    """("host", port) of a checked `listen`, brackets off an IPv6 host."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
