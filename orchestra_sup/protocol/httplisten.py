"""`[http]`: where the supervisor serves its HTTP API (`web.api`, `start --http`)."""

from __future__ import annotations

import ipaddress

import msgspec

from orchestra_sup.errors import ConfigError


class HttpSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`listen`: "HOST:PORT" the API is served on ("": not served, the default). Port 0 takes
    any free one (`ctl status` shows the URL)."""

    listen: str = ""


def http_listen(value: object, where: str = "[http] listen =") -> str:
    """`[http] listen` (or `start --http`, `where` naming it) checked: "" or "HOST:PORT" with
    a port 0..65535 and a loopback host (127.0.0.0/8, ::1 in brackets, or localhost). Raises
    `ConfigError`; for any other host, that serving beyond this machine needs TLS, which is
    not built yet: a bearer token must not cross a network in the clear."""
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
    if not loopback:
        raise ConfigError(
            f"{where} {value!r}: only a loopback address (127.0.0.1, [::1], localhost) can be "
            "served without TLS, and TLS is not built yet"
        )
    return value


def host_port(listen: str) -> tuple[str, int]:
    """("host", port) of a checked `listen`, brackets off an IPv6 host."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
