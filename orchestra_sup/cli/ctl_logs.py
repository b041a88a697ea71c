"""`ctl logs`: a lane's transcript, printed once or followed."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_INTERRUPTED, fail, guarded
from orchestra_sup.cli.output import discard_stdout


@ctl_options(
    json_option=Annotated[
        bool,
        typer.Option("--json", help='One object per row: {"seq", "ts", "stream", "data", "lane"}.'),
    ],
)
def logs(
    ctl: CtlCommand,
    lane: Annotated[str, typer.Argument(help="The lane id (see `ctl lanes`, `ctl plan --json`).")],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Print rows as they come until the lane (or its task) ends."
        ),
    ] = False,
) -> None:
    """Print a lane's transcript: its output (stdout to stdout, stderr to stderr) and its events
    (`# event: ...` lines on stderr), or with --json one object per row on stdout.

    Works for running and finished lanes (kept for \\[retention] transcripts_s). --follow
    goes on to the task's next lane when its shard was restarted or lost, exits 0 when the
    lane ends otherwise, 3 when the tree goes away first; Ctrl-C exits 130; an unknown lane
    exits 2.
    Example: orchestra-sup ctl logs 3f2a9c1b7d44-build-1 --follow
    """
    from orchestra_sup.cli.follow import LogSink, show_logs

    sink = LogSink(ctl.as_json, sys.stdout, sys.stderr)

    def go() -> None:
        with ctl.client() as client:
            show_logs(client, lane, sink, follow=follow, timeout_s=ctl.timeout)

    try:
        guarded(go)
    except KeyboardInterrupt:
        raise fail("interrupted", EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # `ctl logs LANE | head`: the reader has all it wanted
        discard_stdout()
        raise typer.Exit(0) from None
