"""The tree's CURVE keys on disk: made by `orchestra-sup keys init`, read by whoever binds or
connects a `tcp://` endpoint (`protocol.curve`).

Layout of a keys directory (mode 0700, every file 0600), each file TOML with Z85 text keys
(40 characters, as `zmq.curve_keypair()` makes them):

- `server.secret`: the tree's server keypair (`public`, `secret`): what a binding side serves
  with. Stays on the tree's host.
- `server.public`: its public half (`public`): what a client pins; copy it to a remote operator.
- `clients/<name>.public`: one allowed client (`public`): the server admits exactly these keys,
  and `<name>` is who the client is (`key:<name>`, ADR 0012). `role = "host"` marks a host's key
  (`keys init --client NAME --host`): admitted only on the cluster endpoint, where its `Hello`
  must name host `<name>`; every other key is an operator's, admitted only on ctl's (ADR 0022).
- `<name>.secret`: a client keypair (`public`, `secret`); copy it, with `server.public`, to the
  host that connects as `<name>`.

The default directory is `<state_dir>/keys` (`default_keys_dir`).
"""

from __future__ import annotations

import os
import re
import struct
import tomllib
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from orchestra_sup.errors import ConfigError

SERVER = "server"
DEFAULT_CLIENT = "operator"
HOST_ROLE = "host"
"""`role` in `clients/<name>.public` for a host's key."""
KEY_CHARS = 40
"""Length of a Z85-encoded CURVE key (32 bytes)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class Keypair:
    """A CURVE keypair, Z85 text as libzmq takes it (`KEY_CHARS` bytes each)."""

    public: bytes
    secret: bytes


@dataclass(frozen=True, slots=True)
class ServerKeys:
    """What a binding side needs: its keypair, the client keys it admits (public key -> the
    client's name), and which of those names are hosts' keys (`HOST_ROLE`)."""

    server: Keypair
    clients: dict[bytes, str]
    hosts: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """What a connecting side needs: the server's public key to pin, its own keypair, and the
    name the server knows that keypair by."""

    server_public: bytes
    client: Keypair
    name: str


def default_keys_dir(state_dir: Path) -> Path:
    """`<state_dir>/keys`."""
    return state_dir / "keys"


def init_keys(directory: Path, clients: list[str], *, host: bool = False) -> list[Path]:
    """Create a tree's keys in `directory` (made 0700 if missing): the server keypair and one
    keypair per name in `clients`, each allowed (`clients/<name>.public`), as hosts' keys when
    `host` (`HOST_ROLE`; default: operators'). In a directory that
    already holds the server key, only the clients are added (a second operator): the server key
    is never replaced, since a new one would lock every client out. Returns the files written,
    in order. Files are created 0600 and never overwritten.

    Raises `ConfigError` when a name is not `[A-Za-z0-9][A-Za-z0-9_.-]*` (at most 64
    characters) or is "server", when a client of that name is allowed already, or when a file
    cannot be written.
    """
    for name in clients:
        check_name(name)
    have_server = (directory / f"{SERVER}.secret").exists()
    for name in clients:
        if (directory / "clients" / f"{name}.public").exists():
            raise ConfigError(
                f"keys directory {directory} already allows client {name!r}; not replaced"
                + ("" if not have_server else " (keys init --client NAME adds another)")
            )
    written = []
    try:
        (directory / "clients").mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)
        if not have_server:
            server = _keypair()
            written.append(_write(directory / f"{SERVER}.secret", server))
            written.append(_write(directory / f"{SERVER}.public", Keypair(server.public, b"")))
        for name in clients:
            keypair = _keypair()
            written.append(_write(directory / f"{name}.secret", keypair))
            allowed = Keypair(keypair.public, b"")
            role = HOST_ROLE if host else None
            written.append(_write(directory / "clients" / f"{name}.public", allowed, role))
    except OSError as exc:
        raise ConfigError(f"keys directory {directory}: {exc.strerror}") from exc
    return written


def load_server_keys(directory: Path) -> ServerKeys:
    """Read the server keypair and the allowed clients from `directory`.

    Raises `ConfigError` when the directory or `server.secret` is missing or unreadable, a
    file is not a keys file or names a role other than `HOST_ROLE`, or no client is allowed (a
    server nobody may reach is a mistake).
    """
    create = f"; run `orchestra-sup keys init --dir {directory}`"
    server = _read(directory / f"{SERVER}.secret", secret=True, missing=create)
    clients, hosts = {}, set()
    for path in sorted((directory / "clients").glob("*.public")):
        allowed, role = _read_with_role(path, secret=False)
        clients[allowed.public] = path.stem
        if role == HOST_ROLE:
            hosts.add(path.stem)
    if not clients:
        raise ConfigError(f"keys directory {directory} allows no client (clients/*.public)")
    return ServerKeys(server=server, clients=clients, hosts=frozenset(hosts))


def load_client_keys(directory: Path, name: str) -> ClientKeys:
    """Read what client `name` connects with: `server.public` and `<name>.secret`.

    Raises `ConfigError` when `name` is not a valid name, or either file is missing,
    unreadable or not a keys file.
    """
    check_name(name)
    copy = f"; copy {SERVER}.public and {name}.secret from the tree's keys directory"
    pinned = _read(directory / f"{SERVER}.public", secret=False, missing=copy)
    client = _read(directory / f"{name}.secret", secret=True, missing=copy)
    return ClientKeys(server_public=pinned.public, client=client, name=name)


def load_host_link_keys(directory: Path, host: str) -> ClientKeys:
    """What the root's processes connect to host `host`'s data port with (ADR 0021, step 3):
    the tree's server keypair as the client's, pinning the host's own public key,
    `clients/<host>.public`. No key is made for it: each side already has the other's.

    Raises `ConfigError` when `host` is not a valid name, a file is missing, unreadable or not
    a keys file, or the key is not marked a host's (`HOST_ROLE`)."""
    check_name(host)
    server = _read(directory / f"{SERVER}.secret", secret=True)
    pinned, role = _read_with_role(directory / "clients" / f"{host}.public", secret=False)
    if role != HOST_ROLE:
        raise ConfigError(
            f"{directory}/clients/{host}.public is not a host's key (keys init --client {host} "
            "--host)"
        )
    return ClientKeys(server_public=pinned.public, client=server, name=SERVER)


def check_name(name: str) -> None:
    """Raise `ConfigError` for a key name that is not `[A-Za-z0-9][A-Za-z0-9_.-]*` (at most 64
    characters), or is "server"."""
    if not _NAME.fullmatch(name) or name == SERVER:
        raise ConfigError(
            f"key name {name!r}: use letters, digits, '_', '.', '-' (not 'server', at most 64)"
        )


def _keypair() -> Keypair:
    public, secret = zmq.curve_keypair()
    return Keypair(public=public, secret=secret)


def _write(path: Path, keypair: Keypair, role: str | None = None) -> Path:
    text = f'public = "{keypair.public.decode()}"\n'
    if keypair.secret:
        text += f'secret = "{keypair.secret.decode()}"\n'
    if role is not None:
        text += f'role = "{role}"\n'
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def _read(path: Path, *, secret: bool, missing: str = "") -> Keypair:
    return _read_with_role(path, secret=secret, missing=missing)[0]


def _read_with_role(path: Path, *, secret: bool, missing: str = "") -> tuple[Keypair, str | None]:
    """The keypair in `path` and its `role` (None when it says none)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no key file {path}{missing}") from None
    except OSError as exc:
        raise ConfigError(f"key file {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"key file {path} is not a keys file: {exc}") from exc
    wanted = ("public", "secret") if secret else ("public",)
    values = [data.get(field) for field in wanted]
    if not all(_is_key(v) for v in values):
        fields = " and ".join(wanted)
        raise ConfigError(f"key file {path} needs {fields} as {KEY_CHARS}-character Z85 text")
    role = data.get("role")
    if role is not None and role != HOST_ROLE:
        raise ConfigError(f"key file {path}: role = {role!r}; the one role is {HOST_ROLE!r}")
    public, *rest = (v.encode() for v in values)  # type: ignore[union-attr]
    return Keypair(public=public, secret=rest[0] if rest else b""), role


def _is_key(value: object) -> bool:
    if not isinstance(value, str) or len(value) != KEY_CHARS or not value.isascii():
        return False
    try:
        z85.decode(value)
    except (KeyError, struct.error):  # a character outside Z85, a group past 2**32
        return False
    return True
