"""The tree's CURVE keys on disk (`protocol.keys`): made once, private, and every way of
reading them wrong is one `ConfigError` line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.keys import (
    KEY_CHARS,
    init_keys,
    load_client_keys,
    load_server_keys,
)

HASHES = "#" * KEY_CHARS  # the largest Z85 digit: 85**5 - 1 per group
COMMAS = "," * KEY_CHARS


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_makes_private_files_in_a_private_directory(tmp_path: Path) -> None:
    """Every file is 0600 and both directories 0700; the server admits exactly the clients
    made, and each client pins the server's public key."""
    keys = tmp_path / "state" / "keys"
    written = init_keys(keys, ["operator", "ci"])
    assert [p.relative_to(keys).as_posix() for p in written] == [
        "server.secret",
        "server.public",
        "operator.secret",
        "clients/operator.public",
        "ci.secret",
        "clients/ci.public",
    ]
    assert mode(keys) == 0o700 and mode(keys / "clients") == 0o700
    assert all(mode(p) == 0o600 for p in written)
    server = load_server_keys(keys)
    operator = load_client_keys(keys, "operator")
    assert server.clients == {
        operator.client.public: "operator",
        load_client_keys(keys, "ci").client.public: "ci",
    }
    assert operator.server_public == server.server.public
    assert zmq.curve_public(server.server.secret) == server.server.public
    assert zmq.curve_public(operator.client.secret) == operator.client.public
    assert "secret" not in (keys / "clients" / "operator.public").read_text()
    assert "secret" not in (keys / "server.public").read_text()


def test_init_never_replaces_a_key_but_adds_a_client(tmp_path: Path) -> None:
    """A second init keeps the server key and adds only the new client (a second operator); a
    client already allowed is refused and left as it was."""
    init_keys(tmp_path, ["operator"])
    before = (tmp_path / "server.secret").read_bytes()
    operator = (tmp_path / "clients" / "operator.public").read_bytes()
    assert init_keys(tmp_path, ["other"]) == [
        tmp_path / "other.secret",
        tmp_path / "clients" / "other.public",
    ]
    with pytest.raises(ConfigError, match="already allows client 'operator'"):
        init_keys(tmp_path, ["operator"])
    assert (tmp_path / "server.secret").read_bytes() == before
    assert (tmp_path / "clients" / "operator.public").read_bytes() == operator
    assert set(load_server_keys(tmp_path).clients.values()) == {"operator", "other"}


def test_a_hosts_key_says_so_and_any_other_role_is_refused(tmp_path: Path) -> None:
    """`keys init --client host-a --host` marks the allowed key `role = "host"`; the server
    reads which clients are hosts, and a key file with another role is one line."""
    init_keys(tmp_path, ["operator"])
    init_keys(tmp_path, ["host-a"], host=True)
    assert 'role = "host"' in (tmp_path / "clients" / "host-a.public").read_text()
    assert "role" not in (tmp_path / "host-a.secret").read_text()
    server = load_server_keys(tmp_path)
    assert set(server.clients.values()) == {"operator", "host-a"}
    assert server.hosts == {"host-a"}
    assert load_client_keys(tmp_path, "host-a").name == "host-a"
    allowed = tmp_path / "clients" / "host-a.public"
    allowed.write_text(allowed.read_text().replace('"host"', '"admin"'))
    with pytest.raises(ConfigError, match=r"role = 'admin'; the one role is 'host'"):
        load_server_keys(tmp_path)


@pytest.mark.parametrize("name", ["server", "", "../x", "a b", "-x", "x" * 65])
def test_a_bad_client_name_is_refused(tmp_path: Path, name: str) -> None:
    """Names become file names: nothing that is not a plain short name is accepted."""
    with pytest.raises(ConfigError, match="key name"):
        init_keys(tmp_path / "k", [name])
    assert not (tmp_path / "k").exists()


def test_missing_keys_say_what_to_do(tmp_path: Path) -> None:
    """A server with no keys is told to run `keys init`; a client to copy its two files."""
    with pytest.raises(ConfigError, match="keys init --dir") as server:
        load_server_keys(tmp_path / "none")
    with pytest.raises(ConfigError, match=r"copy server\.public and bob\.secret") as client:
        load_client_keys(tmp_path / "none", "bob")
    assert "\n" not in str(server.value) + str(client.value)


def test_a_server_that_allows_no_client_is_refused(tmp_path: Path) -> None:
    """With every `clients/*.public` removed nobody could connect: said, not served."""
    init_keys(tmp_path, ["operator"])
    (tmp_path / "clients" / "operator.public").unlink()
    with pytest.raises(ConfigError, match="allows no client"):
        load_server_keys(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "not toml [",
        'public = "short"\nsecret = "short"\n',
        f'public = "{HASHES}"\nsecret = "{HASHES}"\n',  # Z85 characters, but past 2**32
        f'public = "{COMMAS}"\nsecret = "{COMMAS}"\n',  # not Z85 characters
        "public = 1\n",
        b"\xff\xfe".decode("latin-1"),
    ],
)
def test_a_damaged_key_file_is_one_line(tmp_path: Path, text: str) -> None:
    """Whatever is in the file, reading it fails with one `ConfigError` line naming it."""
    init_keys(tmp_path, ["operator"])
    (tmp_path / "operator.secret").write_text(text, encoding="latin-1")
    with pytest.raises(ConfigError, match=r"operator\.secret") as info:
        load_client_keys(tmp_path, "operator")
    assert "\n" not in str(info.value)
