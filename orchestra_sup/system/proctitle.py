"""Process titles: what `ps`, `top` and `pgrep -f` show for each process of the tree.

    orchestra-sup: supervisor children=5/5      running children / children
    orchestra-sup: coordinator gen=2 plans=1    plans not done
    orchestra-sup: custodian gen=1
    orchestra-sup: shard-1 gen=3 lanes=5/8      lanes hosted / lanes_per_shard

A title is set with setproctitle, which writes it over the process's command line (and its
environment block, which `/proc/PID/environ` then no longer shows) and makes
`/proc/PID/comm` its first 15 bytes, `orchestra-sup: `. It is kept current by its owner
calling `ProcTitle.show` when a figure may have changed; `show` writes only a title that
differs from the one shown, so calling it is a string comparison otherwise.

Without setproctitle (not importable: a platform without a wheel, a broken install) a
process keeps its command line as its title, says so once at debug level, and runs as
usual: a title is for the operator's eyes and never worth failing the tree for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

PREFIX = "orchestra-sup: "

_setproctitle: Callable[[str], None] | None
try:
    from setproctitle import setproctitle as _setproctitle
except ImportError:
    _setproctitle = None


def supervisor_title(running: int, total: int) -> str:
    """The root supervisor's title: `running` of its `total` children are running."""
    return f"{PREFIX}supervisor children={running}/{total}"


def child_title(name: str, role: str, generation: int, load: int, capacity: int) -> str:
    """A child's title. `load` is its role's `load()`: a shard's lanes (shown against
    `capacity`, its lanes_per_shard), the coordinator's plans not done; a custodian shows none
    (its figure, requests in flight, changes with every request)."""
    figure = {"shard": f" lanes={load}/{capacity}", "coordinator": f" plans={load}"}
    return f"{PREFIX}{name} gen={generation}{figure.get(role, '')}"


class ProcTitle:
    """This process's title. One per process: a colocated component, which shares the
    supervisor's process, has none."""

    def __init__(self) -> None:
        self.shown: str | None = None
        """The title last shown (None: none yet, the command line stands)."""
        if _setproctitle is None:
            log.debug("setproctitle cannot be imported: the process title stays its command line")

    def show(self, title: str) -> None:
        """Make `title` this process's title, unless it already is."""
        if title == self.shown:
            return
        self.shown = title
        if _setproctitle is not None:
            _setproctitle(title)
