"""`ctl events`: the tree's event log, printed once or followed (`client.events`)."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import msgspec
import typer

from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_INTERRUPTED, fail, guarded
from orchestra_sup.cli.output import discard_stdout
from orchestra_sup.errors import TreeUnreachable
from orchestra_sup.protocol import frames as f


def event_line(event: f.Event) -> str:
    """One event for people: seq, local time, source, kind, what it concerns, who, detail."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
    what = " ".join(
        f"{name}={value}"
        for name, value in (
            ("plan", event.plan),
            ("task", event.task),
            ("lane", event.lane),
            ("child", event.child),
            ("by", event.who),
        )
        if value
    )
    detail = f"  {event.detail}" if event.detail else ""
    return f"{event.seq:>8} {when} {event.source:<12} {event.kind:<24} {what}{detail}".rstrip()


@ctl_options(
    json_option=Annotated[
        bool,
        typer.Option(
            "--json",
            help='One object per event and line: {"seq", "at", "source", "kind", "plan", ...}.',
        ),
    ],
)
def events(
    ctl: CtlCommand,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Go on printing events as they come.")
    ] = False,
    since: Annotated[
        int,
        typer.Option(
            "--since", min=0, max=f.MAX_SEQ, help="Only events after this seq (0: every one kept)."
        ),
    ] = 0,
    plan: Annotated[str, typer.Option("--plan", help="Only the events of this plan.")] = "",
) -> None:
    """Print the tree's event log, oldest first: children's starts, exits, restarts and
    escalations; rollovers and reloads; plans and their tasks' moves, lanes placed, paused and
    fenced; humans' answers, with who gave them (stamped by the tree); budget and quota
    refusals; retention runs. Each event has a sequence number (seq) of the log's own: run again
    with --since SEQ, the last one printed, and nothing is missed or repeated, across restarts
    of the tree. Events older than \\[retention] events_s are gone.

    --follow waits for more, through a supervisor's re-exec or restart (for up to a minute of
    silence; then exit 3). Ctrl-C exits 130.
    Example: orchestra-sup ctl events --follow --since 1200 --json
    """
    from orchestra_sup.client.events import read_events

    def go() -> None:
        def gap(first: int, last: int) -> None:
            print(
                f"orchestra-sup: events {first}..{last} were trimmed ([retention] events_s) "
                "before they were read",
                file=sys.stderr,
                flush=True,
            )

        last = since
        events = read_events(
            ctl.client, since=since, plan=plan, follow=follow, timeout_s=ctl.timeout, on_gap=gap
        )
        try:
            for event in events:
                last = event.seq
                show(event)
        except TreeUnreachable as exc:
            resume = f"; resume with --since {last}" if follow else ""
            raise TreeUnreachable(f"{exc}{resume}") from None
        sys.stdout.flush()

    def show(event: f.Event) -> None:
        if ctl.as_json:
            print(json.dumps(msgspec.to_builtins(event)), flush=follow)
        else:
            print(event_line(event), flush=follow)

    try:
        guarded(go)
    except KeyboardInterrupt:
        raise fail("interrupted", EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # `ctl events | head`: the reader has all it wanted
        discard_stdout()
        raise typer.Exit(0) from None
