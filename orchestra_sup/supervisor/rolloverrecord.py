"""One rollover's record (`Rollover`): its steps as `ctl rollover` follows them, how it ended,
and its form across the supervisor's re-exec (`Carried`). The procedure is `supervisor.rollover`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import msgspec

from orchestra_sup.protocol import frames as f
from orchestra_sup.supervisor.events import SupervisorEvents

log = logging.getLogger("orchestra_sup.supervisor")


class Carried(msgspec.Struct, frozen=True, kw_only=True):
    """A rollover's record as it crosses the supervisor's re-exec (`began`: monotonic seconds,
    which an exec keeps)."""

    id: str
    target: str
    release: f.ReleaseInfo
    events: list[f.RolloverEvent]
    began: float


class Rollover:
    """One rollover's record: its events, whether it is done and how it ended (`ok`)."""

    def __init__(self, target: str, release: f.ReleaseInfo, carried: Carried | None = None):
        self.id = carried.id if carried else uuid.uuid4().hex[:8]
        self.target = target
        self.release = release
        self.began = carried.began if carried else time.monotonic()
        self.events: list[f.RolloverEvent] = list(carried.events) if carried else []
        self.done = False
        self.ok: bool | None = None
        self.error: str | None = None
        self._changed = asyncio.Event()
        self._pollers = 0
        self.reexecuting = False
        self.told: SupervisorEvents | None = None
        """The event log each step is also written to (`rollover.step`), once set."""

    def carry(self) -> bytes:
        """This record, for the supervisor's next image (`Carried`, msgpack)."""
        return msgspec.msgpack.encode(
            Carried(
                id=self.id,
                target=self.target,
                release=self.release,
                events=self.events,
                began=self.began,
            )
        )

    @classmethod
    def carried(cls, data: bytes) -> Rollover:
        """The record `carry` encoded. Raises `msgspec.DecodeError` when it is not one."""
        was = msgspec.msgpack.decode(data, type=Carried)
        return cls(was.target, was.release, was)

    async def answered(self, timeout_s: float) -> None:
        """Return once no `wait` is pending (every poller has its answer), or after
        `timeout_s` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._pollers:
                    await asyncio.sleep(0.001)

    def event(self, child: str, text: str, took_s: float | None = None) -> None:
        """Record one step (`took_s`: its own duration, seconds) and wake the pollers."""
        took = None if took_s is None else round(took_s, 3)
        self.events.append(
            f.RolloverEvent(
                seq=len(self.events),
                at_s=round(time.monotonic() - self.began, 3),
                child=child,
                text=text,
                took_s=took,
            )
        )
        log.info("rollover %s: %s%s", self.id, f"{child}: " if child else "", text)
        if self.told is not None:
            detail = f"{self.id} of {self.target}: {text}"
            self.told.emit("rollover.step", child=child, detail=detail)
        self._wake()

    def finish(self, error: str | None) -> None:
        self.done, self.ok, self.error = True, error is None, error
        if self.told is not None:
            detail = f"{self.id} of {self.target}: {error or 'ok'}"
            self.told.emit("rollover.done", detail=detail)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def report(self, after_seq: int = -1) -> f.RolloverReport:
        return f.RolloverReport(
            id=self.id,
            target=self.target,
            release=self.release,
            done=self.done,
            ok=self.ok,
            events=self.events[max(0, after_seq + 1) :],
            error=self.error,
            reexecuting=self.reexecuting,
        )

    async def wait(self, after_seq: int, wait_s: float) -> None:
        """Return once there is an event after `after_seq`, the rollover is done, or `wait_s`
        seconds have passed."""
        if self.done or len(self.events) > after_seq + 1 or wait_s <= 0:
            return
        self._pollers += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
        finally:
            self._pollers -= 1
