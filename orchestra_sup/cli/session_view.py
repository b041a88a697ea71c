"""What `ctl plan` shows of a session (a plan whose coordinator is a program): its verdict, its
outcome, and a table of the lanes it started.

`render.plan_view` shows a dag plan's tasks; a session has no tasks, only lanes, each with the
effect id (`key`) that makes its start safe to repeat (`coordinator.session`).
"""

from __future__ import annotations

import msgspec
from rich.console import Group, RenderableType
from rich.text import Text

from orchestra_sup.cli.columns import Field, dropped_line, fit
from orchestra_sup.protocol import frames as f

RESULT_CHARS = 400
"""How much of a session's result (as JSON) the table's heading shows; `--json` has all of it."""

SESSION_FIELDS = (
    Field("key"),
    Field("status"),
    Field("lane", rank=1),
    Field("rev", rank=2),
    Field("run", squeeze=24),
    Field("plan", rank=3),
)
"""A session's lane columns in table order, with the rank each is dropped by when the terminal
is too narrow (`columns.fit`): its one-task plan first (3), then the revision (2), then the lane
id (1); effect id, status and command (0) stay, the command wrapped."""


def verdict(report: f.PlanReport) -> str:
    """ "running", "ok" or "FAILED"."""
    if not report.done:
        return "running"
    return "ok" if report.ok else "FAILED"


def session_view(report: f.PlanReport, width: int | None) -> Group:
    """Session `report`: a line with its verdict and coordinator, its result or error (at most
    `RESULT_CHARS`), then its lanes fitted to `width` columns (None: every column)."""
    parts: list[RenderableType] = [
        Text(
            f"plan {report.plan} ({report.id}): {verdict(report)}, coordinator {report.coordinator}"
        )
    ]
    if report.error is not None:
        parts.append(Text(f"error: {report.error}"))
    elif report.done:
        shown = msgspec.json.encode(report.result).decode()
        if len(shown) > RESULT_CHARS:
            shown = shown[: RESULT_CHARS - 3] + "..."
        parts.append(Text(f"result: {shown}"))
    rows = [
        [
            lane.key,
            lane.status,
            lane.lane or "-",
            (lane.rev or "-")[:10],
            lane.run,
            lane.plan,
        ]
        for lane in report.lanes
    ]
    if not rows:
        parts.append(Text("no lanes started yet" if not report.done else "no lanes started"))
        return Group(*parts)
    fitted = fit(SESSION_FIELDS, rows, width)
    parts.append(fitted.table)
    if fitted.dropped:
        parts.append(Text(dropped_line(fitted.dropped, "--json has every field"), style="dim"))
    return Group(*parts)
