"""`[http]` and `start --http` (`protocol.httplisten`): loopback only without TLS, and the
server's limits."""

from __future__ import annotations

import pytest

from orchestra_sup.config import settings_from_mapping, with_http
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.httplisten import host_port, http_listen, http_section


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


def test_with_a_certificate_and_key_any_address_is_served() -> None:
    tls = {"cert": "/etc/osup/api.pem", "key": "/etc/osup/api.key"}
    assert http_section({"listen": "0.0.0.0:8443", **tls}).tls
    on = settings_from_mapping({"http": tls})
    assert with_http(on, "[::]:8443").http.listen == "[::]:8443"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"cert": "/a.pem"}, "TLS needs both"),
        ({"key": "/a.key"}, "TLS needs both"),
        ({"max_connections": 0}, "max_connections = 0"),
        ({"max_connections": "many"}, r"\[http\]: Expected `int`"),
        ({"idle_s": 0}, "idle_s = 0"),
        ({"request_s": 1e9}, "request_s"),
        ({"releases": "/usr/bin/python3"}, r"Expected `array`"),
        ({"listen": "10.0.0.5:80"}, "set \\[http\\] cert and key"),
    ],
)
def test_bad_http_settings_are_refused_naming_the_key(body: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        http_section(body)


def test_the_limits_default_to_what_the_docs_say() -> None:
    settings = http_section({})
    assert (settings.max_connections, settings.idle_s, settings.request_s) == (256, 15.0, 60.0)
    assert settings.releases == () and not settings.tls


def test_a_release_over_http_is_an_absolute_path() -> None:
    """A relative release would be whatever the supervisor's working directory holds."""
    assert http_section({"releases": ["/opt/osup-2/bin/python"]}).releases == (
        "/opt/osup-2/bin/python",
    )
    for bad in ("relative/python", " ", ""):
        with pytest.raises(ConfigError, match="not an absolute path"):
            http_section({"releases": [bad]})
