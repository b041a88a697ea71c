"""`orchestra-sup ctl prune`: apply `[retention]` now, or say what it would take."""

from __future__ import annotations

from typing import Annotated

import msgspec
import typer

from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.output import out
from orchestra_sup.protocol import frames as f


@ctl_options()
def prune(
    ctl: CtlCommand,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; change nothing.")
    ] = False,
) -> None:
    """Prune now what \\[retention] says may go, as the coordinator does every every_s: plans
    finished longer ago than plans_s (their records, inbox entries and sessions' state), and
    the idempotency keys of pruned plans older than keys_s, and the event log's front older
    than events_s. Prints what went (with --dry-run, what would; the event log's count is not
    reckoned then).

    Example: orchestra-sup ctl prune --dry-run --json
    """

    def line(report: f.PruneReport) -> None:
        verb = "would prune" if report.dry_run else "pruned"
        out.print(
            f"{verb} {report.plan_count} plans ({report.tasks} tasks, {report.inbox} inbox "
            f"entries, {report.sessions} sessions); {report.keys} keys expired, {report.kept} "
            f"kept for pruned plans; {'?' if report.dry_run else report.events} events "
            f"({report.took_s * 1000:.1f} ms)"
        )
        for plan_id in report.plans:
            out.print(f"  {plan_id}")

    ctl.show(
        f.PruneReport,
        f.CtlPrune(dry_run=dry_run),
        json=lambda report: msgspec.to_builtins(report),
        table=line,
    )
