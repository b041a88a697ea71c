"""One line of `orchestra-sup doctor`: a layer this machine offers or not, and why."""

from __future__ import annotations

import msgspec


class Layer(msgspec.Struct, frozen=True, kw_only=True):
    """One layer: `name`, whether it is `available` here, `detail` (where it is, or why not)
    and whether orchestra-sup `uses` it in the mode "auto" picks (False for a layer it does not
    apply yet, such as Landlock)."""

    name: str
    available: bool
    detail: str
    used: bool
