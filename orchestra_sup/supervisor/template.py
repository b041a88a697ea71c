"""The supervisor's side of the fork template (`node.template`; docs/adr/0005-fork-template.md).

One template per release (today: the interpreter and package the supervisor runs) is started with
the tree, as a direct child of the supervisor in its own process group, and talked to over two
pipes. `ForkTemplate.fork` asks it for a child and returns it as a `ChildProcess` that is already
the supervisor's child and held through its pidfd; `None` means "start a fresh interpreter
instead", which `ProcessSeam` then does. That is the answer whenever the template is not ready
(starting, dead, being restarted), refuses (it found itself unclean: it is then replaced), or does
not answer within `REPLY_TIMEOUT_S` (it is then killed and replaced).

The template is supervised here, not in the OTP tree: it runs no role, so its death restarts
nothing else and never counts towards restart intensity. It is watched through its pidfd like
any child, reaped, and restarted after `intensity.Backoff` (the first restart immediate), and
stopped with the tree (`close`: end-of-file on its command pipe, then SIGKILL after
`STOP_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable

import msgspec

from orchestra_sup.config import SupervisorSettings
from orchestra_sup.errors import SupervisionError
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.forkpipe import Fork, Forked, Ready, Refused, Release, Reply, Request
from orchestra_sup.supervisor.intensity import Backoff
from orchestra_sup.supervisor.process import ChildProcess, describe

log = logging.getLogger("orchestra_sup.supervisor")

READY_TIMEOUT_S = 15.0
"""Seconds a starting template has to import its modules and answer `Ready`."""
REPLY_TIMEOUT_S = 5.0
"""Seconds the template has to answer one request before it counts as wedged."""
STOP_TIMEOUT_S = 2.0
"""Seconds `close` waits for the template to exit on end-of-file before SIGKILL."""


class TemplateGone(SupervisionError):
    """The template exited, or was given up, with a request of ours unanswered."""


class ForkTemplate:
    """The supervisor's handle on its fork template; all methods run on the supervisor's loop.

    `backoff` spaces the template's restarts (seconds; reset once it stayed up long enough).
    """

    def __init__(self, backoff: Backoff):
        self.backoff = backoff
        self.proc: ChildProcess | None = None
        self.ready = False
        self._started_at = 0.0
        self._cmd_w: int | None = None
        self._reply_r: int | None = None
        self._buf = b""
        self._pending: deque[asyncio.Future[Reply]] = deque()
        self._adopting: set[int] = set()
        self._exited: asyncio.Future[None] | None = None
        self._restart: asyncio.Task[None] | None = None
        self._closed = False
        self._broken = False
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Reply)

    def known_pids(self) -> set[int]:
        """The template's pid and those of children being adopted: processes this supervisor
        started and holds, which the orphan reaper and killer must leave alone."""
        pids = set(self._adopting)
        if self.proc is not None:
            pids.add(self.proc.pid)
        return pids

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the template and wait (at most `READY_TIMEOUT_S`) for its `Ready`. Never
        raises: a template that cannot start is logged and retried after the backoff."""
        loop = asyncio.get_running_loop()
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        argv = [
            sys.executable,
            "-m",
            "orchestra_sup.node.template",
            str(cmd_r),
            str(reply_w),
            str(os.getpid()),
        ]
        try:
            proc = ChildProcess.spawn(argv, pass_fds=(cmd_r, reply_w))
        except OSError as exc:
            log.error("fork template: cannot exec %s: %s", argv[0], exc)
            for fd in (cmd_w, reply_r):
                os.close(fd)
            self._schedule_restart()
            return
        finally:
            os.close(cmd_r)
            os.close(reply_w)
        os.set_blocking(cmd_w, False)
        os.set_blocking(reply_r, False)
        self.proc, self._cmd_w, self._reply_r, self._buf = proc, cmd_w, reply_r, b""
        self._broken = False
        self._started_at = time.monotonic()
        self._exited = loop.create_future()
        loop.add_reader(reply_r, self._on_readable)
        proc.watch(loop.add_reader, self.reap)
        ready: asyncio.Future[Reply] = loop.create_future()
        self._pending.append(ready)
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                reply = await ready
        except TimeoutError:
            self.give_up(f"not ready within {READY_TIMEOUT_S:g} s")
            return
        except TemplateGone:
            return
        if isinstance(reply, Ready) and reply.pid == proc.pid:
            self.ready = True
            log.info("fork template ready (pid %d)", proc.pid)
        else:
            self.give_up(f"answered {reply!r} instead of ready")

    async def close(self) -> None:
        """Stop the template for good: end-of-file on its command pipe (it kills the
        intermediates it still holds and exits 0), SIGKILL after `STOP_TIMEOUT_S`, reaped."""
        self._closed = True
        self.ready = False
        if self._restart is not None:
            self._restart.cancel()
        proc, exited = self.proc, self._exited
        if proc is None or exited is None:
            return
        if self._cmd_w is not None:
            os.close(self._cmd_w)
            self._cmd_w = None
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await asyncio.shield(exited)
        except TimeoutError:
            proc.signal(signal.SIGKILL)
            await exited

    def give_up(self, reason: str) -> None:
        """Kill the template (it is wedged, unclean or confused); its exit (`reap`)
        restarts it after the backoff. Spawns fall back to a fresh interpreter meanwhile."""
        if self.proc is None:
            return
        if not self._broken:
            log.warning("fork template (pid %d) given up: %s", self.proc.pid, reason)
        self.ready = False
        self._broken = True  # what it still says is ignored: replies may no longer line up
        self.proc.signal(signal.SIGKILL)

    def reap(self) -> None:
        """If the template has exited: reap it, fail what was asked of it, and restart it after
        the backoff (unless closed). Called when its pidfd turns readable, and on SIGCHLD."""
        proc = self.proc
        if proc is None:
            return
        loop = asyncio.get_running_loop()
        exit_info = proc.reap(loop.remove_reader)
        if exit_info is None:
            return
        ran_for = time.monotonic() - self._started_at
        log_at = logging.INFO if self._closed else logging.WARNING
        log.log(log_at, "fork template (pid %d) %s", proc.pid, describe(exit_info))
        self.proc = None
        self.ready = False
        if self._reply_r is not None:
            loop.remove_reader(self._reply_r)
            os.close(self._reply_r)
            self._reply_r = None
        if self._cmd_w is not None:
            os.close(self._cmd_w)
            self._cmd_w = None
        while self._pending:
            waiter = self._pending.popleft()
            if not waiter.done():
                waiter.set_exception(TemplateGone())
                waiter.exception()  # retrieved: its awaiter, if any is left, re-raises it
        if self._exited is not None:
            self._exited.set_result(None)
        if not self._closed:
            self._schedule_restart(self.backoff.next_delay(ran_for))

    def _schedule_restart(self, delay_s: float = 0.0) -> None:
        if self._closed:
            return
        if delay_s:
            log.info("fork template restarts in %.2f s", delay_s)
        self._restart = asyncio.get_running_loop().create_task(self._restart_after(delay_s))

    async def _restart_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self.start()

    # --- requests --------------------------------------------------------------------------------

    async def fork(
        self, args: ChildArgs, on_forked: Callable[[int], None] | None = None
    ) -> ChildProcess | None:
        """Fork the child `args` describes; returns it already reparented to this process and
        held (not yet watched: the caller watches it), or None when the caller must exec a fresh
        interpreter instead (see the module docstring). Raises nothing else. `on_forked(pid)` is
        called before the child is released: once released it may say hello before this
        coroutine has returned."""
        if not self.ready:
            return None
        try:
            reply = await self._ask(Fork(args=args))
        except TemplateGone:
            return None
        if isinstance(reply, Refused):
            self.give_up(f"refused to fork {args.name}: {reply.reason}")
            return None
        if not isinstance(reply, Forked):
            self.give_up(f"answered {reply!r} to a fork")
            return None
        # The intermediate holds the child unreaped until Release: the pid is pinned, and the
        # child is not ours yet, so our orphan reaper cannot see it. Once released it is ours:
        # from then until the caller holds it, `known_pids` covers it.
        self._adopting.add(reply.pid)
        if on_forked is not None:
            on_forked(reply.pid)
        try:
            try:
                child = ChildProcess.adopt(reply.pid)
            except ProcessLookupError:  # cannot happen while it is held; never trust it blindly
                self.give_up(f"forked child {reply.pid} is not there")
                return None
            try:
                released = await self._ask(Release(pid=reply.pid))
            except TemplateGone:
                released = None
            if released is None or isinstance(released, Refused):
                # Perhaps released, perhaps not: never started by us, never waited for by the
                # worker. It dies here; its zombie, once reparented, is reaped as an orphan.
                child.signal(signal.SIGKILL)
                child.abandon()
                return None
            return child
        finally:
            self._adopting.discard(reply.pid)

    async def _ask(self, request: Request) -> Reply:
        """Send one request and await its reply (replies come in request order). Raises
        `TemplateGone` when the template is not up, or exits or is given up first; a reply
        later than `REPLY_TIMEOUT_S` gives it up."""
        if not self.ready or self._broken or self._cmd_w is None:
            raise TemplateGone
        data = self._encoder.encode(request) + b"\n"
        try:
            written = os.write(self._cmd_w, data)
        except (BlockingIOError, BrokenPipeError) as exc:
            self.give_up(f"its command pipe: {exc}")
            raise TemplateGone from exc
        if written < len(data):
            self.give_up("its command pipe is full")
            raise TemplateGone
        waiter: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending.append(waiter)
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                return await waiter
        except TimeoutError:
            self.give_up(f"no answer within {REPLY_TIMEOUT_S:g} s")
            raise TemplateGone from None

    def _on_readable(self) -> None:
        assert self._reply_r is not None
        try:
            chunk = os.read(self._reply_r, 65536)
        except BlockingIOError:
            return
        if not chunk:  # it closed its end: its exit follows, handled by `reap`
            asyncio.get_running_loop().remove_reader(self._reply_r)
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if self._broken:
                return
            try:
                reply = self._decoder.decode(line)
            except msgspec.DecodeError as exc:
                self.give_up(f"undecodable reply: {exc}")
                return
            if not self._pending:
                self.give_up(f"unrequested reply {reply!r}")
                return
            waiter = self._pending.popleft()
            if not waiter.done():
                waiter.set_result(reply)
            elif isinstance(reply, Forked):
                # Its requester was cancelled: a child nobody will adopt is held in there.
                self.give_up(f"forked {reply.pid} for a request no longer waited for")


def template_for(settings: SupervisorSettings) -> ForkTemplate | None:
    """The template `[supervisor] spawn` asks for: one for `fork` (restarts spaced by the
    tree's own backoff settings), none for `exec` (every child is a fresh interpreter)."""
    if settings.spawn != "fork":
        return None
    backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s, settings.max_seconds)
    return ForkTemplate(backoff)
