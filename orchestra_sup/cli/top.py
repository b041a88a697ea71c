"""`orchestra-sup ctl top`: a live view of a running tree, refreshed every interval.

One refresh (`Watcher.poll`) asks the supervisor for `CtlStatus` (answered from its control
record, never waiting on a child) and then `CtlLanes` (fanned out to the shards; one that does not
answer is named in `unanswered`, not waited for past the refresh's deadline), both under one
deadline of `timeout_s` seconds. What it got is a `Frame`; what a frame looks like (`view`, rich
renderables for people; `frame_json`, one JSON object for programs) is a pure function of it, so
it is tested without a tree or a terminal.

When the tree stops answering after it has answered once, the frame carries the error and the
last answers with their age, and the next refresh tries again: an operator watching a supervisor
re-execute itself, or a restart, sees it come back. The first refresh failing is the caller's to
report (`ctl top` exits 3 as every ctl command does).

The terminal (`Keys`): while the view runs, stdin (when it is the controlling terminal and this
process is in its foreground) is in cbreak mode so a single `q` quits without Enter; Ctrl-C still
raises SIGINT (cbreak leaves ISIG on). The mode is put back on the way out however the view ends.
"""

from __future__ import annotations

import json
import os
import select
import termios
import time
import tty
from collections.abc import Callable
from typing import IO, Any

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from orchestra_sup.cli import render
from orchestra_sup.cli.columns import Field, Fitted, dropped_line, fit, pack
from orchestra_sup.errors import RemoteError, TreeUnreachable
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes

QUIT_KEYS = b"qQ"
"""Keys that end the interactive view (as in top(1) and less(1))."""
MIN_LANES_WAIT_S = 0.1
"""The least a refresh gives `CtlLanes` when `CtlStatus` used up most of its deadline."""


class Frame(msgspec.Struct, frozen=True, kw_only=True):
    """What one refresh knows. `status` and `lanes` are the latest answers (None before the
    first); `error` is why this refresh got none (the tree went away, did not answer in time),
    and then `age_s` is how long ago, in seconds, the answers shown were received."""

    status: f.StatusReply | None
    lanes: f.LaneList | None
    error: str | None = None
    age_s: float = 0.0


Ask = Callable[[f.Body, float], f.Body]
"""Send a ctl request, wait at most the given seconds, return the reply body; raises
`TreeUnreachable` (no tree, no answer in time) or `RemoteError` (an `Error` reply)."""


class Watcher:
    """Refreshes a `Frame` with `ask`, keeping the last answers across failures.

    `timeout_s` (seconds) bounds one `poll`: status and lanes share that deadline. `clock` is a
    monotonic clock in seconds (injected for tests)."""

    def __init__(
        self, ask: Ask, timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ask = ask
        self.timeout_s = timeout_s
        self.clock = clock
        self.last: Frame = Frame(status=None, lanes=None)
        self.answered_at: float | None = None

    def poll(self) -> Frame:
        """One refresh. Never raises for an unreachable tree or an error reply: the frame says
        so (`Frame.error`), with the last answers and their age."""
        try:
            return self.poll_or_raise()
        except (TreeUnreachable, RemoteError) as exc:
            age = 0.0 if self.answered_at is None else self.clock() - self.answered_at
            return msgspec.structs.replace(self.last, error=str(exc), age_s=age)

    def poll_or_raise(self) -> Frame:
        """One refresh; raises what `ask` raises (`TreeUnreachable`, `RemoteError`)."""
        start = self.clock()
        status = self.ask(f.CtlStatus(), self.timeout_s)
        assert isinstance(status, f.StatusReply)
        left = max(MIN_LANES_WAIT_S, start + self.timeout_s - self.clock())
        lanes = self.ask(f.CtlLanes(), left)
        assert isinstance(lanes, f.LaneList)
        self.answered_at = self.clock()
        self.last = Frame(status=status, lanes=lanes)
        return self.last


# --- how a frame looks ---------------------------------------------------------------------------


def frame_json(frame: Frame) -> dict[str, Any]:
    """One refresh for programs: {"status": `shapes.status_json` or null, "lanes":
    `shapes.lanes_json` or null, "error": null or the one-line reason}. A frame with an error
    carries no status or lanes: old answers are not passed off as current ones."""
    if frame.error is not None:
        return {"status": None, "lanes": None, "error": frame.error}
    return {
        "status": None if frame.status is None else shapes.status_json(frame.status),
        "lanes": None if frame.lanes is None else shapes.lanes_json(frame.lanes),
        "error": None,
    }


def view(
    frame: Frame,
    now: float,
    header: str = "",
    width: int | None = None,
    command: str = render.CTL,
) -> Group:
    """The whole screen, `width` columns wide (None: unbounded, every column): `header`, the
    supervisor's lines, the error (if any), the processes, then the lanes (with how to answer
    a pause: `command` is the ctl command that reaches the tree). `now` is the wall clock
    (Unix seconds) for how long lanes have waited.

    The header (how to quit) comes first: a screen taller than the terminal is cut at the
    bottom, and what is cut must never be how to leave."""
    parts: list[RenderableType] = []
    if header:
        parts.append(Text(header, style="dim"))
    if frame.status is not None:
        parts.extend(supervisor_lines(frame.status, width))
    if frame.error is not None:
        shown = "nothing shown yet" if frame.status is None else f"shown: {frame.age_s:.0f} s old"
        parts.append(Text(f"unreachable: {frame.error} (retrying; {shown})", style="bold red"))
    if frame.status is not None:
        fitted = processes_table(frame.status, width)
        parts.append(fitted.table)
        if fitted.dropped:
            parts.append(Text(dropped_line(fitted.dropped, render.WIDE_HINT), style="dim"))
    if frame.lanes is not None:
        parts.append(render.lanes_view(frame.lanes, now, width, command))
    return Group(*parts)


def supervisor_lines(status: f.StatusReply, width: int | None = None) -> list[Text]:
    """The supervisor: pid, version, loop lag p50/p99 (ms), isolation and run directory, packed
    on as few lines of `width` as they fit (`columns.pack`); then the rollover in progress and
    the metrics URL, each on a line of its own when there is one."""
    p50, p99, _ = status.loop_lag_ms
    facts = [
        f"orchestra-sup {status.version}",
        f"supervisor pid {status.supervisor_pid}",
        f"loop lag p50/p99 {p50:.1f}/{p99:.1f} ms",
        f"isolation {status.isolation or '-'}",
        f"run dir {status.run_dir}",
    ]
    lines = [Text(line) for line in pack(facts, width)]
    if status.rollover is not None:
        lines.append(Text(f"rollover: {status.rollover}", style="yellow"))
    if status.metrics_url:
        lines.append(Text(f"metrics: {status.metrics_url}"))
    return lines


PROCESS_FIELDS = (
    Field("name"),
    Field("pid", right=True),
    Field("gen", rank=1, right=True),
    Field("state"),
    Field("uptime", rank=2, right=True),
    Field("restarts", rank=1, right=True),
    Field("loop lag ms p50/p99", rank=2, right=True),
    Field("relay ms p50/p99", rank=3, right=True),
    Field("lanes", rank=1, squeeze=20),
    Field("inbox", rank=3, right=True),
    Field("persist q", rank=4, right=True),
)
"""`ctl top`'s process columns in table order, each with the rank it is dropped by when the
terminal is too narrow (`columns.fit`): the persistence queue first (4), then relay latency
and inbox depth (3), uptime and loop lag (2), generation, restarts and lanes (1); name, pid and
state (0) always stay."""


def processes_table(status: f.StatusReply, width: int | None = None) -> Fitted:
    """One row per child, fitted to `width` columns (None: every column). Figures a child has
    not reported (no heartbeat yet, a role that has no relay, inbox or lanes) are "-"."""
    rows = [
        [
            c.name,
            str(c.pid or "-"),
            str(c.generation),
            c.state,
            render.waited(c.uptime_s) if c.pid is not None else "-",
            str(c.restarts),
            _p50_p99(c.loop_lag_ms),
            _p50_p99(c.relay_ms),
            lanes_by_state(c.lanes),
            "-" if c.inbox_depth is None else str(c.inbox_depth),
            str(c.persist_depth) if c.pid is not None else "-",
        ]
        for c in status.children
    ]
    return fit(PROCESS_FIELDS, rows, width)


def lanes_by_state(counts: dict[str, int]) -> str:
    """{"running": 3, "awaiting_approval": 1, "starting": 0} -> "1 awaiting_approval, 3 running"
    (states with no lane left out, so a row stays one line); all zero -> "0"; {} -> "-"."""
    if not counts:
        return "-"
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if n) or "0"


