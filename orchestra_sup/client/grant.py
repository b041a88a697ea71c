"""What a human's approval may add to a task's budget (`ctl approve --grant`, `Client.approve`)."""

from __future__ import annotations

import math

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f

GRANT_KEYS = {"wall_s": float, "cpu_s": float, "output_bytes": int}
"""What `--grant` may add to, in `frames.Budget`'s units: seconds, seconds, bytes."""


def parse_grant(text: str) -> f.Budget:
    """`wall_s=60,cpu_s=10,output_bytes=1000000` -> `Budget`: each key of `GRANT_KEYS` at most
    once, each value a positive finite number (an integer for `output_bytes`).
    Raises `ConfigError` naming the item and what is wrong with it."""
    values: dict[str, float | int] = {}
    for item in text.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ConfigError(f"--grant {item.strip()!r}: expected KEY=VALUE")
        kind = GRANT_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"--grant: unknown key {key!r} (known: {', '.join(GRANT_KEYS)})")
        if key in values:
            raise ConfigError(f"--grant: {key} given twice")
        unit = "an integer" if kind is int else "a number"
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"--grant {key}={raw!r}: expected {unit}") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--grant {key}={raw}: must be positive and finite")
        values[key] = value
    return f.Budget(**values)
