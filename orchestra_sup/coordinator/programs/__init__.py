"""The built-in coordinator programs: a plan names one with `coordinator = "NAME"` and gives its
args in `[args]` (README: "Coordinator programs").

Each is a short class over the program contract alone (`coordinator.context`: built with the
args, `async def run(self, ctx)`), so it is what a platform's own program could be. Each
checks its args in `__init__` (`ValueError` naming the arg), checkpoints after every round so a
restarted session does not redo a finished one, and says its args, rounds and result in its
module's docstring:

- `fanout` (`programs.fanout`): a lane per command of `runs`, then a `reduce` lane fed all
  their outputs.
- `refine` (`programs.refine`): `run`, judged by `check`, again with the check's output as
  feedback until it passes or `max_rounds` or the budget end.
- `bisect` (`programs.bisect`): the first revision between `good` and `bad` at which `check`
  fails, testing `parallel` revisions per round (k-ary bisection).

`dag`, the plan's own task graph and the default, is the plan runner itself
(`coordinator.runner`), not a program.
"""

from __future__ import annotations

from orchestra_sup.coordinator.programs.bisect import Bisect
from orchestra_sup.coordinator.programs.fanout import Fanout
from orchestra_sup.coordinator.programs.refine import Refine

__all__ = ["BUILTINS"]

BUILTINS: dict[str, type] = {"fanout": Fanout, "refine": Refine, "bisect": Bisect}
"""Each built-in program's class by the name a plan's `coordinator` gives
(`protocol.patterns.BUILTIN_COORDINATORS`, but for "dag")."""
