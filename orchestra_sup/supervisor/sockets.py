"""The root supervisor's sockets: `supervisor.ipc` for its children, `ctl.ipc` for operators.

Both are ROUTERs on one ZeroMQ context, each made mode 0600 and watched by a
`protocol.connections.ConnectionGuard`; with `RemoteCtl` (ADR 0012) the ctl service is also
served on a CURVE `tcp://` endpoint, behind a ZAP handler that admits the tree's client keys.
What is served on them is the root supervisor's (its control channel) and `supervisor.ctl`'s.
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
from orchestra_sup.protocol.curve import Gate
from orchestra_sup.protocol.endpoint import Endpoint, Handler
from orchestra_sup.protocol.keys import ServerKeys, load_server_keys
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
    serves ctl on its CURVE endpoint; its keys are read now (raises `ConfigError` when they
    cannot be)."""

    def __init__(self, paths: Paths, remote_ctl: RemoteCtl | None):
        self.paths = paths
        self.ctx = cpupolicy.context()  # its I/O threads in this process's class
        self.codec = Codec()
        self.remote_ctl = remote_ctl
        self.remote_keys: ServerKeys | None = None
        if remote_ctl is not None:
            self.remote_keys = load_server_keys(Path(remote_ctl.keys_dir))
        self.control: Endpoint | None = None
        """`supervisor.ipc`, the children's control socket, while the sockets are open."""
        self.ctl: Endpoint | None = None
        """`ctl.ipc`, while the sockets are open."""
        self.remote: Endpoint | None = None
        """The ctl service on `remote_ctl.endpoint`, while the sockets are open."""
        self.guards: dict[Endpoint, ConnectionGuard] = {}
        """The guards of `control` and `ctl` (`protocol.connections`), while they are open."""
        self.gate: Gate | None = None
        """The ZAP handler that admits `remote_keys`' clients, while `remote` is open."""

    def open(
        self,
        on_control: Handler,
        on_ctl: Handler,
        ctl_guard: Callable[[zmq.Socket, Path], ConnectionGuard],
        children_reach: str,
    ) -> None:
        """Bind and start `control` (served by `on_control`; also bound at `children_reach`,
        where the children are told it is, when that is not its `ipc://` path) and `ctl`
        (served by `on_ctl`, guarded by `ctl_guard(sock, path)`), and with `remote_ctl` the ZAP
        `gate` and `remote` (served by `on_ctl`). On the loop. Raises `zmq.ZMQError` when an
        ipc socket cannot be bound, `ConfigError` when the tcp endpoint cannot (what was opened
        stays open: `close` closes it)."""

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
        if self.remote_ctl is not None and self.remote_keys is not None:
            self.gate = Gate(self.ctx, self.remote_keys)
            self.gate.start()  # before the bind: a CURVE socket with no ZAP handler admits all
            self.remote = router(on_ctl)
            try:
                self.remote.bind(self.remote_ctl.endpoint, self.remote_keys)
            except zmq.ZMQError as exc:
                raise ConfigError(
                    f"ctl endpoint {self.remote_ctl.endpoint}: cannot bind it: {exc}"
                ) from exc
            self.gate.watch(self.remote.sock)
            self.remote.start()
            log.info("ctl also served on %s (CURVE)", self.remote_ctl.endpoint)

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
        for ep in (self.control, self.ctl, self.remote):
            if ep is not None:
                ep.close(linger_s)
        for guard in self.guards.values():  # once their sockets are closed
            guard.close()
        self.guards = {}

    def bad_frames(self) -> int:
        """Frames refused as undecodable on `control` and `ctl`."""
        return sum(ep.bad_frames for ep in (self.control, self.ctl) if ep)

    def stale_frames(self) -> int:
        """Frames refused as meant for, or sent by, another generation on `control` and `ctl`."""
        return sum(ep.stale_frames for ep in (self.control, self.ctl) if ep)

    def internal_errors(self) -> int:
        """Requests answered `internal` on any of the sockets."""
        return sum(ep.internal_errors for ep in (self.control, self.ctl, self.remote) if ep)

    def ctl_connections(self) -> int:
        """Ctl connections served now."""
        return sum(g.served for g in self.guards.values() if g.answers)

    def refused_at_handshake(self) -> int:
        """Remote peers the ZAP `gate` refused (0 with no remote ctl)."""
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
