"""The near name for a mistyped one, for the error that refuses it (`need` -> `needs`)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

CUTOFF = 0.6
"""How alike (difflib's ratio, 0 to 1) a name must be to be offered: 0.6 takes a dropped or
added letter or two (`need`, `watchdog`, `timeout`) and leaves unrelated words alone."""


def did_you_mean(name: object, names: Iterable[str], shown: Callable[[str], str] = repr) -> str:
    """`: did you mean 'needs'?` for the one of `names` closest to `name` (difflib's
    `get_close_matches`, at least `CUTOFF` alike), else the first that `name` begins, or begins
    with, as whole `_`-separated words (`lanes` -> `lanes_per_shard`), written with `shown`
    (default `repr`); "" when none is near or `name` is not a string (a TOML key always is; a
    value that should have been one may not be)."""
    if not isinstance(name, str) or not name:
        return ""
    choices = list(names)
    near = difflib.get_close_matches(name, choices, n=1, cutoff=CUTOFF)
    near = near or [c for c in choices if c.startswith(f"{name}_") or name.startswith(f"{c}_")]
    return f": did you mean {shown(near[0])}?" if near else ""
