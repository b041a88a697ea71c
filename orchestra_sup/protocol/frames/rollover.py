"""Rollover: ctl -> supervisor (`ctl rollover`, ARCHITECTURE.md §9) (`Rollover`).

What the supervisor tells the children while it rolls them over is on the control channel
(`control.Quiesce`, `control.Drain`) and the lane plane (`lanes.LaneResume`).
"""

from __future__ import annotations

import msgspec

from orchestra_sup.protocol.frames.frame import Frame


class ReleaseInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a release says of itself (`python -m orchestra_sup.release`): the interpreter,
    the orchestra-sup version it has installed, and the protocol range it speaks."""

    python: str
    version: str
    proto_min: int
    proto_max: int


class CtlRollover(Frame, tag="ctl_rollover"):
    """`ctl rollover NAME --release PYTHON`: NAME is a child, `shards` or `all`; `release` is an
    interpreter path ("" = the supervisor's own); `drain_timeout_s` None = the configured one.
    Answered with the first `RolloverReport` (the release was accepted, nothing moved yet), or an
    `Error` when it is refused before anything moves."""

    name: str
    release: str = ""
    drain_timeout_s: float | None = None


class CtlRolloverStatus(Frame, tag="ctl_rollover_status"):
    """Events of rollover `id` after `after_seq`; with `wait_s` > 0 held until there is one or
    the rollover is done (a long poll)."""

    id: str
    after_seq: int = -1
    wait_s: float = 0.0


class RolloverEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a rollover: `at_s` seconds since it began, `child` what moved ("" for the
    whole), `text` one line, `took_s` the step's own duration in seconds (None: not a step)."""

    seq: int
    at_s: float
    child: str
    text: str
    took_s: float | None = None


class RolloverReport(Frame, tag="rollover_report"):
    """A rollover and its events after the asked `after_seq`. `ok` is None until `done`; then
    true when everything moved, false when it rolled back or stopped (`error` says why)."""

    id: str
    target: str
    release: ReleaseInfo
    done: bool
    ok: bool | None
    events: list[RolloverEvent]
    error: str | None = None
    reexecuting: bool = False
    """The supervisor is about to re-execute itself: a poll sent now may be lost in the exec,
    so ask again soon rather than wait out a long poll."""


Rollover = CtlRollover | CtlRolloverStatus | RolloverReport
