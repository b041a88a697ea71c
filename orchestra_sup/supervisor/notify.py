"""systemd's notify protocol (sd_notify(3)), spoken directly: one datagram to `$NOTIFY_SOCKET`.

A path or an abstract address (`@name`) is accepted. Without `NOTIFY_SOCKET` every call is a no-op,
so `start` behaves the same outside systemd.
"""

from __future__ import annotations

import os
import socket


def send(state: str) -> bool:
    """Send `state` (newline-separated `KEY=VALUE` lines); False when there is no socket or the
    send failed (systemd gone: never an error for the tree).

    Never blocks: a datagram to a unix socket whose reader has fallen behind would otherwise
    block the supervisor's loop once the reader's queue is full; such a message is dropped.
    """
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), socket.MSG_DONTWAIT, addr)
    except OSError:
        return False
    return True
