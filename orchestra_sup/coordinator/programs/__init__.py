"""The built-in coordinator programs, by the name a plan gives (`coordinator = "NAME"`).

Each is a class over the same seam as any user's program (`coordinator.context`); "dag", the
plan runner itself, is not among them (`coordinator.runner`).
"""

from __future__ import annotations

BUILTINS: dict[str, type] = {}
"""Name -> program class."""