def _p50_p99(figures: tuple[float, float, float] | None) -> str:
    return "-" if figures is None else f"{figures[0]:.1f}/{figures[1]:.1f}"


# --- the terminal --------------------------------------------------------------------------------


class Keys:
    """Keypresses from the terminal on `fd`, read one at a time (cbreak) while in the block.

    Used only when `fd` is a terminal and this process is in its foreground process group (a
    background job changing the mode would be stopped by SIGTTOU); otherwise nothing is read and
    `quit_within` just waits. On exit the terminal's attributes are set back to what they were,
    whatever ended the block (q, SIGINT's KeyboardInterrupt, an error)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd if _foreground_tty(fd) else None
        self.saved: list[Any] | None = None

    def __enter__(self) -> Keys:
        if self.fd is not None:
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def quit_within(self, seconds: float) -> bool:
        """Wait `seconds`; True as soon as a quit key (`QUIT_KEYS`) is pressed. Other keys are
        read and ignored. Without a terminal to read, waits the whole time (the refresh period,
        not a synchronisation) and returns False."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.fd is None:
                time.sleep(left)
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                data = os.read(self.fd, 64)
                if not data:  # the terminal hung up: nothing will ever be typed again
                    self.fd = None
                elif any(k in data for k in QUIT_KEYS):
                    return True
        return False


def _foreground_tty(fd: int) -> bool:
    try:
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # no controlling terminal
        return False


def run_live(
    watcher: Watcher,
    first: Frame,
    console: Console,
    keys: Keys,
    interval_s: float,
    command: str = render.CTL,
) -> None:
    """The interactive view on `console`'s alternate screen: `first`, then a refresh every
    `interval_s` seconds (plus the time a refresh takes, at most the watcher's timeout) until a
    quit key. Ctrl-C raises KeyboardInterrupt out of it, the screen restored. `command`: as
    `view`."""
    header = f"every {interval_s:g} s; q or Ctrl-C quits"
    frame = first
    with Live(console=console, screen=True, auto_refresh=False) as live:
        while True:  # the terminal's width read again each time: it may have been resized
            live.update(view(frame, time.time(), header, console.width, command), refresh=True)
            if keys.quit_within(interval_s):
                return
            frame = watcher.poll()


def run_json(watcher: Watcher, first: Frame, out: IO[str], keys: Keys, interval_s: float) -> None:
    """`frame_json` of `first`, then of a refresh every `interval_s` seconds, one object per line
    on `out` (flushed each time, for a reader that follows it), until a quit key. Ctrl-C raises
    KeyboardInterrupt out of it; a reader gone raises BrokenPipeError."""
    frame = first
    while True:
        out.write(json.dumps(frame_json(frame)) + "\n")
        out.flush()
        if keys.quit_within(interval_s):
            return
        frame = watcher.poll()
