"""`ctl submit`, `ctl plans`, `ctl plan` and `ctl cancel`: plans sent to the tree, their
outcome, and a lane stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from orchestra_sup.cli import render
from orchestra_sup.cli.exits import EXIT_FAILED, guarded
from orchestra_sup.cli.options import JsonOpt, LaneArg, RunDirOpt, TimeoutOpt
from orchestra_sup.cli.output import done, print_json, screen
from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.protocol import frames as f


def submit(
    ctx: typer.Context,
    plan: Annotated[Path, typer.Argument(help="The plan (TOML).")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the plan is done.")] = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Submit PLAN to the running tree; print its id, or with --wait its outcome.

    Example: orchestra-sup ctl submit examples/selfcheck.toml --wait
    """
    spec = guarded(lambda: load_plan(plan))
    accepted = ctx.obj.expect(f.PlanAccepted, f.CtlSubmit(plan=spec), timeout, run_dir)
    if not wait:
        done(as_json, {"id": accepted.id}, accepted.id)
        return
    _show_plan(ctx, accepted.id, True, as_json, timeout, run_dir)


def plans_cmd(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """List every plan the coordinator holds, newest first, with its tasks counted by status.

    Example: orchestra-sup ctl plans --json
    """
    ctx.obj.show(
        f.PlanList,
        f.CtlPlans(),
        as_json=as_json,
        timeout=timeout,
        run_dir=run_dir,
        json=lambda reply: {"plans": msgspec.to_builtins(reply.plans)},
        table=lambda reply: render.plans_table(reply, *screen()),
    )


def plan_cmd(
    ctx: typer.Context,
    plan_id: Annotated[str, typer.Argument(metavar="ID", help="The plan id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the plan is done.")] = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Show one plan and its tasks.

    Example: orchestra-sup ctl plan 3f2a9c1b7d44 --wait --json
    """
    _show_plan(ctx, plan_id, wait, as_json, timeout, run_dir)


def _show_plan(
    ctx: typer.Context,
    plan_id: str,
    wait: bool,
    as_json: bool,
    timeout: float,
    run_dir: Path | None,
) -> None:
    from orchestra_sup.client.oneshot import wait_plan

    if wait:

        def go() -> f.PlanReport:
            with ctx.obj.client(run_dir) as client:
                return wait_plan(client, plan_id, timeout_s=timeout)

        report = guarded(go)
    else:
        report = ctx.obj.expect(f.PlanReport, f.CtlPlan(id=plan_id), timeout, run_dir)
    if as_json:
        print_json(render.plan_json(report))
    else:
        render.plan_table(report, *screen(), ctx.obj.command(run_dir))
    if wait:
        raise typer.Exit(0 if report.ok else EXIT_FAILED)


def cancel(
    ctx: typer.Context,
    lane: LaneArg,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Stop a lane now, its whole process group with it; its task becomes cancelled.

    Example: orchestra-sup ctl cancel 3f2a9c1b7d44-build-1
    """
    ctx.obj.ask(f.CtlCancel(lane=lane), timeout, run_dir)
    done(as_json, {"cancelled": lane}, f"cancelled {lane}")
