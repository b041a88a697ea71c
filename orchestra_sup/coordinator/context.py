"""The contract a coordinator program implements, and everything it is given (`Context`).

A plan may name its coordinator (`coordinator = "NAME"` in the plan file, `[args]` handed to it):
the built-in task graph (`dag`, the default), another built-in (`coordinator.programs`), or
`module:Class` for a program listed in the tree's `[coordinator] programs` and importable by the
coordinator process. Such a plan is a *session*: its program runs inside the coordinator,
supervised with it (seeds/003, "The coordinator seam"). A program is a class::

    class Review:
        def __init__(self, args: dict):       # the plan's [args] table ({} when it has none)
            self.paths = args["paths"]

        async def run(self, ctx) -> object:   # what it returns (JSON-able) is the plan's result
            lanes = [await ctx.tools.start_lane(run=f"ruff check {p}") for p in self.paths]
            outcomes = [await ctx.wait(lane) for lane in lanes]
            return {"clean": sum(o["status"] == "succeeded" for o in outcomes)}

What `ctx` offers (`Context`, a docstring per member): `ctx.args`, `ctx.tools.<tool>(**params)`
(every tool `ctl call` offers: `Tools`), `await ctx.wait(lane)`, `ctx.events()` (the session's
durable inbox: `Event`), `await ctx.checkpoint(value)` and `ctx.resumed`, `await
ctx.ask_human(question)`, `ctx.budget` and `ctx.spent()`, and `ctx.failure(text)`.

No base class and no import from orchestra-sup is needed. The class is built once more at
submission, to check the args: a constructor that raises (a `ValueError` naming the arg, say)
refuses the plan in one line, exit 2, before it is accepted; so a constructor must only read
its args, never act. What `run` returns is the plan's
`result` (JSON-able: None, bool, int, float, str, lists and string-keyed dicts of them, at most
`RESULT_MAX_BYTES` encoded); returning `ctx.failure(text)` or raising fails the plan with that
text (a raise: "ExcType: message"). A failure of one program fails only its own plan.

Surviving its process (seeds/000, "quiet point", "effect ids", "durable inbox"): a SIGKILL,
`ctl restart coordinator` or `ctl rollover coordinator` mid-session builds the program again
(`__init__` with the same args) and calls `run` with `ctx.resumed` set to its last checkpoint,
and `ctx.events()` delivers again every event after that checkpoint. Code between two checkpoints
may therefore run twice, and every call that acts outside the program is made safe to repeat:
`start_lane`, `message_lane` and `ask_human` carry an *effect id*, derived from the session, the
number of checkpoints taken and the call's index since the last one ("2.0", "2.1", ...), or
"k.<key>" from the `key=` the program gives, so a replayed call answers what the first one did
instead of starting or messaging a lane twice. A key used again must ask the same (the same
`run` and `rev`), or the call is refused. A program stays replay-safe by making the same
effectful calls in the same order after a resume as it did before; what it must not repeat is
what it did before its last checkpoint. Lanes keep running while the coordinator is away;
their results wait in its durable inbox.

The loop: a program runs on the coordinator's event loop, beside everything else the coordinator
does. It must await, never block: a program that blocks the loop shows in the coordinator's loop-lag
figures (`ctl status`, `orchestra_sup_loop_lag_seconds`) and, past the tree's `watchdog_s`, the
coordinator is restarted like any wedged child; the session then resumes from its checkpoint. The
seat knows whose step was running when the process died (`coordinator.stepping`; its constructor and
the call of `run` are steps too): a program during whose steps it died of its own `seat.MAX_WEDGES`
(2) times (the watchdog's kill of a blocked loop, RLIMIT_RTTIME's SIGXCPU under `[cpu] realtime`, an
`os._exit`; an operator's SIGKILL blames nobody) fails its plan instead of running again. Tasks and
callbacks a program schedules itself run outside its steps and are not guarded: a `SystemExit`
raised in one ends the process like any. Run CPU work or blocking IO in a lane, or in
`asyncio.to_thread`. Once the plan has ended (its program returned, or `ctl cancel PLAN`), every
call of the context raises `RuntimeError`; a task the program spawned and left running is stopped no
other way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, Protocol

import msgspec

from orchestra_sup.protocol import frames as f

__all__ = ["RESULT_MAX_BYTES", "Context", "Event", "Failure", "Tools"]

RESULT_MAX_BYTES = 1024 * 1024
"""The largest result and the largest checkpoint a program may give (JSON or msgpack bytes): both
are kept in the coordinator's durable records."""

