"""A plan's progress, kept in step with its tasks' statuses: what is ready, what must be skipped,
how many tasks are left, which lanes are live, without a scan of the plan.

`PlanRecord` (coordinator/runner.py) holds one `Progress`, derived from its spec and its task
statuses (never stored: it is rebuilt from them when a record is loaded), and tells it of every
status change (`move`, from the record's one status writer). Each change costs the changed task's
dependents when it enters or leaves a final status, and O(log n) otherwise, so a whole plan costs
O(tasks + edges) however it runs: a chain of 10,000 tasks listed goal first, whose first task
fails, is skipped in 10,000 steps, not 10,000 passes over the plan (issue 24).

Tasks are named by their position in file order (0-based). Kept:

- `dependents[i]`: the positions of the tasks that need task i (each once);
- `unmet[i]`: needs of task i that have not succeeded; `bad[i]`: needs that ended otherwise
  (failed, skipped, cancelled);
- `ready`: the waiting tasks (pending, paused, interrupted) with no unmet need, in file order: the
  candidates to place (a backoff or a missing approval may still hold one back);
- `blocked`: pending tasks with a need that did not succeed, to skip (a heap, in file order; an
  entry whose task moved on since is passed over when popped);
- `fresh`: candidates that ask for approval (`approve = true`) and entered `ready` since it was
  last drained, for `PlanRecord.hold_for_approval`;
- `live`: starting and running tasks; `counts`: tasks per status;
- `backoff`: tasks whose `retry_at` may be set, `holding`: tasks that may have an attempt that has
  not ended (both pruned by their readers);
- `work`: how many units of work (a dependent visited, a ready entry examined) it has done, so
  tests can show the cost is linear without timing anything.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterator, Sequence

from orchestra_sup.coordinator.status import FINAL, LIVE, UNSUCCESSFUL, WAITING, TaskStatus
from orchestra_sup.protocol.frames import TaskSpec

_PENDING, _SUCCEEDED = TaskStatus.PENDING, TaskStatus.SUCCEEDED


class Progress:
    """See the module docstring. Built from the plan's tasks in file order and their
    statuses."""

    def __init__(self, specs: Sequence[TaskSpec], statuses: Sequence[TaskStatus]) -> None:
        self.work = 0
        n = len(specs)
        self.position = where = {spec.id: i for i, spec in enumerate(specs)}
        self.approve = [spec.approve for spec in specs]
        self.status = status = list(statuses)
        building: list[list[int]] = [[] for _ in range(n)]
        self.unmet = [0] * n
        self.bad = [0] * n
        unmet, bad = self.unmet, self.bad
        for i, spec in enumerate(specs):
            needs = [where[d] for d in spec.needs if d in where]
            if len(set(needs)) < len(needs):
                needs = list(dict.fromkeys(needs))
            for d in needs:
                building[d].append(i)
                if status[d] is not _SUCCEEDED:
                    unmet[i] += 1
                    bad[i] += status[d] in UNSUCCESSFUL
        # tuples of ints: the cyclic GC stops tracking them, and a plan of 10,000 tasks is
        # 10,000 fewer objects for every full collection to walk
        self.dependents: list[tuple[int, ...]] = [tuple(d) for d in building]
        self.counts = Counter(status)
        self.live = {i for i, s in enumerate(status) if s in LIVE}
        self.ready = [i for i in range(n) if not unmet[i] and status[i] in WAITING]
        self._in_ready = bytearray(n)
        for i in self.ready:
            self._in_ready[i] = 1
        self.fresh = [i for i in self.ready if self.approve[i]]
        self.blocked = [i for i in range(n) if bad[i] and status[i] is _PENDING]
        self.backoff: set[int] = set()
        self.holding: set[int] = set()

    def __len__(self) -> int:
        return len(self.status)

    @property
    def final(self) -> int:
        """Tasks in a final status."""
        return sum(self.counts[s] for s in FINAL)

    @property
    def done(self) -> bool:
        return self.final == len(self.status)

    def move(self, i: int, new: TaskStatus) -> None:
        """Task `i` changes to status `new`: update every figure that depends on it."""
        old = self.status[i]
        if old == new:
            return
        self.status[i] = new
        self.counts[old] -= 1
        self.counts[new] += 1
        if new in LIVE:
            self.live.add(i)
        elif old in LIVE:
            self.live.discard(i)
        ok = (new == _SUCCEEDED) - (old == _SUCCEEDED)
        bad = (new in UNSUCCESSFUL) - (old in UNSUCCESSFUL)
        dependents = self.dependents[i]
        if ok or bad:
            self.work += len(dependents)
        if ok:
            unmet = self.unmet
            for d in dependents:
                unmet[d] -= ok
                self._place(d)
        if bad:
            counts, status = self.bad, self.status
            for d in dependents:
                counts[d] += bad
            if bad > 0:
                self._block([d for d in dependents if status[d] is _PENDING])
        self._place(i)
        if new == _PENDING and self.bad[i]:
            self._block([i])

    def _block(self, new: list[int]) -> None:
        """Add `new` to the `blocked` heap: one push each, or, when there are many, all at once
        and the heap made again (linear in its size, so only when that is at most 8 x theirs)."""
        blocked = self.blocked
        if len(new) * 8 < len(blocked):
            self.work += len(new)
            for d in new:
                heapq.heappush(blocked, d)
        else:
            self.work += len(new) + len(blocked)
            blocked.extend(new)
            heapq.heapify(blocked)

    def _place(self, i: int) -> None:
        """Put task `i` in `ready` or take it out, as its status and needs now say."""
        want = self.status[i] in WAITING and not self.unmet[i]
        if want == bool(self._in_ready[i]):
            return
        self._in_ready[i] = want
        if want:
            bisect.insort(self.ready, i)
            if self.approve[i]:
                self.fresh.append(i)
        else:
            del self.ready[bisect.bisect_left(self.ready, i)]

    def is_ready(self, i: int) -> bool:
        return bool(self._in_ready[i])

    def candidates(self) -> Iterator[int]:
        """The positions in `ready`, in file order, read as they are at each step: a task that
        leaves `ready` meanwhile is not given, one that enters after the point reached is."""
        last = -1
        ready = self.ready
        while True:
            k = bisect.bisect_right(ready, last)
            if k == len(ready):
                return
            self.work += 1
            last = ready[k]
            yield last

    def next_blocked(self) -> int | None:
        """The first task in file order that is pending with a need that did not succeed (taken
        off `blocked`), or None when there is none."""
        while self.blocked:
            self.work += 1
            i = heapq.heappop(self.blocked)
            if self.status[i] == _PENDING and self.bad[i]:
                return i
        return None

    def drain_fresh(self) -> list[int]:
        """The approval-asking candidates that entered `ready` since the last call, in file
        order, each once (only those still in `ready`)."""
        fresh, self.fresh = self.fresh, []
        self.work += len(fresh)
        return sorted({i for i in fresh if self._in_ready[i]})
