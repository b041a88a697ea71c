"""The coordinator's side of HITL: what waits for a human, and a human's answer to it.

ARCHITECTURE.md §11 invariant 9: an answer is recorded durably, with the responder the supervisor
stamped from the ctl connection, before anything acts on it (`respond`); acted on, an answer to a
lane's question is kept to deliver to that lane (`unsent`) and sent while its shard is up
(`send`, at every pump), again after a restart or a rollover until the shard has taken it (a lane
keeps the first answer to a key, so a second send is harmless). The plan runner's pure side is
`runner.PlanRecord` (`record_answer`, `act_on_answer`).

`Answers` reaches the rest of the coordinator only through what it is given: the node, the
shards' views, and the plan book (`coordinator.book`, as `Placer` does), which holds the plans not
done and the state to refuse on and to write to, and commits a plan an answer changed (cancel the
lanes a sibling-group retry took over, write the plan, skip and finish what follows, place what
became ready).
"""

from __future__ import annotations

import logging
import time

from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.placement import ShardView
from orchestra_sup.coordinator.runner import LIVE, AnswerError, PlanRecord, TaskStatus
from orchestra_sup.errors import CallTimeout, ErrorCode, PeerDown, RemoteError, StateError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.node import Node

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 10.0


class Answers:
    """See the module docstring. `shards` is the coordinator's view of its shards, by name (kept
    by `coordinator.roster`)."""

    def __init__(self, node: Node, book: PlanBook, *, shards: dict[str, ShardView]) -> None:
        self.node = node
        self.book = book
        self._shards = shards
        self.unsent: dict[tuple[str, str], tuple[str, f.HitlAnswer]] = {}
        """Recorded answers still to deliver to the lane that asked: (lane, key) -> (shard,
        frame)."""

    def recover(self, plan: PlanRecord) -> None:
        """At start: keep what `plan` acted on but may not have delivered, and act on what it
        recorded but did not act on (seeds/003: "the pause survives a restart because it is
        reconstructed from the log"). An answer that cannot be acted on is dropped: its pause
        waits for an answer again."""
        for shard, frame in plan.answers_to_deliver():
            self.unsent[(frame.lane, frame.key)] = (shard, frame)
        for task_id in plan.unsettled():
            try:
                self.act(plan, task_id)
            except Exception:  # one bad answer must not keep the coordinator from starting
                log.exception("plan %s: task %s: answer dropped, ask again", plan.id, task_id)
                plan.drop_answer(task_id)
                self._settle(plan, [])

    def pending(self) -> f.LaneList:
        """Every task that waits for a human, oldest pause first (`ListPending`)."""
        lanes: list[f.LaneInfo] = []
        for plan in self.book.active.values():
            for task_id, rec in plan.tasks.items():
                if rec.pending is None:
                    continue
                accepts, needs_retries = plan.answers_taken(task_id)
                lanes.append(
                    f.LaneInfo(
                        lane=rec.pending.lane,
                        task=task_id,
                        plan=plan.id,
                        shard=(rec.shard or "") if rec.status in LIVE else "",
                        state=TaskStatus.AWAITING_APPROVAL,
                        sandbox=rec.sandbox,
                        question=rec.pending.question,
                        since=rec.pending.since,
                        accepts=accepts,
                        needs_retries=needs_retries,
                    )
                )
        lanes.sort(key=lambda info: info.since or 0.0)
        return f.LaneList(lanes=lanes)

    async def respond(self, req: f.HitlRespond) -> f.Body:
        """A human's answer to the pause lane id `req.lane` answers: recorded durably first,
        then acted on. Answers `HitlRecorded`. Raises `RemoteError`: `not_found` when nothing
        waits on that lane, `bad_request` when the answer does not fit the pause
        (`PlanRecord.record_answer`), `state_degraded` when it cannot be recorded."""
        for plan in self.book.active.values():
            task_id = plan.waiting_on(req.lane)
            if task_id is not None:
                break
        else:
            raise RemoteError(
                ErrorCode.NOT_FOUND, f"nothing waits for a human on lane {req.lane!r}"
            )
        answer = f.Answer(
            verdict=req.verdict,
            text=req.text,
            grant=req.grant,
            retries=req.retries,
            responder=req.responder,
            uid=req.uid,
            at=round(time.time(), 3),
        )
        try:  # before anything is recorded: a refusal changes nothing
            self.book.planstore.store.check_writable()
        except StateError as exc:
            raise RemoteError(ErrorCode.STATE_DEGRADED, str(exc)) from exc
        try:
            plan.record_answer(task_id, answer)
        except AnswerError as exc:
            raise RemoteError(ErrorCode(exc.code), str(exc)) from None
        # The audit moment: durable before anything acts on it.
        await self.book.planstore.write_durable(plan)
        if plan.tasks[task_id].pending is None:  # another answer acted first, meanwhile
            raise RemoteError(
                ErrorCode.NOT_FOUND, f"nothing waits for a human on lane {req.lane!r}"
            )
        outcome = self.act(plan, task_id)
        who = f"{req.responder} (uid {req.uid})"  # stamped by the supervisor, not the request
        detail = f"{req.verdict}{': ' + req.text if req.text else ''} -> {outcome}"
        self.book.planstore.events.emit(
            "hitl.answered", plan=plan.id, task=task_id, lane=req.lane, who=who, detail=detail
        )
        log.info(
            "plan %s: task %s: %s answered %s: %s",
            plan.id,
            task_id,
            req.responder,
            req.verdict,
            outcome,
        )
        return f.HitlRecorded(lane=req.lane, plan=plan.id, task=task_id, outcome=outcome)

    def act(self, plan: PlanRecord, task_id: str) -> str:
        """Act on the recorded answer to a task's pause; returns what it did, in one line."""
        effect = plan.act_on_answer(task_id, time.time())
        if effect.answer is not None and effect.shard is not None:
            self.unsent[(effect.answer.lane, effect.answer.key)] = (effect.shard, effect.answer)
        self._settle(plan, effect.cancel)
        return effect.outcome

    def _settle(self, plan: PlanRecord, cancel: list[tuple[str, str]]) -> None:
        """An answer changed `plan`: commit it (cancelling the lanes in `cancel`), and place
        what became ready and send the answer (a pump does) once the roster has peers."""
        with self.book.batch():
            self.book.commit(plan, cancel)
            if self.node.peers:
                self.book.schedule()

    def send(self) -> None:
        """Deliver each recorded answer whose lane's shard is up (`unsent`)."""
        for key, (shard, frame) in list(self.unsent.items()):
            view = self._shards.get(shard)
            if view is not None and view.up:
                del self.unsent[key]
                self.node.spawn(self._send(key, shard, frame))

    async def _send(self, key: tuple[str, str], shard: str, frame: f.HitlAnswer) -> None:
        try:
            await self.node.call(shard, frame, timeout_s=SEND_TIMEOUT_S)
        except RemoteError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:  # a lane gone is settled by its loss
                self.unsent.setdefault(key, (shard, frame))
        except (PeerDown, CallTimeout):
            self.unsent.setdefault(key, (shard, frame))  # the next pump tries again
