"""The connections a bound socket has accepted, kept within a bound and out of libzmq's abort.

Why (issue 24): libzmq accepts connections on its own I/O thread, and its `ipc://` accept
aborts the whole process when the process is out of descriptors (`ipc_listener.cpp` asserts
on EMFILE: it is not among the errors that accept tolerates; its `tcp://` accept does tolerate
it, and spins until a descriptor is free). Nothing above libzmq can catch that, so a process
must never let its `ipc://` listener reach its open-file limit: it stops the listener being
reached first. The same count of descriptors also bounds what one kind of caller may hold:
ctl clients (`[supervisor] ctl_connections`).

A `ConnectionGuard` watches one bound socket through a ZeroMQ monitor: `ACCEPTED` and
`DISCONNECTED` events, each carrying the connection's descriptor, so it knows which
connections are open. It reads the descriptors in use (`descriptors.usage`) at each accept
and at each `check` (`watch` calls it every `CHECK_S`):

- A connection accepted beyond `max_connections`, or while fewer than `REFUSE_BELOW`
  descriptors are free, is refused: `refusal(fd)` says why, and the owner answers each request
  that comes on it with `Error(busy)` (a message's descriptor is `Endpoint.connection`);
  `refused` counts them. Only a guard made with `answers=True` refuses (the ctl endpoints):
  the others serve the tree's own processes, which they never turn away once connected.
- Fewer than `shut_below` free: the guard shuts the door: the socket's file is renamed to
  `<path>.shut` (`shut_path`), so a new connect finds no socket there, while every open
  connection goes on; `closings` counts it. The door opens again (renamed back) once twice
  `shut_below` are free. A ctl client that finds the door shut says so (`client.CtlClient`).

Why a rename, not `zmq_unbind`: unbinding closes every connection the listener had accepted
(measured on libzmq 4.3.5), and would cut off the callers being served.

The monitor's pipe is unbounded (the PAIR's receive high-water mark is 0): with a bounded one,
libzmq's I/O thread blocks sending an event when the pipe is full (measured: at about 1,000
events not yet read), and every socket of the process stalls with it.

What is left (documented, not solved): libzmq still accepts whatever arrives between two looks
of the guard (a burst of more than the headroom within one turn of the loop, or a limit lowered
by more than the headroom between two `check`s), and such an accept at the limit aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import zmq

from orchestra_sup.system.descriptors import Usage, usage

log = logging.getLogger(__name__)

REFUSE_BELOW = 64
"""Free descriptors under which an answering guard refuses each new connection."""
SHUT_BELOW = 32
"""Free descriptors under which a ctl endpoint's door is shut."""
PEER_SHUT_BELOW = 16
"""Free descriptors under which the door of a socket the tree's own processes connect to
(`supervisor.ipc`, a child's) is shut: they keep the last of the headroom."""
CHECK_S = 1.0
"""Seconds between two looks at the descriptors when nothing connects (`watch`)."""
SHUT_SUFFIX = ".shut"
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_ids = itertools.count(1)


def shut_path(path: Path) -> Path:
    """Where a shut door keeps the socket file at `path`."""
    return path.with_name(path.name + SHUT_SUFFIX)


