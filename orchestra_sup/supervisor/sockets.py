"""The root supervisor's sockets: `supervisor.ipc` for its children, `ctl.ipc` for operators.

Both are ROUTERs on one ZeroMQ context, each made mode 0600 and watched by a
`protocol.connections.ConnectionGuard`; with `RemoteCtl` (ADR 0012) the ctl service is also
served on a CURVE `tcp://` endpoint, behind a ZAP handler that admits the tree's client keys.
With `[cluster] listen` a third CURVE ROUTER serves hosts' agents (`supervisor.hosts`, ADR
0022), behind the same handler, which admits hosts' keys there and only there. The two tcp
endpoints serve with one server key, so they read one keys directory. What is served on them
is the root supervisor's (its control channel), `supervisor.ctl`'s and `supervisor.hosts`'.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from orchestra_sup.errors import ConfigError
from orchestra_sup.paths import Paths
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.connections import ConnectionGuard
from orchestra_sup.protocol.curve import (
    CLUSTER_DOMAIN,
    HANDSHAKE_IVL_MS,
    HEARTBEAT_IVL_MS,
    HEARTBEAT_TIMEOUT_MS,
    Gate,
)
from orchestra_sup.protocol.endpoint import Endpoint, Handler
from orchestra_sup.protocol.keys import ServerKeys, default_keys_dir, load_server_keys
from orchestra_sup.system import cpupolicy
from orchestra_sup.system.descriptors import usage

log = logging.getLogger("orchestra_sup.supervisor")


class RemoteCtl(msgspec.Struct, frozen=True, kw_only=True):
    """`start --ctl-tcp ENDPOINT --keys DIR`: ctl also served on `endpoint` (`tcp://host:port`)
    with CURVE, admitting the client keys allowed in `keys_dir` (`protocol.keys`). Carried
    across a re-exec (`reexec.Handoff`)."""

    endpoint: str
    keys_dir: str


class RootSockets:
    """The sockets of the root supervisor under `paths.run_dir`, on `ctx`. `remote_ctl` also
    serves ctl on its CURVE endpoint, `cluster_listen` (`tcp://HOST:PORT`) the hosts' agents
    with the keys in `cluster_keys` (None: `<state_dir>/keys`). Their keys are read now: raises
    `ConfigError` when they cannot be, or when the two name different directories."""

    def __init__(
        self,
        paths: Paths,
        remote_ctl: RemoteCtl | None,
        cluster_listen: str | None = None,
        cluster_keys: str | None = None,
    ):
        self.paths = paths
        self.ctx = cpupolicy.context()  # its I/O threads in this process's class
        self.codec = Codec()
        self.remote_ctl = remote_ctl
        self.cluster_listen = cluster_listen
        self.remote_keys: ServerKeys | None = None
        """The server key both tcp endpoints serve with, and the clients the gate admits."""
        dirs = set()
        if remote_ctl is not None:
            dirs.add(Path(remote_ctl.keys_dir).absolute())
        if cluster_listen is not None:
            dirs.add(Path(cluster_keys or default_keys_dir(paths.state_dir)).absolute())
        if len(dirs) > 1:
            ctl_dir, cluster_dir = (str(d) for d in dirs)
            raise ConfigError(
                f"--keys and [cluster] keys name two directories ({ctl_dir}, {cluster_dir}); "
                "the tree serves one server key, so give them one"
            )
        self.keys_dir: str | None = str(dirs.pop()) if dirs else None
        """The one keys directory of the tcp endpoints (None: the tree serves none)."""
        if self.keys_dir is not None:
            self.remote_keys = load_server_keys(Path(self.keys_dir))
        self.control: Endpoint | None = None
        """`supervisor.ipc`, the children's control socket, while the sockets are open."""
        self.ctl: Endpoint | None = None
        """`ctl.ipc`, while the sockets are open."""
        self.remote: Endpoint | None = None
        """The ctl service on `remote_ctl.endpoint`, while the sockets are open."""
        self.cluster: Endpoint | None = None
        """The hosts' endpoint at `cluster_listen`, while the sockets are open."""
        self.guards: dict[Endpoint, ConnectionGuard] = {}
        """The guards of `control` and `ctl` (`protocol.connections`), while they are open."""
        self.gate: Gate | None = None
        """The ZAP handler that admits `remote_keys`' clients, while `remote` or `cluster` is
        open."""

    def open(
        self,
        on_control: Handler,
        on_ctl: Handler,
        ctl_guard: Callable[[zmq.Socket, Path], ConnectionGuard],
        children_reach: str,
        on_cluster: Handler | None = None,
    ) -> None:
        """Bind and start `control` (served by `on_control`; also bound at `children_reach`,
        where the children are told it is, when that is not its `ipc://` path) and `ctl`
        (served by `on_ctl`, guarded by `ctl_guard(sock, path)`), then the ZAP `gate` with
        `remote` (served by `on_ctl`) for `remote_ctl` and `cluster` (served by `on_cluster`)
        for `cluster_listen`. On the loop. Raises `zmq.ZMQError` when an ipc socket cannot be
        bound, `ConfigError` when a tcp endpoint cannot (what was opened stays open: `close`
        closes it)."""

        def router(handler: Handler) -> Endpoint:
            return Endpoint(
                self.ctx,
                zmq.ROUTER,
                name="supervisor",
                generation=1,
                codec=self.codec,
                handler=handler,
            )

        run_dir = self.paths.run_dir
        self.control, self.ctl = router(on_control), router(on_ctl)
        self.guards = {
            self.control: ConnectionGuard(
                self.control.sock,
                run_dir / "supervisor.ipc",
                name="supervisor",
                process="the supervisor",
            ),
            self.ctl: ctl_guard(self.ctl.sock, run_dir / "ctl.ipc"),
        }
        for ep, name in ((self.control, "supervisor"), (self.ctl, "ctl")):
            self.guards[ep].start()
            ep.bind(self.paths.endpoint(name))
            os.chmod(run_dir / f"{name}.ipc", 0o600)
            ep.start()
        if children_reach != self.paths.endpoint("supervisor"):
            self.control.bind(children_reach)
        if self.remote_keys is None:
            return
        self.gate = Gate(self.ctx, self.remote_keys)
        self.gate.start()  # before the binds: a CURVE socket with no ZAP handler admits all
        if self.remote_ctl is not None:
            self.remote = self._serve_tcp(router(on_ctl), self.remote_ctl.endpoint, "ctl", "")
            log.info("ctl also served on %s (CURVE)", self.remote_ctl.endpoint)
        if self.cluster_listen is not None:
            assert on_cluster is not None, "a cluster endpoint needs its handler"
            self.cluster = router(on_cluster)
            # Agents pick no routing id (`supervisor.hosts`); ZMTP heartbeats close the
            # connection of an agent that died without a word.
            sock = self.cluster.sock
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            self._serve_tcp(self.cluster, self.cluster_listen, "cluster", CLUSTER_DOMAIN)
            log.info("hosts join at %s (CURVE, hosts' keys only)", self.cluster_listen)

    def _serve_tcp(self, ep: Endpoint, address: str, what: str, domain: str) -> Endpoint:
        assert self.gate is not None and self.remote_keys is not None
        ep.sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
        try:
            ep.bind(address, self.remote_keys, domain)
        except zmq.ZMQError as exc:
            ep.close()
            raise ConfigError(f"{what} endpoint {address}: cannot bind it: {exc}") from exc
        self.gate.watch(ep.sock)
        ep.start()
        return ep

    def close(self, linger_s: float) -> None:
        """Close the sockets and terminate `ctx`, giving frames already sent `linger_s`
        seconds to leave (blocks the loop that long at most); `ctx` is then a fresh context,
        for `open` should the caller need them again. Not for a tree whose seam shares `ctx`
        with its children (`ColocatedSeam`) once they run."""
        self.close_endpoints(linger_s)
        self.ctx.destroy(linger=round(linger_s * 1000))
        self.ctx = cpupolicy.context()  # its I/O threads in this process's class

    def close_endpoints(self, linger_s: float) -> None:
        """Close the sockets and their guards, `ctx` left as it is."""
        if self.gate is not None:
            self.gate.close()
        for ep in (self.control, self.ctl, self.remote, self.cluster):
            if ep is not None:
                ep.close(linger_s)
        for guard in self.guards.values():  # once their sockets are closed
            guard.close()
        self.guards = {}

    def bad_frames(self) -> int:
        """Frames refused as undecodable on `control`, `ctl` and the tcp endpoints."""
        return sum(
            ep.bad_frames for ep in (self.control, self.ctl, self.remote, self.cluster) if ep
        )

    def stale_frames(self) -> int:
        """Frames refused as meant for, or sent by, another generation on `control` and `ctl`."""
        return sum(ep.stale_frames for ep in (self.control, self.ctl) if ep)

    def internal_errors(self) -> int:
        """Requests answered `internal` on any of the sockets."""
        endpoints = (self.control, self.ctl, self.remote, self.cluster)
        return sum(ep.internal_errors for ep in endpoints if ep)

    def ctl_connections(self) -> int:
        """Ctl connections served now."""
        return sum(g.served for g in self.guards.values() if g.answers)

    def refused_at_handshake(self) -> int:
        """tcp peers the ZAP `gate` refused at the handshake, on ctl's and the hosts' endpoints
        (0 with neither)."""
        return self.gate.refused if self.gate is not None else 0

    def descriptors(self) -> f.Descriptors:
        """The supervisor's descriptors now, with what its guards refused and shut."""
        now = usage()
        guards = list(self.guards.values())
        return f.Descriptors(
            open=now.open,
            limit=now.limit,
            refused=sum(g.refused for g in guards),
            closings=sum(g.closings for g in guards),
            shut=[g.name for g in guards if g.shut],
        )
