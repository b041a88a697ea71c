"""`ctl approve`, `ctl reject`, `ctl redirect` and `ctl accept-partial`: a human's answer to a
task that waits for one."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestra_sup.cli import render
from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_USAGE, fail, guarded
from orchestra_sup.cli.options import LaneArg
from orchestra_sup.cli.output import out
from orchestra_sup.client.grant import parse_grant
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes


def _required_text(option: str, text: str) -> str:
    if not text.strip():
        raise fail(f"{option} must not be empty", EXIT_USAGE)
    return text


def _respond(ctl: CtlCommand, ask: f.CtlRespond) -> None:
    ctl.show(
        f.HitlRecorded,
        ask,
        json=shapes.recorded_json,
        table=lambda reply: out.print(render.recorded_line(reply)),
    )


@ctl_options()
def approve(
    ctl: CtlCommand,
    lane: LaneArg,
    grant: Annotated[
        str | None,
        typer.Option(
            "--grant",
            metavar="KEY=VALUE,...",
            help="Add to the task's budget: wall_s and cpu_s (seconds), output_bytes (bytes).",
        ),
    ] = None,
    retries: Annotated[
        int,
        typer.Option("--retries", min=0, max=100, help="Add to the task's retry cap (0 to 100)."),
    ] = 0,
) -> None:
    """Let a task that waits for a human go on, optionally with more budget or retries.

    Prints what was recorded. Exits 2 on a bad --grant (nothing is sent) or when no task waits
    on LANE. Your identity is taken from your connection to the tree.
    Example: orchestra-sup ctl approve 3f2a9c1b7d44-deploy-1 --grant wall_s=60,cpu_s=10
    """
    budget = None if grant is None else guarded(lambda: parse_grant(grant))
    _respond(ctl, f.CtlRespond(lane=lane, verdict="approve", grant=budget, retries=retries))


@ctl_options()
def reject(
    ctl: CtlCommand,
    lane: LaneArg,
    reason: Annotated[
        str, typer.Option("--reason", help="Why: the task's next attempt gets it as feedback.")
    ],
) -> None:
    """Reject what a task waits for a human about; the reason becomes revision feedback.

    Example: orchestra-sup ctl reject 3f2a9c1b7d44-deploy-1 --reason "not on a Friday"
    """
    text = _required_text("--reason", reason)
    _respond(ctl, f.CtlRespond(lane=lane, verdict="reject", text=text))


@ctl_options()
def redirect(
    ctl: CtlCommand,
    lane: LaneArg,
    to: Annotated[str, typer.Option("--to", help="What the task should do instead.")],
) -> None:
    """Tell a task that waits for a human to do something else instead.

    Example: orchestra-sup ctl redirect 3f2a9c1b7d44-deploy-1 --to "deploy to staging only"
    """
    _respond(ctl, f.CtlRespond(lane=lane, verdict="redirect", text=_required_text("--to", to)))


@ctl_options()
def accept_partial(ctl: CtlCommand, lane: LaneArg) -> None:
    """Take what a task that waits for a human has done so far and end its step.

    Example: orchestra-sup ctl accept-partial 3f2a9c1b7d44-deploy-1
    """
    _respond(ctl, f.CtlRespond(lane=lane, verdict="accept_partial"))
