"""Where a lane goes: eligibility, then score, then a deterministic tie-break (ARCHITECTURE.md §8).

Eligible: the shard is up and has a free lane slot. Score: least loaded. Tie-break: the shard name,
so the same state always gives the same answer.
"""

from __future__ import annotations

import msgspec


class ShardView(msgspec.Struct, kw_only=True):
    """What the coordinator knows of one shard: from the roster, plus its own count of lanes."""

    name: str
    generation: int
    up: bool
    capacity: int
    load: int = 0


def place(shards: list[ShardView]) -> ShardView | None:
    """The shard for the next lane, or None when every shard is down or full."""
    eligible = [s for s in shards if s.up and s.load < s.capacity]
    if not eligible:
        return None
    return min(eligible, key=lambda s: (s.load, s.name))
