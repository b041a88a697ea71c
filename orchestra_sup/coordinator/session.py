"""One running session: a coordinator program's `run(ctx)` and what its `Context` does.

`RunningSession` is the seat's side of the contract (`coordinator.context.Session`): it turns
the program's calls into the coordinator's own moves, each safe to repeat after a restart
(seeds/000: "deterministic effect ids", "a durable inbox that is the only way worker results
arrive"):

- `start_lane`, `message_lane` and `ask_human` get an effect id: the program's `key=`, else
  "<checkpoints taken>.<call index since the last checkpoint>". A started lane is a one-task plan
  whose idempotency key is "<session>:<effect id>", so the same call made again (a replay after
  a restart) answers the lane the first call started; a message carries the same key to its
  shard, which delivers a key once; a question asked again is the same question.
- `events()` delivers the session's inbox (`coordinator.sessionstore`) from the first event
  after the last checkpoint, each once it is committed; `checkpoint` moves the cursor to what
  was delivered, durably. Nothing else moves it: an event delivered and not covered by a
  checkpoint is delivered again by the next run.
- effectful calls and checkpoints wait while the coordinator is held at a quiet point
  (`gate`), so a generation being rolled over takes no new action.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.context import RESULT_MAX_BYTES, Event
from orchestra_sup.coordinator.report import shown
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.coordinator.sessionstore import (
    Entry,
    Question,
    SessionLane,
    SessionRecord,
    SessionStore,
)
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools

QUESTION_MAX_BYTES = 4096
"""The longest question (UTF-8 bytes), as for a lane program's `ask_human`."""
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a program's effect key (`key=`) must match."""
EFFECTFUL = frozenset({"start_lane", "message_lane"})
"""The tools whose calls carry an effect id."""

StartLane = Callable[[tools.StartLane, f.Budget | None], Awaitable[dict[str, Any]]]
"""How a session starts a lane: the coordinator's `start_lane` with the grant the session's
budget leaves it."""


def wire_params(params: dict[str, Any]) -> dict[str, str]:
    """Keyword parameters as the wire's strings: a bool is "true" or "false", a number its
    decimal text, a list or tuple its items joined with commas; None is left out. Raises
    `TypeError` for any other value."""
    out: dict[str, str] = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[key] = str(value)
        elif isinstance(value, list | tuple):
            out[key] = ",".join(str(v) for v in value)
        else:
            raise TypeError(f"parameter {key}={value!r}: expected a string, number, bool or list")
    return out


def lane_outcome(plan: PlanRecord, lane: SessionLane) -> dict[str, Any]:
    """What `ctx.wait` answers for `lane`, run by one-task plan `plan` (see `Context.wait`)."""
    rec = plan.tasks["lane"]
    return {
        "lane": rec.lane,
        "plan": plan.id,
        "status": shown(rec),
        "exit_code": rec.exit_code,
        "output_tail": rec.output_tail,
        "failure": None if rec.failure is None else str(rec.failure),
        "error": rec.error,
        "commit": rec.commit,
        "rev": rec.rev or lane.rev,
    }