@dataclass(eq=False)
class ConnectionGuard:
    """Watches `sock` (bound at the `ipc://` file `path`, or a `tcp://` address: `path` None,
    no door) for the process's connections; see the module docstring. `name` says which
    socket ("ctl", "supervisor", a child's name), `process` whose process it is ("the
    supervisor", "shard-0"), in refusals and log lines. `max_connections` is called at
    each accept (a config reload may change it; None: no bound). `shut_below`: free
    descriptors under which the door shuts.

    Construction only remembers; `start()`, on the loop thread, attaches the monitor (it may
    come before or after the socket is bound); `close()`, once `sock` is closed, detaches it.
    """

    sock: zmq.Socket
    path: Path | None
    _: KW_ONLY
    name: str
    process: str
    answers: bool = False
    max_connections: Callable[[], int | None] = lambda: None
    shut_below: int = PEER_SHUT_BELOW
    open: dict[int, str | None] = field(default_factory=dict, init=False)
    """Each open connection's descriptor -> why it is refused (None: it is served)."""
    refused: int = field(default=0, init=False)
    closings: int = field(default=0, init=False)
    shut: bool = field(default=False, init=False)
    last: Usage | None = field(default=None, init=False)
    """The descriptors as the guard last read them."""
    _monitor: zmq.Socket | None = field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def start(self) -> None:
        addr = f"inproc://orchestra-guard.{os.getpid()}.{next(_ids)}"
        self.sock.monitor(addr, _EVENTS)
        monitor = self.sock.context.socket(zmq.PAIR)
        monitor.setsockopt(zmq.RCVHWM, 0)  # see the module docstring: never block libzmq
        monitor.linger = 0
        monitor.connect(addr)
        self._monitor = monitor
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(monitor.getsockopt(zmq.FD), self._drain)
        self._loop.call_soon(self._drain)

    def close(self) -> None:
        """Stop watching; a door still shut is left open for nothing: its file is removed
        (the socket behind it is closed). Call once the watched socket is closed."""
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            if self._loop is not None:
                self._loop.remove_reader(monitor.getsockopt(zmq.FD))
            monitor.close(linger=0)
        if self.shut and self.path is not None:
            shut_path(self.path).unlink(missing_ok=True)
            self.shut = False

    # --- what the owner asks -------------------------------------------------------------------

    @property
    def served(self) -> int:
        """Open connections it serves (those it refused not counted)."""
        return sum(reason is None for reason in self.open.values())

    def refusal(self, fd: int | None) -> str | None:
        """Why requests on the connection with descriptor `fd` are refused, in one line, or
        None when it is served (and for None: a message with no connection, `inproc://`)."""
        if fd is None:
            return None
        if fd not in self.open:
            self._drain()  # its ACCEPTED event is queued before its first message can be
        return self.open.get(fd)

    def check(self, now: Usage | None = None) -> Usage:
        """Shut or open the door for the descriptors in use (`now`, else read now); returns
        them."""
        now = now if now is not None else usage()
        self.last = now
        if self.path is None:
            return now
        if not self.shut and now.free < self.shut_below:
            self._shut_door(now)
        elif self.shut and now.free >= 2 * self.shut_below:
            self._open_door(now)
        return now

    # --- monitor events ------------------------------------------------------------------------

    def _drain(self) -> None:
        monitor = self._monitor
        while monitor is not None and monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            head, _endpoint = monitor.recv_multipart(zmq.NOBLOCK)
            event, fd = struct.unpack("=Hi", head[:6])
            if event == zmq.EVENT_ACCEPTED:
                self._accepted(fd)
            elif event == zmq.EVENT_DISCONNECTED:
                self.open.pop(fd, None)
            monitor = self._monitor

    def _accepted(self, fd: int) -> None:
        now = self.check()
        bound = self.max_connections()
        served = self.served
        reason = None
        if bound is not None and served >= bound:
            reason = (
                f"the {self.name} endpoint serves at most {bound} connections at once, and "
                f"{served} are open; try again when one closes"
            )
        elif now.free < REFUSE_BELOW:
            reason = near_limit(self.process, now)
        if reason is not None and self.answers:
            self.refused += 1
            log.warning("%s: refused a connection: %s", self.name, reason)
        self.open[fd] = reason if self.answers else None

    # --- the door ------------------------------------------------------------------------------

    def _shut_door(self, now: Usage) -> None:
        assert self.path is not None
        try:
            os.rename(self.path, shut_path(self.path))
        except OSError as exc:  # not there (an unlinked socket): nothing to shut
            if exc.errno != errno.ENOENT:
                raise
            return
        self.shut = True
        self.closings += 1
        log.warning("%s: takes no new connections: %s", self.name, near_limit(self.process, now))

    def _open_door(self, now: Usage) -> None:
        assert self.path is not None
        self.shut = False
        if self.path.exists():  # someone bound there meanwhile: theirs stays
            shut_path(self.path).unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            os.rename(shut_path(self.path), self.path)
            log.info(
                "%s: takes new connections again (%d of %d descriptors in use)",
                self.name,
                now.open,
                now.limit,
            )


def near_limit(process: str, now: Usage) -> str:
    """Why `process` ("the supervisor"), near its open-file limit, turns a connection away."""
    return (
        f"{process} is near its open-file limit ({now.open} of {now.limit} descriptors in "
        "use); try again shortly"
    )


async def watch(guards: Callable[[], Iterable[ConnectionGuard]], period_s: float = CHECK_S) -> None:
    """Every `period_s` seconds, read this process's descriptors once and `check` every guard
    `guards()` gives with them: the door follows the descriptors even when nothing connects
    (another part of the process opening files, the limit lowered from outside)."""
    while True:
        now = usage()
        for guard in guards():
            guard.check(now)
        await asyncio.sleep(period_s)
