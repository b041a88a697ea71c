"""A coordinator program's seat in memory, for unit tests of the built-in programs
(`coordinator.programs`): `SeatInMemory` answers what a `Context` asks of its session, as the
real seat would, without a tree.

- Lanes end as soon as they start, with the outcome the test's `lane_end(params)` gives.
- `start_lane` carries the seat's effect id (the checkpoints taken, the call's index since the
  last one, or the `key` given): a repeated id answers the lane it started, marked `duplicate`.
- `log` answers from a linear history of made-up commits, newest first, as the custodian does.
- `checkpoint` keeps the value as msgpack gives it back (tuples become lists).
- `kill_after(n)` makes the n-th lane start (counted over the seat's life) raise `Killed` once
  the lane is started, as a SIGKILL of the coordinator right after it; `drive` then builds the
  program again and resumes it from the last checkpoint, as the seat does.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

import msgspec

from orchestra_sup.coordinator.context import Context, Failure
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f


class Killed(BaseException):
    """The coordinator died here (a BaseException: no program catches it)."""


def sha(n: int) -> str:
    """The full sha of made-up commit number `n` (from 1)."""
    return hashlib.sha1(f"commit {n}".encode()).hexdigest()


def _wire(value: Any) -> str:
    """A tool parameter as `Tools` documents it goes on the wire."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


LaneEnd = Callable[[dict[str, str]], dict[str, Any]]
"""What a lane started with these params ends with: any of `Context.wait`'s keys."""


class SeatInMemory:
    """See the module docstring. `commits` is the length of the history `log` answers from
    (commit 1 the oldest); `lanes_allowed` how many lanes the budget lets start (None: any)."""

    def __init__(
        self, lane_end: LaneEnd, *, commits: int = 0, lanes_allowed: int | None = None
    ) -> None:
        self.lane_end = lane_end
        self.commits = commits
        self.lanes_allowed = lanes_allowed
        self.started: list[dict[str, str]] = []
        """The params of every lane really started, in order."""
        self.saved: Any = None
        self.checkpoints = 0
        self._index = 0
        self._effects: dict[str, dict[str, Any]] = {}
        self._outcomes: dict[str, dict[str, Any]] = {}
        self._kill_at: int | None = None

    def kill_after(self, starts: int) -> None:
        self._kill_at = starts

    def resumed(self) -> None:
        """The seat built the program again: effect ids count from the last checkpoint."""
        self._index = 0

    async def call(self, tool: str, params: dict[str, Any]) -> Any:
        wire = {k: _wire(v) for k, v in params.items() if v is not None}
        if tool == "log":
            return self._log(wire)
        assert tool == "start_lane", tool
        effect = wire.get("key") or f"{self.checkpoints}.{self._index}"
        self._index += 1
        if effect in self._effects:
            return {**self._effects[effect], "duplicate": True}
        if self.lanes_allowed is not None and len(self.started) >= self.lanes_allowed:
            raise RemoteError(ErrorCode.FORBIDDEN, "the session's budget has no wall_s left")
        lane = f"lane{len(self.started)}"
        self.started.append(wire)
        base = {"lane": lane, "plan": lane, "failure": None, "error": None, "commit": None}
        ending = {"status": "succeeded", "exit_code": 0, "output_tail": "", **base}
        ending.update(self.lane_end(wire))
        ending["rev"] = ending.get("rev") or (self._resolve(wire["rev"]) if "rev" in wire else None)
        self._outcomes[lane] = ending
        answer = {"plan": lane, "lane": lane, "status": "pending", "duplicate": False}
        self._effects[effect] = answer
        if self._kill_at == len(self.started):
            self._kill_at = None
            raise Killed
        return answer

    def _resolve(self, rev: str) -> str:
        if rev == "HEAD":
            return sha(self.commits)
        return rev

    def _log(self, params: dict[str, str]) -> dict[str, Any]:
        rev = params.get("rev") or "HEAD"
        newest = next(
            (n for n in range(1, self.commits + 1) if self._resolve(rev) in (sha(n), f"c{n}")),
            None,
        )
        if newest is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"unknown rev {rev!r}: no such commit")
        limit = int(params.get("limit", "50"))
        numbers = range(newest, max(0, newest - limit), -1)
        return {
            "path": "",
            "rev": rev,
            "commits": [
                {"sha": sha(n), "author": "a", "date": "", "subject": f"c{n}"} for n in numbers
            ],
            "truncated": False,
        }

    async def wait(self, lane: str | dict[str, Any]) -> dict[str, Any]:
        return dict(self._outcomes[lane["lane"] if isinstance(lane, dict) else lane])

    def events(self) -> Any:
        raise AssertionError("the built-ins read no events")

    async def checkpoint(self, value: Any) -> None:
        self.saved = msgspec.msgpack.decode(msgspec.msgpack.encode(value))
        self.checkpoints += 1
        self._index = 0

    async def ask_human(self, question: str, key: str | None) -> dict[str, Any]:
        raise AssertionError("the built-ins ask no human")

    def spent(self) -> f.Spend:
        return f.Spend()


def drive(make: Callable[[], Any], seat: SeatInMemory, *, restarts: int = 3) -> Any:
    """Run the program `make()` builds on `seat` to its end, building it again and resuming
    it from the seat's last checkpoint each time it is `Killed` (at most `restarts` times);
    answer what `run` returned, a `Failure` as its text prefixed "failure: "."""
    for _ in range(restarts + 1):
        ctx = Context(
            seat,
            session_id="s1",
            name="test",
            args={},
            resumed=seat.saved,
            budget=None,
        )
        try:
            value = asyncio.run(make().run(ctx))
        except Killed:
            seat.resumed()
            continue
        return f"failure: {value.error}" if isinstance(value, Failure) else value
    raise AssertionError("killed more often than allowed")
