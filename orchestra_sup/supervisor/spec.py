"""Child specs and child lifecycle states, as validated values (OTP `supervisor:child_spec()`)."""

from __future__ import annotations

import enum

import msgspec

from orchestra_sup.transitions import Transitions


class Restart(enum.StrEnum):
    """When a child is restarted (OTP restart types).

    - `permanent`: always.
    - `transient`: only after an abnormal exit (a non-zero status or a signal).
    - `temporary`: never.
    """

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to run one child.

    `shutdown_s` is the SIGTERM -> SIGKILL grace in seconds; None means `brutal_kill` (SIGKILL at
    once). `capacity` is the lane bound of a shard (0 for other roles); `capabilities` and
    `tenants` are what a shard offers placement (`[shards]` in the config).
    """

    name: str
    role: str
    restart: Restart = Restart.PERMANENT
    shutdown_s: float | None = 5.0
    capacity: int = 0
    capabilities: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()


class ChildState(enum.StrEnum):
    """A child's lifecycle (supervisord `states.py` style).

    starting -> running once its handshake is done; running -> stopping on a requested stop;
    any -> exited when the process is gone; exited -> starting on a restart; exited -> stopped
    when it is not to be restarted. running -> starting is a surge (a shard's rollover): the next
    generation starts while the running process goes on beside it, retiring; if the new one
    never becomes ready, starting -> running again puts the retiring one back.
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    BACKOFF = "backoff"
    STOPPED = "stopped"


ALLOWED: Transitions[ChildState] = Transitions(
    "child",
    {
        ChildState.STOPPED: {ChildState.STARTING},
        ChildState.STARTING: {ChildState.RUNNING, ChildState.STOPPING, ChildState.EXITED},
        ChildState.RUNNING: {ChildState.STOPPING, ChildState.EXITED, ChildState.STARTING},
        ChildState.STOPPING: {ChildState.EXITED},
        ChildState.EXITED: {ChildState.STARTING, ChildState.BACKOFF, ChildState.STOPPED},
        ChildState.BACKOFF: {ChildState.STARTING, ChildState.STOPPED},
    },
)
"""The only transitions `Child.transition` accepts."""
