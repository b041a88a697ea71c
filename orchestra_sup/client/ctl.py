"""The operator's side of the ctl endpoint: one blocking request at a time, under a timeout.

Used by `orchestra-sup ctl` and `orchestra-sup run`. It never waits longer than asked: a tree that
is missing, or that does not answer in time, raises `TreeUnreachable` with a one-line reason.

Locally it connects to `<run_dir>/ctl.ipc`, where the tree knows the caller by its uid. A remote
operator connects to the tree's CURVE `tcp://` ctl endpoint (`start --ctl-tcp`) with a client
keypair the tree allows (`protocol.keys`); a refused handshake is reported as such, at once.

It knows the largest request the tree takes (`codec.MAX_FRAME_BYTES`, encoded) and refuses a
larger one before sending anything; and a supervisor that has shut `ctl.ipc` to new connections
near its open-file limit (`protocol.connections`) is reported as busy, not as missing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from orchestra_sup.errors import (
    ConfigError,
    OrchestraError,
    ProtocolError,
    RemoteError,
    TreeBusy,
    TreeUnreachable,
)
from orchestra_sup.protocol import curve
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import SOCKET_MAX_BYTES, Codec
from orchestra_sup.protocol.connections import shut_path
from orchestra_sup.protocol.keys import ClientKeys
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.supervisor.runlock import is_owned
from orchestra_sup.system.pathcheck import shown_path

_ids = itertools.count(1)
CONNECTION_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED
"""What a tcp client's monitor also watches: whether its connection was taken, or refused."""
REFUSED_CONNECTS = 3
"""Refused connections in a row (libzmq retries every 100 ms or so) after which nothing is
taken to listen at the address: a tree restarting its listener is back well within them."""


class CtlClient:
    """A DEALER connected to `<run_dir>/ctl.ipc`, or with `connect` (a `tcp://host:port`
    address; `run_dir` is then not looked at) to a remote tree's ctl endpoint as CURVE client
    `keys`.

    Raises `TreeUnreachable` at construction when no live tree owns `run_dir`, `TreeBusy` when
    the tree has shut `ctl.ipc` to new connections, `ConfigError` when `connect` is a `tcp://`
    address and `keys` is None.
    """

    def __init__(
        self, run_dir: Path, *, connect: str | None = None, keys: ClientKeys | None = None
    ):
        if connect is None and (not is_owned(run_dir) or not (run_dir / "ctl.ipc").exists()):
            if is_owned(run_dir) and shut_path(run_dir / "ctl.ipc").exists():
                raise TreeBusy(
                    f"the tree at {shown_path(run_dir)} takes no new ctl connections now: its "
                    "supervisor is near its open-file limit; try again shortly"
                )
            raise TreeUnreachable(f"no tree is running at {shown_path(run_dir)}")
        self.where = connect or str(run_dir)
        self.codec = Codec()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAX_BYTES)  # as every tree socket
        self.monitor: zmq.Socket | None = None
        self._refused_connects = 0
        if connect is not None and keys is not None:
            self.monitor = self.sock.get_monitor_socket(curve.REFUSALS | CONNECTION_EVENTS)
        try:
            curve.connect(self.sock, connect or f"ipc://{run_dir / 'ctl.ipc'}", keys)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
        self.sock.close(linger=0)
        self.ctx.term()

    def __enter__(self) -> CtlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch_connection(self, event: int) -> None:
        """One event of a tcp connection's monitor: raises `TreeUnreachable` for a refused
        handshake, and for the `REFUSED_CONNECTS`-th refused connection in a row (nothing
        listens there: say so now, not at the request's deadline)."""
        if event & curve.REFUSALS:
            raise TreeUnreachable(
                f"the tree at {self.where} refused the CURVE handshake: its server key is "
                "not the one pinned (server.public), or it does not allow this client key"
            )
        if event == zmq.EVENT_CONNECTED:
            self._refused_connects = 0
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self._refused_connects += 1
            if self._refused_connects >= REFUSED_CONNECTS:
                raise TreeUnreachable(
                    f"nothing accepts connections at {self.where} (connection refused): is a "
                    "tree started there with --ctl-tcp?"
                )

    def request(self, body: f.Body, timeout_s: float) -> f.Body:
        """Send `body`, return the reply body.

        Raises `ConfigError` when the request cannot be encoded or is over the largest the tree
        takes (`codec.MAX_FRAME_BYTES`; nothing is sent), `TreeUnreachable` when no reply comes
        within `timeout_s` seconds and `RemoteError` when the tree answers with an `Error` frame.
        """
        msg_id = f"ctl.{os.getpid()}.{next(_ids)}"
        env = f.Envelope(
            v=PROTOCOL_VERSION,
            id=msg_id,
            corr=None,
            sender="ctl",
            gen=0,
            ttl_s=timeout_s,
            dest_gen=None,
            body=body,
        )
        try:
            data = self.codec.encode(env)
        except (UnicodeEncodeError, msgspec.EncodeError) as exc:
            # e.g. an argument whose bytes are not UTF-8 (surrogate escapes from argv)
            raise ConfigError(
                f"the request cannot be sent: {exc} (arguments must be UTF-8 text)"
            ) from exc
        except ProtocolError as exc:
            raise ConfigError(
                f"the request is not sent: {exc.detail}, the largest request the tree takes"
            ) from exc
        with contextlib.suppress(zmq.Again):
            # A refused CURVE handshake takes the connection's pipe with it (libzmq 4.3,
            # `session_base_t::engine_error`) and a blocking send would then wait for ever;
            # unsent, the monitor below says why.
            self.sock.send(data, zmq.NOBLOCK)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        if self.monitor is not None:
            poller.register(self.monitor, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(poller.poll(left_ms))
            if self.monitor is not None and self.monitor in ready:
                self._watch_connection(recv_monitor_message(self.monitor)["event"])
                continue
            if self.sock not in ready:
                raise TreeUnreachable(
                    f"the tree at {self.where} did not answer within {timeout_s:g} s"
                )
            reply = self.codec.decode(self.sock.recv())
            if reply.corr != msg_id:
                continue  # a late answer to an earlier request
            if isinstance(reply.body, f.Error):
                raise RemoteError(reply.body.code, reply.body.message)
            return reply.body


def status_or_none(client: CtlClient, timeout_s: float = 5.0) -> f.StatusReply | None:
    """The tree's `ctl status`, or None when it does not answer within `timeout_s` seconds or
    answers anything else: for a bench polling a tree that it is harming or measuring."""
    try:
        reply = client.request(f.CtlStatus(), timeout_s=timeout_s)
    except OrchestraError:
        return None
    return reply if isinstance(reply, f.StatusReply) else None
