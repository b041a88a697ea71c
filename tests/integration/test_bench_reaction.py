"""`orchestra-sup bench reaction` at a tiny size on real trees, and the two stamps it reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.bench.isolation import MODES
from orchestra_sup.bench.policy import responsive
from tests.integration.harness import Tree, assert_no_leftovers, osup, plan, task

pytestmark = pytest.mark.integration

STEPS, RUNS = 3, 2


def ordered(steps: list[list[int | None]]) -> bool:
    """Every stamp is there, each lane's start before its result, each result before the next
    lane's start: one clock, in the order the program's steps took."""
    flat = [stamp for step in steps for stamp in step]
    return all(isinstance(s, int) for s in flat) and flat == sorted(flat)  # type: ignore[type-var]


def test_a_finished_task_reports_when_its_start_and_its_result_arrived(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """The plumbing on its own, through a plain plan: a chain's tasks each show the shard's
    receipt of their LaneStart and the coordinator's receipt of their result, in order."""
    tree = tree_factory(workspace=repo)
    plan_id = tree.submit(
        plan("chain", task("a", "true"), task("b", "true", ["a"]), task("c", "true", ["b"]))
    )
    report = tree.wait_plan(plan_id)
    assert report.ok
    steps = [list(t.stamps_ns or (None, None)) for t in report.tasks]
    assert ordered(steps), steps


def test_bench_reaction_emits_well_formed_json() -> None:
    """Every shape, both phases: p50 <= p99 <= max over the pooled reactions (steps - 1 per
    run), the spread over the runs, the ratios, and every step's two stamps there and ordered;
    nothing is left running."""
    done = osup("bench", "reaction", "--steps", str(STEPS), "--runs", str(RUNS), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["method"]["steps"] == STEPS and result["method"]["runs"] == RUNS
    assert result["policy"] == responsive()
    for mode in MODES:
        shape = result[mode]
        for phase in ("idle", "loaded"):
            figures = shape[phase]
            assert 0 <= figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
            assert figures["n"] == RUNS * (STEPS - 1) == len(shape["samples_ms"][phase])
            assert len(figures["runs"]) == RUNS
            for key in ("p50_ms", "p99_ms"):
                spread = figures["spread"][key]
                assert spread["min"] <= spread["median"] <= spread["max"]
            sessions = shape["steps"][phase]
            assert len(sessions) == RUNS
            for steps in sessions:
                assert len(steps) == STEPS and ordered(steps), steps
        assert shape["ratio"] is None or shape["ratio"] > 0
    assert_no_leftovers()


def test_bench_reaction_refuses_one_step_in_one_line() -> None:
    done = osup("bench", "reaction", "--steps", "1")
    assert done.returncode == 2
    assert "--steps" in done.stderr and "Traceback" not in done.stderr
