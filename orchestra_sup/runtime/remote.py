"""A node's peers on another machine: the keys, routing ids and names of its `tcp://` links, and
who may speak on the CURVE port the root's coordinator and custodian serve hosts at (ADR 0021,
step 3).

A roster names a peer on another machine by a `tcp://` endpoint; every other peer is on
`ipc://` or `inproc://`. Both ends already hold each other's keys, so no key is made for this:

- *On the root* (a coordinator or custodian calling `host-a/shard-0`): the link is a CURVE
  client with the tree's server keypair, pinning host-a's own key (`clients/host-a.public`),
  to the host's data port (`supervisor.hostdata`). Its routing id is the caller's own, then
  `>` and the shard as the host names it: `coordinator.3>shard-0`. The data port splits it.
- *On a host* (a shard calling `coordinator`, the mirror calling `custodian`): the link is a
  CURVE client with the host's keypair (`host-a.secret`), pinning `server.public`, to the root's
  `[cluster] coordinator_listen` or `custodian_listen`. It speaks as `host-a/shard-0`: that is
  its envelopes' sender and its routing id's name, which is how the root's processes know it.

The root's side of that port is `admitted_from_host`: a frame comes in with the `User-Id` the
process's ZAP handler gave its connection (`key:host-a`), and is taken only when its sender and
its routing id are under `host-a/`. So a host speaks for its own processes only: it cannot
claim a local shard's name, another host's, or the coordinator's.
"""

from __future__ import annotations

from pathlib import Path

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Caller, KeyIdentity, routing_id
from orchestra_sup.protocol.keys import ClientKeys, load_client_keys, load_host_link_keys

SEPARATOR = b">"
"""Between a caller's own routing id and the shard it calls, in its routing id at a host's
data port."""
HOST_SEPARATOR = "/"
"""Between a host's name and one of its processes' (`host-a/shard-0`)."""


def is_remote(endpoint: str) -> bool:
    """True for a peer on another machine: its endpoint is `tcp://`."""
    return endpoint.startswith("tcp://")


def qualified(host: str, name: str) -> str:
    """`host-a/shard-0`: process `name` of host `host` as the root knows it."""
    return f"{host}{HOST_SEPARATOR}{name}"


class RemoteLinks:
    """How a node reaches its peers on `tcp://` (module docstring): `keys_dir` is its keys
    directory (None: it has none), `host` the name of the host it runs on ("": the root's)."""

    def __init__(self, keys_dir: str | None, host: str):
        self.keys_dir = keys_dir
        self.host = host
        self._keys: dict[str, ClientKeys] = {}

    def sender(self, name: str) -> str:
        """The name process `name` speaks to a remote peer as."""
        return qualified(self.host, name) if self.host else name

    def identity(self, name: str, generation: int, peer: str) -> bytes:
        """The routing id of process `name`'s link to remote `peer`."""
        if self.host:
            return routing_id(self.sender(name), generation)
        return routing_id(name, generation) + SEPARATOR + local_name(peer).encode()

    def keys(self, peer: str) -> ClientKeys:
        """The CURVE client keys of a link to remote `peer`, read once per host. Raises
        `ConfigError` when the node has no keys directory or the keys cannot be read."""
        if self.keys_dir is None:
            raise ConfigError(f"{peer} is on another machine, and this process has no keys")
        owner = self.host or host_of(peer)
        keys = self._keys.get(owner)
        if keys is None:
            directory = Path(self.keys_dir)
            if self.host:
                keys = load_client_keys(directory, self.host)
            else:
                keys = load_host_link_keys(directory, owner)
            self._keys[owner] = keys
        return keys


def host_of(name: str) -> str:
    """The host of `host-a/shard-0` ("" for a name of the root's own)."""
    host, sep, _ = name.partition(HOST_SEPARATOR)
    return host if sep else ""


def local_name(name: str) -> str:
    """`shard-0` for `host-a/shard-0`, as its host names it."""
    return name.partition(HOST_SEPARATOR)[2] or name


def admitted_from_host(caller: Caller | None, peer: bytes | None, env: f.Envelope) -> str | None:
    """None when a frame on the root's cluster data port may be taken: its connection's key is
    host H's, and its sender and routing id `peer` are H's processes (`H/...`). Else why not,
    one line."""
    if not isinstance(caller, KeyIdentity):
        return "the cluster data port takes frames from hosts' keys only"
    prefix = f"{caller.name}{HOST_SEPARATOR}"
    if not env.sender.startswith(prefix) or not (peer or b"").startswith(prefix.encode()):
        shown = env.sender[:64]
        return f"host {caller.name!r} speaks for its own processes only, not as {shown!r}"
    return None
