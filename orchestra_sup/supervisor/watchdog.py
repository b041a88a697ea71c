"""The root's watchdog: a running child whose heartbeats stopped is SIGKILLed, and restarted
under its restart strategy like any child that died (ExitCause.WATCHDOG)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from orchestra_sup.supervisor.children import Children
from orchestra_sup.supervisor.colocated import ColocatedSeam
from orchestra_sup.supervisor.core import ExitCause
from orchestra_sup.supervisor.seam import ProcessSeam
from orchestra_sup.supervisor.spec import ChildState

log = logging.getLogger("orchestra_sup.supervisor")


async def watchdog(
    children: Children, seam: ProcessSeam | ColocatedSeam, watchdog_s: Callable[[], float]
) -> None:
    """SIGKILL a running child whose heartbeats stopped for `watchdog_s()` seconds (read at
    each look: a config reload may change it), until cancelled. Silence is only the child's
    fault if this loop was there to hear it: when the watchdog itself wakes more than half of
    `watchdog_s` late (the supervisor was stopped, swapped out, its VM paused), every child's
    silence is forgiven from now, instead of every child being killed for the supervisor's own
    stall."""
    while True:
        limit = watchdog_s()
        period = min(1.0, limit / 4)
        asked = time.monotonic()
        await asyncio.sleep(period)
        now = time.monotonic()
        if now - asked - period > limit / 2:
            log.warning("supervisor loop stalled %.1f s; children's silence forgiven", now - asked)
            for live in children.liveness.values():
                live.last_beat = max(live.last_beat, now)
            continue
        for worker in children.workers:
            silent = now - children.liveness[worker.name].last_beat
            if worker.state is ChildState.RUNNING and silent > limit:
                log.error(
                    "child %s gen=%d silent for %.1f s (watchdog %g s); killing",
                    worker.name,
                    worker.generation,
                    silent,
                    limit,
                )
                worker.killed_for = ExitCause.WATCHDOG
                seam.signal(worker, signal.SIGKILL)
