"""How a plan's outcome is headlined for people."""

from __future__ import annotations

import pytest

from orchestra_sup.protocol import frames as f
from orchestra_sup.render import plan_verdict


def report(done: bool, *statuses: str) -> f.PlanReport:
    tasks = [f.TaskReport(id=f"t{i}", status=s) for i, s in enumerate(statuses)]
    ok = done and all(s == "succeeded" for s in statuses)
    return f.PlanReport(plan="p", id="1", done=done, ok=ok, tasks=tasks)


@pytest.mark.parametrize(
    ("plan", "verdict"),
    [
        (report(False, "running", "succeeded"), "running"),
        (report(True, "succeeded", "succeeded"), "ok"),
        (report(True, "succeeded", "cancelled"), "cancelled"),
        (report(True, "cancelled", "failed"), "FAILED"),
        (report(True, "skipped", "failed"), "FAILED"),
    ],
)
def test_plan_verdict(plan: f.PlanReport, verdict: str) -> None:
    assert plan_verdict(plan) == verdict
