"""`[http] listen` and `start --http` (`protocol.httplisten`): loopback only, until TLS."""

from __future__ import annotations

import pytest

from orchestra_sup.config import settings_from_mapping, with_http
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.httplisten import host_port, http_listen


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:9", ("localhost", 9)),
    ],
)
def test_a_loopback_address_is_taken(value: str, where: tuple[str, int]) -> None:
    assert host_port(http_listen(value)) == where


@pytest.mark.parametrize("value", ["0.0.0.0:8080", "10.0.0.5:80", "example.com:80", "[::]:80"])
def test_anything_beyond_this_machine_needs_tls(value: str) -> None:
    with pytest.raises(ConfigError, match=r"loopback.*TLS"):
        http_listen(value)


@pytest.mark.parametrize("value", ["8080", "127.0.0.1:", "127.0.0.1:99999", ":80", 8080, None])
def test_a_malformed_address_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        http_listen(value)


def test_the_config_and_the_flag() -> None:
    assert settings_from_mapping({}).http.listen == ""
    on = settings_from_mapping({"http": {"listen": "127.0.0.1:8080"}})
    assert on.http.listen == "127.0.0.1:8080"
    assert with_http(on, "127.0.0.1:0").http.listen == "127.0.0.1:0"
    assert with_http(on, None) is on
    with pytest.raises(ConfigError, match=r"--http"):
        with_http(on, "0.0.0.0:1")
    with pytest.raises(ConfigError, match=r"unknown key \[http\] port"):
        settings_from_mapping({"http": {"port": 1}})
