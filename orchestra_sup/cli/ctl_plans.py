"""`ctl submit`, `ctl plans`, `ctl plan` and `ctl cancel`: plans sent to the tree, their
outcome, and a lane stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from orchestra_sup.cli import render
from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_FAILED, guarded
from orchestra_sup.cli.options import LaneArg
from orchestra_sup.cli.output import print_json, screen
from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.protocol import frames as f


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
    accepted = ctl.expect(f.PlanAccepted, f.CtlSubmit(plan=spec))
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
        print_json(render.plan_json(report))
    else:
        render.plan_table(report, *screen(), ctl.command())
    if wait:
        raise typer.Exit(0 if report.ok else EXIT_FAILED)


@ctl_options()
def cancel(ctl: CtlCommand, lane: LaneArg) -> None:
    """Stop a lane now, its whole process group with it; its task becomes cancelled.

    Example: orchestra-sup ctl cancel 3f2a9c1b7d44-build-1
    """
    ctl.ask(f.CtlCancel(lane=lane))
    ctl.done({"cancelled": lane}, f"cancelled {lane}")