EventKind = Literal["result", "note", "answer", "message"]


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a session's durable inbox, in the order it was committed.

    - `seq`: its place in the inbox, from 1, without gaps.
    - `kind`: "result" (a lane the session started ended: `outcome` is what `ctx.wait` answers
      for it), "note" (a lane's program told the coordinator `text`: `LaneContext.
      tell_coordinator`), "answer" (a human answered the session's question `key`: `answer`
      holds "verdict", "text" and "responder"), "message" (an operator sent `text` with
      `ctl message PLAN TEXT`, or `Client.message`).
    - `lane`: the lane it concerns (results and notes), else None.
    - `at`: when it was committed, Unix seconds (float).
    """

    seq: int
    kind: EventKind
    at: float
    lane: str | None = None
    text: str | None = None
    key: str | None = None
    outcome: dict[str, Any] | None = None
    answer: dict[str, Any] | None = None


class Failure(msgspec.Struct, frozen=True):
    """A failed session's error text: what `run` returns to fail its plan (`ctx.failure`)."""

    error: str


class Session(Protocol):
    """What a `Context` asks of the seat that runs it (`coordinator.seat`)."""

    def call(self, tool: str, params: dict[str, Any]) -> Awaitable[Any]: ...
    def wait(self, lane: str | dict[str, Any]) -> Awaitable[dict[str, Any]]: ...
    def events(self) -> AsyncIterator[Event]: ...
    def checkpoint(self, value: Any) -> Awaitable[None]: ...
    def ask_human(self, question: str, key: str | None) -> Awaitable[dict[str, Any]]: ...
    def spent(self) -> f.Spend: ...


class Tools:
    """`ctx.tools.<tool>(**params)`: every relayed tool `ctl call` offers (`protocol.tools`:
    read_file, list_dir, stat, search, diff, log, start_lane, list_lanes, lane_status,
    cancel_lane, message_lane, snapshot_lane), answered with the value `ctl call TOOL --json`
    prints. Parameters are keywords, as `ctl call`'s KEY=VALUE: a bool is sent as "true" or
    "false", a number as its decimal text, a list as its items joined with commas, None is left
    out.

    `start_lane(run=, [rev=], [commit=], [feedback=], [timeout_s=], [requires=], [program=],
    [tenant=], [key=])` answers {"plan", "lane", "status", "shard", "ticket", "duplicate"}:
    pass that answer (or its "lane") to `ctx.wait`. Its effect id is `key` when given, else the
    call's place in the session; `message_lane(lane=, text=, [key=])` likewise.

    Raises what the tool raises through the relay (`errors.RemoteError` with its `code`:
    bad_request, not_found, ...; `PeerDown`; `CallTimeout`) and `AttributeError` for a name
    that is no tool. A `start_lane` when the session's budget has nothing left in a dimension
    it limits raises `RemoteError(forbidden)`."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def __getattr__(self, tool: str) -> Callable[..., Awaitable[Any]]:
        from orchestra_sup.protocol.tools import TOOLS

        if tool not in TOOLS:
            raise AttributeError(f"no tool {tool!r} (tools: {', '.join(sorted(TOOLS))})")

        def call(**params: Any) -> Awaitable[Any]:
            return self._session.call(tool, params)

        call.__name__ = tool
        return call


class Context:
    """What a program's `run(ctx)` is given. One per run: a resumed session gets a new one.

    Attributes:
        session: the session's id (its plan id), e.g. "3f2a9c1b0d4e".
        name: its plan's name.
        args: the plan's `[args]` table, as TOML gave it ({} when none).
        resumed: the value of the last `checkpoint` (as msgpack gives it back: tuples become
            lists), or None on a fresh start and before the first checkpoint.
        tools: the relayed tools (`Tools`).
        budget: what all the session's lanes together may spend (the plan's `budget`), or None:
            no limit. Each lane's grant is what is left once the ended lanes' spend and the
            running lanes' grants are taken off: lanes started at once do not share it.
    """

    def __init__(
        self,
        session: Session,
        *,
        session_id: str,
        name: str,
        args: dict[str, Any],
        resumed: Any,
        budget: f.Budget | None,
    ) -> None:
        self._session = session
        self.session = session_id
        self.name = name
        self.args = args
        self.resumed = resumed
        self.budget = budget
        self.tools = Tools(session)

    def spent(self) -> f.Spend:
        """What the session's ended lanes spent so far (`frames.Spend`: `wall_s` seconds,
        `cpu_s` CPU seconds, `output_bytes` bytes)."""
        return self._session.spent()

    async def wait(self, lane: str | dict[str, Any]) -> dict[str, Any]:
        """Wait for a lane the session started to end, and answer its final result: {"lane",
        "plan", "status" ("succeeded", "failed" or "cancelled"), "exit_code" (int or None),
        "output_tail" (its last output, str), "failure" (its failure class or None), "error"
        (one line or None), "commit" (the commit it made, or None), "rev" (the revision its
        sandbox was made at, or None)}.

        `lane` is `start_lane`'s answer, its "lane" or its "plan". Answers at once for a lane
        that already ended, however long ago (the result is durable).

        Raises `KeyError` when the session started no such lane."""
        return await self._session.wait(lane)

    def events(self) -> AsyncIterator[Event]:
        """The session's durable inbox (`Event`), in order, from the first event after the last
        checkpoint, waiting for new ones for ever (break out of the loop when done). Lanes'
        results, lanes' notes, humans' answers and operators' messages all arrive here; the
        ones not covered by a checkpoint arrive again after a restart.

        One reader at a time: raises `RuntimeError` when another `events()` iteration of this
        context is still open."""
        return self._session.events()

    async def checkpoint(self, value: Any) -> None:
        """Make `value` the point a restarted session resumes from (`resumed`), and mark every
        event delivered so far as handled (they are not delivered again). Returns once both are
        durable. Effect ids count again from this point.

        Raises `TypeError` for a value msgpack cannot encode, `ValueError` for one over
        `RESULT_MAX_BYTES`."""
        await self._session.checkpoint(value)

    async def ask_human(self, question: str, key: str | None = None) -> dict[str, Any]:
        """Ask a human and wait for the answer: {"verdict" ("approve", "reject" or "redirect"),
        "text", "responder"}. The question shows in `ctl lanes` (lane
        `<session>.q<effect>`, task "coordinator") and is answered with `ctl approve LANE`,
        `ctl reject LANE --reason TEXT` or `ctl redirect LANE --to TEXT` (or the SDK's
        `Client.approve`, ...); the answer also arrives as an "answer" event. `key` names
        it across replays (default: its effect id): a question answered already is answered at
        once, the same answer, and a replayed question is not asked twice.

        Raises `ValueError` for a question over 4096 UTF-8 bytes or a key that is not 1 to 64
        of `[A-Za-z0-9_.-]`."""
        return await self._session.ask_human(question, key)

    def failure(self, error: str) -> Failure:
        """A value for `run` to return that fails the plan with `error` (one line)."""
        return Failure(str(error))
