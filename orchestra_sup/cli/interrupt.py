"""SIGINT and SIGTERM unwinding a command like Ctrl-C, so what it holds (a private tree, the
terminal) is given back on the way out."""

from __future__ import annotations

_interrupted = False
"""Set by `unwind`: an error that follows it (the tree `run` stopped going away mid-call) is the
interruption, not a failure of its own."""


def unwind(signum: int, frame: object) -> None:
    """A signal handler: note the interruption and raise `KeyboardInterrupt`."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether `unwind` has run in this process."""
    return _interrupted
