"""A plan's HITL side: the pauses its tasks wait on, the answers humans give, and notes.

HITL (ARCHITECTURE.md §11 invariant 9): a task waits for a human (`awaiting_approval`, its
`pending` says why and which lane id answers it) before its first attempt when it says `approve =
true` (`hold_for_approval`), after a failure under `on_failure = "pause"`, or while its lane's
program waits in `ask_human` (then its lane is live: the status stays running and only `pending`
is set). An answer is first recorded (`record_answer`: kept in `answers` under the pause's key)
and only then acted on (`act_on_answer`), which the coordinator does once the record is durable;
a record with an answer it has not acted on yet is acted on at the next start (`unsettled`).

A lane's program may also tell the coordinator things (`tell_coordinator`): each is kept once in
its task's record (`note`).

`PlanAnswers` is a part of `runner.PlanRecord` (its methods read and change the plan's records
through `touch` and `set_status`, as the rest of the runner does): pure logic, no IO, no clock.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.records import MAX_NOTES, NOTE_CHARS, Pending
from orchestra_sup.coordinator.status import LIVE, TaskStatus
from orchestra_sup.coordinator.strategy import task_strategy
from orchestra_sup.errors import OrchestraError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass

MAX_GRANTED_RETRIES = 100
"""The most retries one answer may grant (as many as a plan may declare)."""
MAX_ANSWER_BYTES = 64 * 1024
"""The longest text of an answer (a reason, a redirect), UTF-8 bytes."""


class AnswerError(OrchestraError):
    """An answer that cannot be taken: `code` is "not_found" (no task waits on that lane) or
    "bad_request" (the answer does not fit the pause); the message says why in one line."""

    def __init__(self, code: Literal["not_found", "bad_request"], message: str):
        super().__init__(message)
        self.code = code


class Effect(msgspec.Struct, frozen=True, kw_only=True):
    """What acting on an answer did, for the coordinator to finish: `outcome` in one line; a
    `HitlAnswer` to send to `shard` (the lane that asked is live there), or None; `cancel`: the
    lanes (shard, lane id) a sibling-group retry took over, to cancel."""

    outcome: str
    shard: str | None = None
    answer: f.HitlAnswer | None = None
    cancel: list[tuple[str, str]] = []


class PlanAnswers:
    """What a plan does with a human's answer and a lane's question or note (see the module
    docstring); mixed into `runner.PlanRecord`."""

    __slots__ = ()

    def pause_for_question(self, pause: f.HitlPause) -> bool:
        """Lane `pause.lane`'s program waits for a human (`ask_human`): record the question;
        False (no change) when the lane is not the task's live lane or the key was answered."""
        rec = self.tasks.get(pause.task)
        if rec is None or rec.lane != pause.lane or rec.status not in LIVE:
            return False
        if pause.key in rec.carried:
            return False
        if rec.pending is not None and rec.pending.asked != pause.key:
            return False  # a lane asks one question at a time: the first one stands
        rec = self.touch(pause.task)
        rec.pending = Pending(
            kind="question",
            key=f"{pause.lane}:{pause.key}",
            lane=pause.lane,
            question=pause.question,
            since=pause.asked_at,
            asked=pause.key,
        )
        return True

    def _hold_question(self, task_id: str, why: str) -> None:
        """The lane asking a human is gone (`why`): the question still waits, with no lane;
        once answered the task re-runs with the answer (not a loss, not a retry)."""
        rec = self.touch(task_id)
        rec.warnings.append(
            f"partial work: lane {rec.lane} was interrupted when {why} while it waited for "
            "a human; it re-runs once answered"
        )
        self.set_status(task_id, TaskStatus.AWAITING_APPROVAL)
        rec.lane = rec.shard = rec.shard_gen = None

    def note(self, note: f.LaneNote, msg_id: str) -> bool:
        """Keep what a lane's program told the coordinator, once per inbox message id
        (`msg_id`: every start applies the whole inbox again); False when its task is unknown
        or it was kept before."""
        rec = self.tasks.get(note.task)
        if rec is None or msg_id in rec.noted:
            return False
        rec = self.touch(note.task)
        rec.noted.append(msg_id)
        text = note.text if len(note.text) <= NOTE_CHARS else note.text[: NOTE_CHARS - 3] + "..."
        rec.notes.append(f"{note.lane}: {text}")
        del rec.notes[:-MAX_NOTES]
        return True

    def waiting_on(self, lane: str) -> str | None:
        """The id of the task whose pause lane id `lane` answers, or None."""
        for task_id, rec in self.tasks.items():
            if rec.pending is not None and rec.pending.lane == lane:
                return task_id
        return None

    def answers_taken(self, task_id: str) -> tuple[list[str], bool]:
        """What task `task_id`'s pause takes as `record_answer` judges it now: the verdicts (in
        `ctl` order: approve, reject, redirect, accept_partial) and whether an approval needs
        retries granted with it (`approve --retries N`: a review with no retry left, where
        reject and redirect, which retry too, are refused). ([], False) when it waits on
        nothing. Answers its text or grant would make bad are not told apart here."""
        rec = self.tasks[task_id]
        pending = rec.pending
        if pending is None:
            return [], False
        if pending.kind == "approval":  # nothing ran yet: nothing to accept part of
            return ["approve", "reject", "redirect"], False
        if pending.kind == "review":
            spec = self._spec(task_id)
            if rec.retries_used >= spec.retries + rec.retries_granted:
                return ["approve", "accept_partial"], True
        return ["approve", "reject", "redirect", "accept_partial"], False

    def record_answer(self, task_id: str, answer: f.Answer) -> None:
        """Keep `answer` to task `task_id`'s pause (the audit record, ARCHITECTURE.md §11
        invariant 9); `act_on_answer` acts on it once this is durable. Raises `AnswerError`
        ("bad_request") when the answer does not fit the pause: the pause already has an answer
        (two operators at once: the first stands); a grant or retries with anything but
        approve; retries outside 0..`MAX_GRANTED_RETRIES`; a grant `budget.grant_problem`
        refuses; reject or redirect without text; a text over `MAX_ANSWER_BYTES`; an approval
        of a review whose retry the cap forbids (grant retries); accept-partial of an
        approval."""
        rec = self.touch(task_id)
        pending = rec.pending
        assert pending is not None
        earlier = rec.answers.get(pending.key)
        if earlier is not None:  # recorded, and being made durable: the first answer stands
            raise AnswerError(
                "bad_request",
                f"already answered ({earlier.verdict} by {earlier.responder or earlier.uid})",
            )
        if answer.verdict != "approve" and (answer.grant is not None or answer.retries):
            raise AnswerError("bad_request", "only an approval grants budget or retries")
        if not 0 <= answer.retries <= MAX_GRANTED_RETRIES:
            raise AnswerError(
                "bad_request",
                f"retries must be from 0 to {MAX_GRANTED_RETRIES}, got {answer.retries}",
            )
        problem = None if answer.grant is None else budget.grant_problem(answer.grant)
        if problem is not None:
            raise AnswerError("bad_request", problem)
        if answer.verdict in ("reject", "redirect") and not answer.text.strip():
            raise AnswerError("bad_request", f"a {answer.verdict} needs a text saying why")
        if len(answer.text.encode()) > MAX_ANSWER_BYTES:
            raise AnswerError(
                "bad_request", f"an answer's text is at most {MAX_ANSWER_BYTES} bytes"
            )
        if pending.kind == "approval" and answer.verdict == "accept_partial":
            raise AnswerError("bad_request", "nothing ran yet: approve, reject or redirect it")
        if pending.kind == "review" and answer.verdict != "accept_partial":
            spec = self._spec(task_id)
            cap = spec.retries + rec.retries_granted + answer.retries
            if rec.retries_used >= cap:
                raise AnswerError(
                    "bad_request",
                    f"task {task_id} used {rec.retries_used} of {cap} retries: approve with "
                    "--retries N to grant more, or accept-partial",
                )
        rec.answers[pending.key] = answer

    def answers_to_deliver(self) -> list[tuple[str, f.HitlAnswer]]:
        """Every answer to a question of a live lane, as (shard, `HitlAnswer`) to send it: the
        record keeps them (`carried`) once acted on, and sending one again is harmless (the
        lane keeps the first answer to a key). What a coordinator had acted on but not yet
        sent when it stopped (held for a rollover, killed) is sent by the next one."""
        out: list[tuple[str, f.HitlAnswer]] = []
        for rec in self._live():
            if rec.lane is None or rec.shard is None:
                continue
            for key, answer in rec.carried.items():
                out.append((rec.shard, f.HitlAnswer(lane=rec.lane, key=key, answer=answer)))
        return out

    def drop_answer(self, task_id: str) -> None:
        """Forget the answer recorded for task `task_id`'s pause and not acted on (acting on it
        failed): the pause waits for an answer again."""
        rec = self.touch(task_id)
        if rec.pending is not None:
            rec.answers.pop(rec.pending.key, None)

    def unsettled(self) -> list[str]:
        """Tasks whose pause has a recorded answer not acted on yet (the coordinator stopped
        in between): `act_on_answer` each."""
        return [
            task_id
            for task_id, rec in self.tasks.items()
            if rec.pending is not None and rec.pending.key in rec.answers
        ]

    def act_on_answer(self, task_id: str, now: float) -> Effect:
        """Act on the recorded answer to task `task_id`'s pause (`record_answer`):

        - approval: approve -> it runs; redirect -> it runs with the text as feedback; reject ->
          it fails (`preflight_escalation`, the reason in its error); (accept-partial is refused
          by `record_answer`: nothing ran).
        - review (a failed attempt): approve -> retried; reject or redirect -> retried with the
          text as revision feedback; accept-partial -> it succeeds as it is, with a warning.
        - question: the answer goes to the lane that asked (`Effect.answer`), or, when that lane
          is gone, the task re-runs and its program finds the answer recorded.

        A grant adds to the task's and the plan's budgets, `retries` to its retry cap."""
        rec = self.touch(task_id)
        pending = rec.pending
        assert pending is not None
        answer = rec.answers[pending.key]
        who = answer.responder or f"uid {answer.uid}"
        if answer.grant is not None:
            rec.granted = budget.plus(rec.granted, answer.grant)
            self.granted = budget.plus(self.granted, answer.grant)
        rec.retries_granted += answer.retries
        rec.pending = None
        verdict = answer.verdict
        if pending.kind == "question":
            asked = pending.asked or pending.key
            rec.carried[asked] = answer
            if rec.status in LIVE and rec.shard is not None and rec.lane is not None:
                hitl = f.HitlAnswer(lane=rec.lane, key=asked, answer=answer)
                return Effect(
                    outcome=f"{verdict} sent to lane {rec.lane}", shard=rec.shard, answer=hitl
                )
            self.set_status(task_id, TaskStatus.PAUSED)
            return Effect(outcome=f"{verdict} recorded; task {task_id} re-runs with it")
        if pending.kind == "approval":
            if verdict == "reject":
                self.set_status(task_id, TaskStatus.FAILED)
                rec.failure = FailureClass.PREFLIGHT_ESCALATION
                rec.error = f"rejected by {who}: {answer.text}"
                return Effect(outcome=f"task {task_id} rejected: it does not run")
            self.set_status(task_id, TaskStatus.PENDING)
            if verdict == "redirect":
                rec.feedback = answer.text
                return Effect(outcome=f"task {task_id} redirected: it runs with the feedback")
            return Effect(outcome=f"task {task_id} approved: it runs")
        # a review of a failed attempt
        if verdict == "accept_partial":
            self.set_status(task_id, TaskStatus.SUCCEEDED)
            rec.failure = None
            rec.warnings.append(
                f"partial: accepted by {who} after attempt {rec.attempts} failed: {rec.error}"
            )
            return Effect(outcome=f"task {task_id} accepted as it is")
        if verdict in ("reject", "redirect"):
            rec.feedback = answer.text
        if not self.covers(self._spec(task_id)):
            self.set_status(task_id, TaskStatus.FAILED)
            rec.error = f"{rec.error} ({verdict} by {who}: the budget cannot cover another attempt)"
            return Effect(outcome=f"task {task_id} failed: its budget cannot cover a retry")
        rec.retries_used += 1
        rec.carried.clear()
        self.set_status(task_id, TaskStatus.PENDING)
        rec.warnings.append(f"attempt {rec.attempts} failed: {verdict} by {who}: retrying")
        spec = self._spec(task_id)
        cancel = self._restart_siblings(task_id, task_strategy(self.spec, spec).scope, now)
        return Effect(outcome=f"task {task_id} retried", cancel=cancel)
