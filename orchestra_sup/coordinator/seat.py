"""The coordinator's seat: where a plan's coordinator program runs, supervised with the process.

A plan whose `coordinator` is not "dag" is a session (`coordinator.context` is the contract).
The seat checks the name at submission (a built-in, `coordinator.programs`, or a `module:Class`
listed in `[coordinator] programs` and importable here), records the session, builds the
program with the plan's args and runs `run(ctx)` as a task on the coordinator's loop. It is the
only part that knows sessions: the coordinator role tells it what concerns them (a lane's plan
ended, a lane's note, an operator's message, a human's answer, a quiet point) and asks it for
their reports and their pending questions.

After the process is gone (SIGKILL, `ctl restart coordinator`, `ctl rollover coordinator`), the
next one's `open` builds every session not ended again from its record (`coordinator.
sessionstore`): the program from its last checkpoint, its inbox from the event after it, and
a "result" event for every lane of it that ended while no process was there to tell it.

How a session ends: `run` returns (its value, JSON-encoded, is the plan's `result`), returns a
`Failure`, or raises: the plan's `outcome` is written like any plan's final record, its
waiters woken (`ctl plan --wait`), and the lanes it left running are cancelled. A program's
exception fails only its own plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec

from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.context import RESULT_MAX_BYTES, Context, Failure
from orchestra_sup.coordinator.programs import BUILTINS
from orchestra_sup.coordinator.report import session_report, session_summary
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.coordinator.session import RunningSession, StartLane
from orchestra_sup.coordinator.sessionstore import SessionRecord, SessionStore
from orchestra_sup.coordinator.status import WAITING, TaskStatus
from orchestra_sup.coordinator.stepping import Marker, stepped
from orchestra_sup.errors import ErrorCode, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.patterns import DAG
from orchestra_sup.runtime.node import Node

log = logging.getLogger(__name__)

MAX_WEDGES = 2
"""The times the coordinator process may die during one of a session's program's steps
(`coordinator.stepping`: a step that blocked the loop past the watchdog, or ended the process)
before its plan fails instead of running it again. The supervisor's restart intensity would
never stop a program that wedges once a run, a run every `watchdog_s`, and every other plan
waits while it does."""
BLAMED_EXITS = frozenset({"watchdog", "rttime", "exit_code", "clean"})
"""The previous process's ends (`ChildArgs.previous_exit`) a session whose step was running is
blamed for: the watchdog's kill of a silent loop, RLIMIT_RTTIME's SIGXCPU (a step that held a CPU
in real time), and an exit of the process's own. Any other signal (an operator's SIGKILL, the OOM
killer) or a stop blames nobody."""
ERROR_MAX_CHARS = 4096
"""The longest error a failed session keeps (characters): it is stored and shown."""
RETRY_UNTIL_UP_S = (0.05, 1.0)
"""A read tool's call to a peer that is down (not delivered, so safe to send again) is retried
after these many seconds, doubling to the second, until the relay deadline: a session rebuilt
at start must not fail because the custodian is not up yet."""


class Seat:
    """Every session of the coordinator (see the module docstring). `allowed` is `[coordinator]
    programs`; `call` is a relayed tool call (`Toolkit.call`); `start_lane` the coordinator's
    placement of a one-task plan with a grant; `deadline_s` bounds a retried call."""

    def __init__(
        self,
        node: Node,
        book: PlanBook,
        store: SessionStore,
        *,
        allowed: frozenset[str],
        call: Callable[[str, dict[str, str]], Awaitable[Any]],
        start_lane: StartLane,
        deadline_s: float,
    ) -> None:
        self.node = node
        self.book = book
        self.store = store
        self.allowed = allowed
        self._call = call
        self._start_lane = start_lane
        self.deadline_s = deadline_s
        self.sessions: dict[str, RunningSession] = {}
        self.gate = asyncio.Event()
        """Set while sessions may act; cleared at a quiet point (`hold`)."""
        self.gate.set()
        self.marker: Marker | None = None
        """Whose step runs now (`coordinator.stepping`); opened with the sessions (`open`)."""

    # --- programs --------------------------------------------------------------------------------

    def program(self, name: str) -> type:
        """The class `name` names. Raises `RemoteError(bad_request)` in one line when it is not
        built in and not in `[coordinator] programs`, or cannot be imported here."""
        if name in BUILTINS:
            return BUILTINS[name]
        if ":" not in name:
            raise RemoteError(ErrorCode.BAD_REQUEST, f"coordinator {name!r} is not built in")
        if name not in self.allowed:
            listed = ", ".join(sorted(self.allowed)) or "none"
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"coordinator {name!r} is not in the tree's [coordinator] programs (listed: "
                f"{listed})",
            )
        module, _, cls = name.partition(":")
        try:
            found = getattr(importlib.import_module(module), cls)
        except BaseException as exc:  # an import runs the module: SystemExit is the program's
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"coordinator {name!r} cannot be loaded: {type(exc).__name__}: {exc}",
            ) from exc
        if not isinstance(found, type) or not callable(getattr(found, "run", None)):
            raise RemoteError(
                ErrorCode.BAD_REQUEST, f"coordinator {name!r} is not a class with run(ctx)"
            )
        return found

    def check(self, spec: f.PlanSpec) -> None:
        """Refuse a submitted plan whose coordinator cannot run here (`program`), or whose
        program refuses its args: the class is built once with them, as every run builds it
        (so a constructor must only read its args). Raises `RemoteError(bad_request)` in one
        line, naming the coordinator and what its constructor raised."""
        if spec.coordinator == DAG:
            return
        program = self.program(spec.coordinator)
        try:
            program(dict(spec.args))
        except BaseException as exc:  # the program's own check of its args, whatever it raises
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                _one_line(
                    f"coordinator {spec.coordinator!r} refused its [args]: "
                    f"{type(exc).__name__}: {exc}"
                ),
            ) from exc

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Build and run every session the book holds that has not ended (at start)."""
        live = {
            p.id: p for p in self.book.active.values() if p.spec.coordinator != DAG and not p.done
        }
        self.marker = Marker.open(self.node.paths.state_dir / "coordinator" / "stepping")
        for session_id, (rec, entries) in self.store.load(set(live)).items():
            rec = rec or SessionRecord(id=session_id)
            if session_id == self.marker.blamed and self.node.args.previous_exit in BLAMED_EXITS:
                # the last process died of its own in one of this session's steps
                rec.wedges += 1
                log.warning("session %s: the coordinator died during its step", session_id)
            self._run(live[session_id], rec, entries)

    def started(self, plan: PlanRecord) -> None:
        """`plan`, a session, was accepted: run it."""
        self._run(plan, SessionRecord(id=plan.id), [])

    def _run(self, plan: PlanRecord, rec: SessionRecord, entries: list[Any]) -> None:
        session = RunningSession(
            plan,
            rec,
            entries,
            self.store.lanes(plan.id) if rec.runs else [],
            book=self.book,
            store=self.store,
            toolkit_call=self._relay,
            start_lane=self._start_lane,
            gate=self.gate,
        )
        self.sessions[plan.id] = session
        for lane in session.lanes:  # lanes that ended while no process was there to say so
            child = self.book.plans.get(lane.plan)
            if child is not None and child.done:
                session.lane_ended(child)
        for asked in rec.questions.values():  # answers recorded, their events maybe not
            if asked.answer is not None:
                session.answered(asked)
        rec.runs += 1
        session.task = self.node.spawn(self._drive(session))

    async def _drive(self, session: RunningSession) -> None:
        plan, rec = session.plan, session.rec
        resumed = None if rec.checkpoint is None else msgspec.msgpack.decode(rec.checkpoint)
        ctx = Context(
            session,
            session_id=plan.id,
            name=plan.spec.name,
            args=dict(plan.spec.args),
            resumed=resumed,
            budget=plan.spec.budget,
        )
        log.info(
            "session %s (%s): run %d of %s",
            plan.id,
            plan.spec.name,
            rec.runs,
            plan.spec.coordinator,
        )
        await session.store.write(rec)  # durable before the program runs
        if rec.wedges >= MAX_WEDGES:
            self._conclude(
                session,
                error=f"the coordinator died during its program's steps {rec.wedges} times (a "
                "step blocked the loop past the watchdog, or ended the process): not run again",
            )
            return
        try:
            with self._marked(plan.id):  # building it and calling run are its steps too
                program = self.program(plan.spec.coordinator)(dict(plan.spec.args))
                running = program.run(ctx)
            if not inspect.iscoroutine(running):
                raise TypeError(f"run(ctx) must be `async def`; it returned {running!r:.60}")
            if self.marker is not None:
                running = stepped(running, self.marker, plan.id)
            value = await running
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the seat or the process stops it: the next one resumes the session
            self._conclude(session, error=_one_line(f"CancelledError raised by the program {exc}"))
            return
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the program's own
            self._conclude(session, error=_one_line(f"{type(exc).__name__}: {exc}"))
            return
        if isinstance(value, Failure):
            self._conclude(session, error=_one_line(value.error))
            return
        problem = json_problem(value)
        if problem is not None:
            self._conclude(session, error=f"result is not JSON-able: {problem}")
            return
        encoded = msgspec.json.encode(value)
        if len(encoded) > RESULT_MAX_BYTES:
            self._conclude(
                session, error=f"result of {len(encoded):,} bytes: at most {RESULT_MAX_BYTES:,}"
            )
            return
        self._conclude(session, result=msgspec.json.decode(encoded))

    @contextlib.contextmanager
    def _marked(self, session: str) -> Iterator[None]:
        """The marker names `session` for the block (`coordinator.stepping`)."""
        if self.marker is None:
            yield
            return
        self.marker.mark(session)
        try:
            yield
        finally:
            self.marker.clear()

    def _conclude(self, session: RunningSession, *, result: Any = None, error: str | None = None):
        """End `session`'s plan with `result` or `error`, and cancel the lanes it left."""
        plan = session.plan
        if session.ended:  # a program that swallowed its cancellation returns: it stays ended
            return
        session.ended = True
        plan.outcome = f.PlanOutcome(result=result, error=error, at=time.time())
        self.sessions.pop(plan.id, None)
        if error is None:
            log.info("session %s: done", plan.id)
        else:
            log.warning("session %s: failed: %s", plan.id, error)
        for plan_id in list(session.running):
            child = self.book.plans.get(plan_id)
            if child is None or child.done:
                continue
            rec = child.tasks["lane"]
            if rec.status in WAITING:  # not placed yet: it never will be
                cancelled = child.set_status("lane", TaskStatus.CANCELLED)
                cancelled.error = "cancelled: its session ended"
                self.book.commit(child)
            elif rec.lane is not None:
                self.node.spawn(self._relay("cancel_lane", {"lane": rec.lane}))
        self.book.commit(plan)

    def cancel(self, plan_id: str) -> bool:
        """`ctl cancel PLAN` of a session under way: its program is stopped, its plan fails
        with "cancelled" and the lanes it left are cancelled. False when `plan_id` is no
        session under way."""
        session = self.sessions.get(plan_id)
        if session is None:
            return False
        if session.task is not None:
            session.task.cancel()
        self._conclude(session, error="cancelled")
        return True

    # --- what the role tells it ------------------------------------------------------------------

    def owner(self, plan_id: str) -> RunningSession | None:
        """The running session that started one-task plan `plan_id`, or None. Its idempotency
        key names the session ("<session>:<effect id>", `coordinator.session`); a key that
        only looks like one (`ctl call start_lane key=...`) is no lane of that session."""
        plan = self.book.plans.get(plan_id)
        session_id = (plan.key or "").partition(":")[0] if plan is not None else ""
        session = self.sessions.get(session_id)
        return session if session is not None and plan_id in session.by_plan else None

    def plan_done(self, plan: PlanRecord) -> None:
        """`plan` ended: if a session started it, commit its "result" event. Called at every
        plan's end: one lookup, whatever the number of sessions."""
        session = self.owner(plan.id)
        if session is not None:
            session.lane_ended(plan)

    def note(self, note: f.LaneNote, msg_id: str) -> None:
        """A lane's program told the coordinator `note`: a "note" event of its session."""
        session = self.owner(note.plan)
        if session is not None:
            session.append(f"note:{msg_id}", "note", lane=note.lane, text=note.text)

    async def message(self, req: f.CtlMessage) -> f.Body:
        """`ctl message PLAN TEXT`: a "message" event of session `req.plan`. Raises
        `RemoteError`: not_found (no such plan), bad_request (a dag plan, an ended session, a
        text over `MESSAGE_MAX_BYTES`)."""
        plan = self.book.plans.get(req.plan)
        if plan is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no plan {req.plan!r}")
        if plan.spec.coordinator == DAG:
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"plan {req.plan} runs the dag coordinator: only a coordinator program's "
                "session takes messages",
            )
        session = self.sessions.get(plan.id)
        if session is None:
            raise RemoteError(ErrorCode.BAD_REQUEST, f"session {req.plan} has ended")
        if len(req.text.encode()) > f.MESSAGE_MAX_BYTES:
            raise RemoteError(
                ErrorCode.BAD_REQUEST, f"a message is at most {f.MESSAGE_MAX_BYTES} UTF-8 bytes"
            )
        committed = session.append(f"message:{uuid.uuid4().hex}", "message", text=req.text)
        assert committed is not None  # a new origin
        await asyncio.shield(committed)
        return f.Ack()

    def asks(self, handle: str) -> bool:
        """Whether `handle` is an unanswered question of a session."""
        return any(s.question(handle) is not None for s in self.sessions.values())

    async def respond(self, req: f.HitlRespond) -> f.Body:
        """A human's answer to a session's question (`asks(req.lane)`): recorded durably, then
        an "answer" event, then the program wakes."""
        for session in self.sessions.values():
            asked = session.question(req.lane)
            if asked is not None:
                if req.verdict not in ACCEPTS:
                    raise RemoteError(
                        ErrorCode.BAD_REQUEST,
                        f"{req.lane} is a coordinator program's question: it takes "
                        f"{', '.join(ACCEPTS)}, not {req.verdict}",
                    )
                if req.grant is not None or req.retries:
                    raise RemoteError(
                        ErrorCode.BAD_REQUEST,
                        f"{req.lane} is a coordinator program's question: an approval of it "
                        "grants no budget and no retries",
                    )
                answer = f.Answer(
                    verdict=req.verdict,
                    text=req.text,
                    responder=req.responder,
                    uid=req.uid,
                    at=time.time(),
                )
                await session.answer(asked, answer)
                self.book.planstore.events.emit(
                    "hitl.answered",
                    plan=session.id,
                    task="coordinator",
                    lane=req.lane,
                    who=f"{req.responder} (uid {req.uid})",  # the supervisor stamped it
                    detail=f"{req.verdict}{': ' + req.text if req.text else ''}",
                )
                return f.HitlRecorded(
                    lane=req.lane, plan=session.id, task="coordinator", outcome="answered"
                )
        raise RemoteError(ErrorCode.NOT_FOUND, f"no question waits on {req.lane!r}")

    def pending(self) -> list[f.LaneInfo]:
        """Every unanswered question of a session, as `ctl pending` lists them."""
        return [
            f.LaneInfo(
                lane=q.handle,
                task="coordinator",
                plan=session.id,
                shard="",
                state="awaiting_approval",
                sandbox=None,
                question=q.question,
                since=q.asked_at,
                accepts=list(ACCEPTS),
            )
            for session in self.sessions.values()
            for q in session.rec.questions.values()
            if q.answer is None
        ]

    def report(self, plan: PlanRecord) -> f.PlanReport:
        """`ctl plan` of session `plan`."""
        session = self.sessions.get(plan.id)
        lanes = session.lanes if session is not None else self.store.lanes(plan.id)
        return session_report(plan, [(lane, self.book.plans.get(lane.plan)) for lane in lanes])

    def summary(self, plan: PlanRecord) -> f.PlanSummary:
        """`ctl plans`' line of session `plan` (`report.session_summary`)."""
        session = self.sessions.get(plan.id)
        lanes = session.lanes if session is not None else self.store.lanes(plan.id)
        return session_summary(plan, [self.book.plans.get(lane.plan) for lane in lanes])

    # --- quiet points ----------------------------------------------------------------------------

    def hold(self) -> None:
        """A quiet point: no session takes a new action until `release`."""
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def inflight(self) -> list[asyncio.Future[Any]]:
        """What sessions have under way (durable writes, lane starts): a quiet point waits."""
        return [fut for s in self.sessions.values() for fut in s.inflight]

    # --- the relay -------------------------------------------------------------------------------

    async def _relay(self, tool: str, params: dict[str, str]) -> Any:
        """`call`, sent again while its peer is down (it was not delivered), until the relay
        deadline."""
        delay, cap = RETRY_UNTIL_UP_S
        deadline = time.monotonic() + self.deadline_s
        while True:
            try:
                return await self._call(tool, params)
            except PeerDown:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(cap, delay * 2)


ACCEPTS = ("approve", "reject", "redirect")
"""The answers a session's question takes (accept_partial ends a task's step: a session has
none)."""


def json_problem(value: Any, depth: int = 0) -> str | None:
    """Why `value` is not a JSON value as a result must be (None, bool, int, finite float, str,
    and lists, tuples and string-keyed dicts of them, at most 64 deep), or None when it is."""
    if depth > 64:
        return "nested more than 64 deep"
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else f"{value} does not fit in 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, list | tuple):
        return next((p for v in value if (p := json_problem(v, depth + 1)) is not None), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"a dict key {key!r} is not a string"
            problem = json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"a {type(value).__name__} is not a JSON value"


def _one_line(text: str) -> str:
    """`text` on one line, at most `ERROR_MAX_CHARS` characters."""
    line = " ".join(text.split()) or "failed"
    return line if len(line) <= ERROR_MAX_CHARS else line[: ERROR_MAX_CHARS - 3] + "..."
