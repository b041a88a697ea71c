"""`ctl submit`, `ctl plans`, `ctl plan`, `ctl message` and `ctl cancel`: plans sent to the tree,
their outcome, an operator's message to a plan's session, and a lane stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from orchestra_sup.cli import render
from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_FAILED, EXIT_USAGE, fail, guarded
from orchestra_sup.cli.options import LaneArg
from orchestra_sup.cli.output import print_json, screen
from orchestra_sup.client.sdk import message_request
from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes


@ctl_options()
def submit(
    ctl: CtlCommand,
    plan: Annotated[Path, typer.Argument(help="The plan (TOML).")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the plan is done.")] = False,
) -> None:
    """Submit PLAN to the running tree; print its id, or with --wait its outcome.

    Example: orchestra-sup ctl submit examples/selfcheck.toml --wait
    """
    spec = guarded(lambda: load_plan(plan))
    accepted = ctl.expect(f.PlanAccepted, f.CtlSubmit(plan=spec), about=str(plan))
    if not wait:
        ctl.done({"id": accepted.id}, accepted.id)
        return
    _show_plan(ctl, accepted.id, True)


@ctl_options()
def plans_cmd(ctl: CtlCommand) -> None:
    """List every plan the coordinator holds, newest first, with its tasks counted by status.

    Example: orchestra-sup ctl plans --json
    """
    ctl.show(
        f.PlanList,
        f.CtlPlans(),
        json=lambda reply: {"plans": msgspec.to_builtins(reply.plans)},
        table=lambda reply: render.plans_table(reply, *screen()),
    )


@ctl_options()
def plan_cmd(
    ctl: CtlCommand,
    plan_id: Annotated[str, typer.Argument(metavar="ID", help="The plan id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the plan is done.")] = False,
) -> None:
    """Show one plan and its tasks.

    Example: orchestra-sup ctl plan 3f2a9c1b7d44 --wait --json
    """
    _show_plan(ctl, plan_id, wait)


def _show_plan(ctl: CtlCommand, plan_id: str, wait: bool) -> None:
    from orchestra_sup.client.oneshot import wait_plan

    if wait:

        def go() -> f.PlanReport:
            with ctl.client() as client:
                return wait_plan(client, plan_id, timeout_s=ctl.timeout)

        report = guarded(go)
    else:
        report = ctl.expect(f.PlanReport, f.CtlPlan(id=plan_id))
    if ctl.as_json:
        print_json(shapes.plan_json(report))
    else:
        render.plan_table(report, *screen(), ctl.command())
    if wait:
        raise typer.Exit(0 if report.ok else EXIT_FAILED)


@ctl_options()
def message(
    ctl: CtlCommand,
    plan_id: Annotated[str, typer.Argument(metavar="PLAN", help="The plan id.")],
    text: Annotated[str, typer.Argument(help="The message (at most 64 KiB of UTF-8).")],
) -> None:
    """Send TEXT to the session that runs plan PLAN, into its durable inbox. A plan of the dag
    coordinator has no session: it is refused with one line and exit 2.

    Example: orchestra-sup ctl message 3f2a9c1b7d44 "skip the slow tests"
    """
    try:
        request = message_request(plan_id, text)
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    ctl.expect(f.Ack, request)
    ctl.done({"plan": plan_id, "sent": True}, f"message sent to plan {plan_id}")


@ctl_options()
def cancel(ctl: CtlCommand, lane: LaneArg) -> None:
    """Stop a lane now, its whole process group with it; its task becomes cancelled. Given a
    session's plan id, stop the session: its program, and every lane it left running.

    Example: orchestra-sup ctl cancel 3f2a9c1b7d44-build-1
    """
    ctl.ask(f.CtlCancel(lane=lane))
    ctl.done({"cancelled": lane}, f"cancelled {lane}")
