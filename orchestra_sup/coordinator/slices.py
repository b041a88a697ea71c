"""Long work on the coordinator's event loop, cut into slices that each hold it a short while.

The coordinator's loop serves every plan and answers the supervisor's watchdog, so no step may
hold it for long (issue 24: skipping the 5,000 dependents of a failed task in one step held it
6.5 s, and the watchdog killed the coordinator again and again). Work over a whole plan (skip a
cascade, build a report of 10,000 tasks) goes through a `Slicer`: the loop is handed back
whenever a slice has run `SLICE_S`, and the work goes on where it was.
"""

from __future__ import annotations

import asyncio
import time

SLICE_S = 0.002
"""How long one slice may hold the event loop before it yields (seconds)."""


class Slicer:
    """Counts the time since the loop was last handed back: `await tick()` after each unit of
    work yields (`asyncio.sleep(0)`) once `slice_s` seconds (default `SLICE_S`) have passed.
    `yields` counts how often it did."""

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self.yields = 0
        self._since = time.monotonic()

    @property
    def spent(self) -> bool:
        """This slice has run its time."""
        return time.monotonic() - self._since >= self.slice_s

    async def tick(self) -> None:
        if self.spent:
            await asyncio.sleep(0)
            self.yields += 1
            self._since = time.monotonic()
