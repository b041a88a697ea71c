"""`ctl status`, `ctl tree`, `ctl lanes` and `ctl top`: what the tree and its lanes are doing."""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Annotated

import typer

from orchestra_sup.cli import interrupt, render
from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import guarded
from orchestra_sup.cli.output import TTY, discard_stdout, out, screen
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes


@ctl_options(wide=True)
def status(ctl: CtlCommand) -> None:
    """Show the supervisor and every child. Answered by the supervisor itself. A narrow
    terminal leaves the least needed columns out (and says which); --wide shows them all.

    Example: orchestra-sup ctl status --json
    """
    ctl.show(
        f.StatusReply,
        f.CtlStatus(),
        json=shapes.status_json,
        table=lambda reply: render.status_table(reply, *ctl.screen()),
    )


@ctl_options()
def tree(ctl: CtlCommand) -> None:
    """Print the supervision tree: supervisors with their strategy and intensity, and children.

    Example: orchestra-sup ctl tree
    """
    ctl.show(
        f.StatusReply,
        f.CtlStatus(),
        json=shapes.tree_json,
        table=lambda reply: render.tree_text(reply, out),
    )


@ctl_options(wide=True)
def lanes(ctl: CtlCommand) -> None:
    """List live lanes on every shard, and every task that waits for a human (state
    awaiting_approval: how long it has waited and its question; --json has the whole question
    and `since`, Unix seconds). --wide adds what a narrow terminal leaves out (the sandbox).

    Example: orchestra-sup ctl lanes --json
    """

    def table(reply: f.LaneList) -> None:
        console, width = ctl.screen()
        render.lanes_table(reply, console, width=width, command=ctl.command())

    ctl.show(f.LaneList, f.CtlLanes(), json=shapes.lanes_json, table=table)


@ctl_options(
    2.0,
    json_option=Annotated[
        bool,
        typer.Option(
            "--json",
            help='One {"status", "lanes", "error"} object per refresh, one per line (ndjson); '
            "with --once just one.",
        ),
    ],
    timeout_option=Annotated[
        float,
        typer.Option(
            "--timeout", min=0.1, help="Seconds one refresh waits for the tree (status and lanes)."
        ),
    ],
)
def top(
    ctl: CtlCommand,
    interval: Annotated[
        float,
        typer.Option("--interval", min=0.1, max=3600, help="Seconds between refreshes."),
    ] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (also when piped).")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="With --once (or piped): every column, lines unwrapped.")
    ] = False,
) -> None:
    """A live view of the tree: every child's pid, generation, state, uptime, restarts, loop lag
    and relay latency (p50/p99 ms), lanes by state, inbox and persistence queue depths; the
    supervisor's loop lag, isolation, rollover and metrics URL; the live lanes.

    q or Ctrl-C quits (exit 0), the terminal restored. Piped, or with --once, one frame is
    printed. With --json, one JSON object per refresh on a line of its own until Ctrl-C (or q
    at a terminal); with --json --once, one. No tree at the first refresh: exit 3 and one line.
    Once shown, a tree that stops answering is shown as unreachable and asked again every
    interval (in --json: a line with "error" set and "status" and "lanes" null).
    Example: orchestra-sup ctl top --interval 0.5
    """
    from orchestra_sup.cli.top import Keys, Watcher, frame_json, run_json, run_live, view

    def ask(body: f.Body, seconds: float) -> f.Body:
        with ctl.client() as client:
            return client.request(body, timeout_s=seconds)

    watcher = Watcher(ask, ctl.timeout)
    first = guarded(watcher.poll_or_raise)  # no tree at all: one line, exit 3, like status
    if once or (not ctl.as_json and not TTY):
        if ctl.as_json:
            sys.stdout.write(json.dumps(frame_json(first)) + "\n")
        else:
            console, width = screen(wide)
            console.print(view(first, time.time(), "", width, ctl.command()))
        return
    # SIGTERM (a closing terminal, `kill`) unwinds like Ctrl-C: the terminal is given back
    signal.signal(signal.SIGTERM, interrupt.unwind)
    try:
        with Keys(sys.stdin.fileno() if sys.stdin is not None else -1) as keys:
            if ctl.as_json:
                run_json(watcher, first, sys.stdout, keys, interval)
            else:
                run_live(watcher, first, out, keys, interval, ctl.command())
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `ctl top --json | head -3`: the reader has all it wanted
        discard_stdout()