class RunningSession:
    """Session `rec` of plan `plan`, as its program runs it now. `entries` are its committed
    inbox events, oldest first; `lanes` the lanes it started, in order; `gate` is set while the
    coordinator may act (not held at a quiet point). A start costs what it adds, not the number
    of lanes before it: lanes are indexed by effect id and by plan, the ended ones' spend is
    summed as they end, and only the running ones are held."""

    def __init__(
        self,
        plan: PlanRecord,
        rec: SessionRecord,
        entries: list[Entry],
        lanes: list[SessionLane],
        *,
        book: PlanBook,
        store: SessionStore,
        toolkit_call: Callable[[str, dict[str, str]], Awaitable[Any]],
        start_lane: StartLane,
        gate: asyncio.Event,
    ) -> None:
        self.plan = plan
        self.rec = rec
        self.book = book
        self.store = store
        self._call = toolkit_call
        self._start_lane = start_lane
        self.gate = gate
        self.lanes: list[SessionLane] = []
        self.by_key: dict[str, SessionLane] = {}
        self.by_plan: dict[str, SessionLane] = {}
        self.running: set[str] = set()
        """The plan ids of its lanes that have not ended."""
        self._spent = f.Spend()
        self._starting: list[f.Spend] = []
        """The grants of starts under way (not yet lanes of it)."""
        for lane in lanes:
            self._keep(lane)
        self.origins = {entry.origin for entry in entries}
        """What caused each event committed or queued: an origin's event is committed once."""
        self.events_after: list[Event] = [e.event for e in entries if e.event.seq > rec.cursor]
        self.delivered = rec.cursor
        self.index = 0
        self.task: asyncio.Task[Any] | None = None
        self.inflight: set[asyncio.Future[Any]] = set()
        """Durable writes and lane starts under way: a quiet point waits for them."""
        self._arrived: asyncio.Future[None] | None = None
        self.ended = False
        """Its plan has ended (`Seat._conclude`): the program may act no more."""
        self._reader: object | None = None
        self._answers: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._commits: dict[int, asyncio.Future[None]] = {}

    @property
    def id(self) -> str:
        return self.plan.id

    def _keep(self, lane: SessionLane) -> None:
        """Index `lane`; count it as running, or its spend as spent."""
        self.lanes.append(lane)
        self.by_key[lane.key] = self.by_plan[lane.plan] = lane
        child = self.book.plans.get(lane.plan)
        if child is not None and child.done:
            self._spent = budget.add(self._spent, child.spent)
        elif child is not None:
            self.running.add(lane.plan)

    # --- the inbox -------------------------------------------------------------------------------

    def append(self, origin: str, kind: str, **fields: Any) -> asyncio.Future[None] | None:
        """Commit one inbox event caused by `origin` (see `coordinator.sessionstore`): the
        future resolves once it is committed. None when that origin's event is there already."""
        if origin in self.origins:
            return None
        self.origins.add(origin)
        event = Event(seq=self.rec.next_seq, kind=kind, at=time.time(), **fields)  # type: ignore[arg-type]
        self.rec.next_seq += 1
        done = self._track(self.store.append(self.rec, Entry(origin=origin, event=event)))
        self._commits[event.seq] = done
        self.events_after.append(event)
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)
        return done

    async def events(self) -> AsyncIterator[Event]:
        """See `Context.events`. A newer reader takes over: an older one still open (a loop
        left with `break`, not yet closed) raises `RuntimeError` if it is resumed."""
        self._alive()
        me = self._reader = object()
        while True:
            fresh = [e for e in self.events_after if e.seq > self.delivered]
            for event in fresh:
                commit = self._commits.pop(event.seq, None)
                if commit is not None:
                    await asyncio.shield(commit)  # never deliver what could still be lost
                if self._reader is not me:
                    raise RuntimeError("events(): a newer reader of this session took over")
                self.delivered = event.seq
                yield event
            if not fresh:
                self._arrived = asyncio.get_running_loop().create_future()
                await self._arrived

    async def checkpoint(self, value: Any) -> None:
        self._alive()
        try:
            data = msgspec.msgpack.encode(value)
        except (TypeError, OverflowError, msgspec.EncodeError) as exc:
            raise TypeError(f"checkpoint: msgpack cannot encode it: {exc}") from exc
        if len(data) > RESULT_MAX_BYTES:
            raise ValueError(
                f"checkpoint of {len(data):,} bytes: at most {RESULT_MAX_BYTES:,} (msgpack)"
            )
        await self.gate.wait()
        rec = self.rec
        rec.checkpoint, rec.checkpoints, rec.cursor = data, rec.checkpoints + 1, self.delivered
        self.index = 0
        self.events_after = [e for e in self.events_after if e.seq > rec.cursor]
        await self._track(self.store.write(rec))

    # --- tools -----------------------------------------------------------------------------------

    def _alive(self) -> None:
        if self.ended:
            raise RuntimeError(f"session {self.id} has ended: its program may act no more")

    def _effect(self, key: Any) -> str:
        """The next effectful call's effect id: "k.<key>" when the program gave `key` (its own
        namespace: a key can never take over a call's numbered effect id), else the call's
        place, "<checkpoints taken>.<index since the last one>"."""
        self._alive()
        index, self.index = self.index, self.index + 1
        if key is None:
            return f"{self.rec.checkpoints}.{index}"
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            raise ValueError(f"key {key!r}: expected 1 to 64 of [A-Za-z0-9_.-]")
        return f"k.{key}"

    async def call(self, tool: str, params: dict[str, Any]) -> Any:
        if tool not in EFFECTFUL:
            self._alive()
            return await self._call(tool, wire_params(params))
        params = dict(params)
        effect = self._effect(params.pop("key", None))
        wire = wire_params(params)
        await self.gate.wait()
        if tool == "message_lane":
            return await self._call(tool, {**wire, "key": f"{self.id}:{effect}"})
        wire.setdefault("name", f"{self.plan.spec.name}.{effect}")  # `ctl plans` says whose
        start = tools.TOOLS[tool].parse({**wire, "key": f"{self.id}:{effect}"})
        assert isinstance(start, tools.StartLane)
        return await self._track(self._start(effect, start))

    async def _start(self, effect: str, start: tools.StartLane) -> dict[str, Any]:
        known = self.by_key.get(effect)
        rev = start.rev or None
        if known is not None and (known.run, known.rev) != (start.run, rev):
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"effect {effect} started lane {known.plan} with run={known.run!r} "
                f"rev={known.rev!r}; a call with the same key must ask the same (another key, "
                "another lane)",
            )
        grant = None
        started = self.book.keys.get(f"{self.id}:{effect}")  # its row was lost with a process
        if known is None and started is not None:
            task = self.book.plans[started].spec.tasks[0]
            known_as = (task.run, task.rev or None)
            if known_as != (start.run, rev):
                raise RemoteError(
                    ErrorCode.BAD_REQUEST,
                    f"effect {effect} started lane {started} with run={task.run!r} "
                    f"rev={task.rev!r}; a call with the same key must ask the same (another "
                    "key, another lane)",
                )
        if known is None and started is None:
            limit = budget.extend(self.plan.spec.budget, self.plan.granted)
            grant = budget.left(limit, self.spent(), self.held())
            spent = budget.empty(grant)
            if spent is not None:
                raise RemoteError(
                    ErrorCode.FORBIDDEN,
                    f"session {self.id}: its budget has no {spent} left ({budget.describe(limit)})",
                )
        held = budget.as_spend(grant)
        self._starting.append(held)  # held from now: a start beside it sees it taken
        try:
            answer = await self._start_lane(start, grant)
        finally:
            self._starting.remove(held)
        if known is None:
            lane = SessionLane(key=effect, plan=answer["plan"], run=start.run, rev=rev)
            self._keep(lane)
            self.store.add_lane(self.id, lane)
            child = self.book.plans.get(lane.plan)
            if child is not None and child.done:  # it ended before it was recorded here
                self.lane_ended(child)
        return answer

    def lane_ended(self, child: PlanRecord) -> None:
        """A lane the session started ended (its plan is done): its "result" event."""
        lane = self.by_plan.get(child.id)
        if lane is not None:
            if child.id in self.running:
                self.running.discard(child.id)
                self._spent = budget.add(self._spent, child.spent)
            outcome = lane_outcome(child, lane)
            self.append(f"result:{child.id}", "result", lane=outcome["lane"], outcome=outcome)

    def held(self) -> f.Spend:
        """The grants of the session's lanes still running: what they may yet spend."""
        plans = self.book.plans
        live = (plans[plan_id] for plan_id in self.running if plan_id in plans)
        return budget.total([*(budget.as_spend(p.spec.budget) for p in live), *self._starting])

    def spent(self) -> f.Spend:
        return self._spent

    def find(self, handle: str) -> tuple[SessionLane, PlanRecord] | None:
        """The lane the session started that `handle` names (its plan id, or its lane id: a
        scan), and its plan; None when there is none."""
        known = self.by_plan.get(handle)
        if known is None:
            known = next(
                (
                    lane
                    for lane in self.lanes
                    if lane.plan in self.book.plans
                    and self.book.plans[lane.plan].tasks["lane"].lane == handle
                ),
                None,
            )
        child = None if known is None else self.book.plans.get(known.plan)
        return None if known is None or child is None else (known, child)

    async def wait(self, lane: str | dict[str, Any]) -> dict[str, Any]:
        self._alive()
        handle = (lane.get("plan") or lane.get("lane")) if isinstance(lane, dict) else lane
        found = self.find(str(handle))
        if found is None:
            raise KeyError(f"session {self.id} started no lane {handle!r}")
        known, child = found
        while not child.done:
            waiter = asyncio.get_running_loop().create_future()
            self.book.waiters.setdefault(child.id, []).append(waiter)
            await waiter
        return lane_outcome(child, known)

    # --- humans ----------------------------------------------------------------------------------

    async def ask_human(self, question: str, key: str | None) -> dict[str, Any]:
        self._alive()
        if len(question.encode()) > QUESTION_MAX_BYTES:
            raise ValueError(f"a question is at most {QUESTION_MAX_BYTES} UTF-8 bytes")
        effect = self._effect(key)
        asked = self.rec.questions.get(effect)
        if asked is not None and asked.answer is not None:
            return asked.answer
        if asked is None:
            await self.gate.wait()
            asked = Question(
                key=effect, handle=f"{self.id}.q{effect}", question=question, asked_at=time.time()
            )
            self.rec.questions[effect] = asked
            await self._track(self.store.write(self.rec))
        waiter = self._answers.setdefault(effect, asyncio.get_running_loop().create_future())
        return await asyncio.shield(waiter)

    def answered(self, asked: Question) -> asyncio.Future[None] | None:
        """Commit the "answer" event of `asked` (answered), with the record that holds its
        answer; None when it is there already. At open, the seat calls it for every answered
        question, so an answer recorded by a process that died before its event was committed
        still arrives."""
        assert asked.answer is not None
        return self.append(f"answer:{asked.key}", "answer", key=asked.key, answer=asked.answer)

    def question(self, handle: str) -> Question | None:
        """The unanswered question `handle` names, or None."""
        return next(
            (q for q in self.rec.questions.values() if q.handle == handle and q.answer is None),
            None,
        )

    async def answer(self, asked: Question, answer: f.Answer) -> None:
        """Record a human's `answer` to `asked` durably, then commit its "answer" event and
        wake the program."""
        value = {"verdict": answer.verdict, "text": answer.text, "responder": answer.responder}
        asked.answer = value
        committed = self.answered(asked)  # the event and the record that holds the answer
        if committed is not None:
            await self._track(committed)  # both durable before the human hears "answered"
        waiter = self._answers.setdefault(asked.key, asyncio.get_running_loop().create_future())
        if not waiter.done():
            waiter.set_result(value)

    def _track(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        """`work` as a future the quiet point waits for until it is done."""
        future = asyncio.ensure_future(work)
        self.inflight.add(future)
        future.add_done_callback(self.inflight.discard)
        return future
