"""systemd's notify protocol (sd_notify(3)), spoken directly: one datagram to `$NOTIFY_SOCKET`.

A path or an abstract address (`@name`) is accepted. Without `NOTIFY_SOCKET` every call is a no-op,
so `start` behaves the same outside systemd.

What the supervisor says, and when (ARCHITECTURE.md §10):

- `ready(status)`: `READY=1` once every child has completed its handshake (or, after a re-exec,
  once the tree is adopted), and again when a reload is over;
- `reloading(status)`: `RELOADING=1` with `MONOTONIC_USEC=` while the config is reloaded or the
  supervisor re-executes itself; `ready` follows when it is done;
- `stopping()`: `STOPPING=1` as the stop begins;
- `send(f"STATUS={line}")`: a one-line summary whenever it changes;
- `keep_alive(interval_s)`: `WATCHDOG=1` every `watchdog_interval()` seconds, from a task on the
  supervisor's own event loop, so a wedged loop stops the pings and systemd's watchdog fires.

The receiving side, for a program that hands a tree a `NOTIFY_SOCKET` of its own (`orchestra-sup
run`, the tests), is `receive`.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
import time

MAX_DATAGRAM = 4096
"""Bytes `receive` reads of one datagram (systemd's own limit is larger; ours are short)."""
_MAX_FDS = 64
"""Descriptors `receive` makes room for in one datagram's ancillary data."""


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


def _status(line: str) -> str:
    """`\\nSTATUS=<line>`, or "" for no line; a newline in `line` would start another field."""
    return f"\nSTATUS={' '.join(line.splitlines())}" if line else ""


def ready(status: str = "") -> bool:
    """`READY=1` (and `STATUS=status`, one line, when given): the tree is up, or a reload
    announced with `reloading` is over. Returns as `send`."""
    return send("READY=1" + _status(status))


def reloading(status: str = "") -> bool:
    """`RELOADING=1` with `MONOTONIC_USEC=` (now, CLOCK_MONOTONIC microseconds, which systemd
    needs to tell this reload from a stale message) and `STATUS=status` when given. Call it as
    a reload (SIGHUP's config reload, a re-exec) begins, and `ready` once it is over, whether
    it worked or the old state was kept: until then `systemctl reload` waits and the unit shows
    "reloading". Returns as `send`."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return send(f"RELOADING=1\nMONOTONIC_USEC={usec}" + _status(status))


def stopping() -> bool:
    """`STOPPING=1`: the stop has begun (systemd shows "deactivating" and stops expecting
    watchdog pings). Returns as `send`."""
    return send("STOPPING=1" + _status("stopping"))


def watchdog_interval() -> float | None:
    """Seconds between two `WATCHDOG=1` pings: half of `$WATCHDOG_USEC` (sd_watchdog_enabled(3)
    asks for pings at least that often, so one late wake-up does not fire it). None when no
    ping is wanted: `WATCHDOG_USEC` unset, not a positive integer, or `$WATCHDOG_PID` set to
    another process's pid (the variables were meant for a parent, and were inherited)."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    if not usec.isdigit() or int(usec) == 0:
        return None
    return int(usec) / 1e6 / 2


async def keep_alive(interval_s: float) -> None:
    """Send `WATCHDOG=1` now and then every `interval_s` seconds (`watchdog_interval()`),
    forever; cancel the task to stop. Run it on the supervisor's own loop: a ping is sent only
    when that loop runs this task on time, so a wedged loop (a handler that blocks, a deadlock)
    stops the pings and systemd kills and restarts the unit after `WatchdogSec=`.

    A loop that merely runs late is not wedged: the ping goes out as soon as the loop gets to
    it, and systemd's own deadline (twice `interval_s`) is the judge. Pinging only below some
    stricter lag threshold was rejected: on an overloaded machine it would restart the whole
    tree, which makes the overload worse and interrupts every lane."""
    while True:
        send("WATCHDOG=1")
        await asyncio.sleep(interval_s)


def receive(sock: socket.socket) -> bytes:
    """Read one datagram from the notify socket `sock` (AF_UNIX, SOCK_DGRAM, bound by the
    caller; its timeout applies) and return its payload (at most `MAX_DATAGRAM` bytes).

    Descriptors that arrive with it (SCM_RIGHTS) are closed at once: `systemd-notify
    --barrier` (sd_pid_notify_barrier(3)) sends `BARRIER=1` with a pipe's write end and waits
    until every copy of it is closed; a receiver that kept it would hold the sender for the
    barrier's whole timeout and then fail it. Raises what `sock.recvmsg` raises
    (`TimeoutError` when nothing came in time, `OSError`)."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(
        MAX_DATAGRAM, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize)
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    for fd in fds:
        os.close(fd)
    return data
