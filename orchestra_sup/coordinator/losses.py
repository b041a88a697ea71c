"""What losing a worker process, a stop or a rollover does to a plan's live tasks.

Losing the worker process (the shard a lane ran on exits) is an infrastructure failure, not a
verdict on the work (ARCHITECTURE.md §7, §11 invariant 5): starting | running -> paused, and a
paused task is ready again, so it is re-placed on a live shard (the restarted one included) and
its step re-runs with a partial-work warning, since whatever the dead attempt did outside its
sandbox may still be there. Every placement counts in `attempts`. The `max_worker_loss`-th loss
of the same task fails it with the failure class `worker_process_loss` instead, so a command that
kills its own shard cannot loop.

A stop is not a loss: a task whose lane a stopping tree interrupted runs again with no
`worker_losses` counted (`interrupt_shard`).

A rollover moves lanes between generations of one shard (ARCHITECTURE.md §9): a task whose lane
runs on a generation the roster lists as draining is not lost (`lose_shard`'s `keep`); once that
generation has retired, the lanes the shard's current generation has (live, or with a result in
its outbox) move on to it, and only the others are lost (`settle_moved`).

`PlanLosses` is a part of `runner.PlanRecord`: pure logic, no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Collection

from orchestra_sup.coordinator.status import TaskStatus
from orchestra_sup.coordinator.strategy import Action
from orchestra_sup.protocol.frames import FailureClass


class PlanLosses:
    """What a plan does when the lanes of its live tasks are lost, interrupted or moved (see
    the module docstring); mixed into `runner.PlanRecord`."""

    __slots__ = ()

    def _interrupt(self, task_id: str, why: str) -> None:
        """A stop interrupted the task's lane: not a verdict and not a loss; it runs again."""
        rec = self.set_status(task_id, TaskStatus.INTERRUPTED)
        rec.warnings.append(
            f"partial work: lane {rec.lane} was interrupted when {why}; re-running the step"
        )
        rec.lane = rec.shard = rec.shard_gen = None

    def interrupt_shard(self, shard: str) -> list[str]:
        """The tree is stopping and `shard` went down: its live tasks are interrupted, not lost
        (no `worker_losses` counted); returns their ids."""
        hit = [t for t in self.live_ids() if self.tasks[t].shard == shard]
        for task_id in hit:
            rec = self.tasks[task_id]
            if rec.pending is not None and rec.pending.kind == "question":
                self._hold_question(task_id, f"{shard} was stopped with the tree")
            else:
                self._interrupt(task_id, f"{shard} was stopped with the tree")
        return hit

    def lose_shard(
        self,
        shard: str,
        generation: int | None,
        max_worker_loss: int,
        keep: Collection[int] = (),
        now: float = 0.0,
    ) -> list[str]:
        """Pause every live task on `shard` whose lane ran on a generation other than
        `generation` (None: the shard is down, so every generation) and not in `keep` (generations
        still draining, or retired and not yet settled: their lanes are moving, not lost);
        returns their ids.

        A worker-process loss is not a verdict on the work (ARCHITECTURE.md §11 invariant 5): the
        task is paused, so `ready` offers it again, with a partial-work warning for its re-run.
        Its `max_worker_loss`-th loss (>= 1) fails it instead, with the failure class
        `worker_process_loss`, so a command that kills its own shard cannot loop.
        """
        lost: list[str] = []
        for task_id in self.live_ids():
            rec = self.tasks[task_id]
            if rec.shard != shard or rec.shard_gen == generation or rec.shard_gen in keep:
                continue
            self._lose(task_id, shard, max_worker_loss, now)
            lost.append(task_id)
        return lost

    def settle_moved(
        self,
        shard: str,
        retired: Collection[int],
        generation: int,
        there: Collection[str],
        max_worker_loss: int,
        now: float = 0.0,
    ) -> tuple[list[str], list[str]]:
        """Generations `retired` of `shard` drained and are gone: each live task whose lane ran
        on one of them now runs on `generation` if its lane is in `there` (the lanes that
        generation has, live or with a result in its outbox), else it is lost as in
        `lose_shard`. Returns (moved task ids, lost task ids)."""
        moved: list[str] = []
        lost: list[str] = []
        for task_id in self.live_ids():
            rec = self.tasks[task_id]
            if rec.shard != shard or rec.shard_gen not in retired:
                continue
            if rec.lane in there:
                self.touch(task_id).shard_gen = generation
                moved.append(task_id)
            else:
                self._lose(task_id, shard, max_worker_loss, now)
                lost.append(task_id)
        return moved, lost

    def _lose(self, task_id: str, shard: str, max_worker_loss: int, now: float) -> None:
        """The worker process of task `task_id`'s lane is gone: an infrastructure failure,
        resolved by its strategy (re-acquire by default, capped by `max_worker_loss`); a lane
        that waited for a human keeps waiting, and that is not a loss."""
        rec = self.touch(task_id)
        self.close_attempt(task_id, rec.lane, now, "lost", FailureClass.WORKER_PROCESS_LOSS)
        interrupted = (
            f"partial work: lane {rec.lane} was interrupted when {shard} "
            f"(generation {rec.shard_gen}) was lost"
        )
        if rec.pending is not None and rec.pending.kind == "question":
            self._hold_question(task_id, f"{shard} (generation {rec.shard_gen}) was lost")
            return
        rec.worker_losses += 1
        loss = FailureClass.WORKER_PROCESS_LOSS
        decision = self._decide(task_id, loss, max_worker_loss)
        if decision.action is Action.REACQUIRE:
            self.set_status(task_id, TaskStatus.PAUSED)
            rec.warnings.append(f"{interrupted}; re-running the step")
            rec.lane = rec.shard = rec.shard_gen = None
            return
        if decision.action is Action.ESCALATE and rec.worker_losses >= max_worker_loss:
            self.set_status(task_id, TaskStatus.FAILED)
            rec.failure = loss
            rec.warnings.append(f"{interrupted}; not re-run")
            rec.error = (
                f"worker process lost {rec.worker_losses} times (max_worker_loss = "
                f"{max_worker_loss}); last: {shard} (generation {rec.shard_gen}) exited "
                f"while lane {rec.lane} was running"
            )
            return
        rec.warnings.append(interrupted)
        self.fail(
            task_id,
            loss,
            f"{shard} (generation {rec.shard_gen}) exited while lane {rec.lane} was running",
            now,
            max_worker_loss,
        )
