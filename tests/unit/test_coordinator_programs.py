"""The built-in coordinator programs (`coordinator.programs`: fanout, refine, bisect) on a seat in
memory (`tests/unit/program_seat.py`): their args refused with one line naming the arg, their
rounds, results and failures, and a session killed at every lane start resuming from its last
checkpoint without starting a lane twice. Real trees run them in
`tests/integration/test_coordinator_programs.py`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.coordinator.context import RESULT_MAX_BYTES
from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.coordinator.plantask import MAX_FEEDBACK_BYTES
from orchestra_sup.coordinator.programs import BUILTINS
from orchestra_sup.coordinator.programs.bisect import Bisect
from orchestra_sup.coordinator.programs.fanout import Fanout, fit
from orchestra_sup.coordinator.programs.refine import Refine
from orchestra_sup.protocol.patterns import BUILTIN_COORDINATORS, DAG
from tests.unit.program_seat import SeatInMemory, drive, sha


def test_builtins_are_the_named_coordinators_but_dag() -> None:
    assert set(BUILTINS) == set(BUILTIN_COORDINATORS) - {DAG}
    for cls in BUILTINS.values():
        assert cls.__module__.startswith("orchestra_sup.coordinator.programs.")
        assert "Args" in (sys.modules[cls.__module__].__doc__ or "")


# --- args ----------------------------------------------------------------------------------------

GOOD_ARGS: dict[str, dict[str, Any]] = {
    "fanout": {"runs": ["true"], "reduce": "cat"},
    "refine": {"run": "make fix", "check": "make test"},
    "bisect": {"good": "v1", "bad": "HEAD", "check": "make test"},
}


@pytest.mark.parametrize(
    ("name", "args", "arg"),
    [
        ("fanout", {"reduce": "cat"}, "runs"),
        ("fanout", {"runs": [], "reduce": "cat"}, "runs"),
        ("fanout", {"runs": ["x"] * 1001, "reduce": "cat"}, "runs"),
        ("fanout", {"runs": ["ok", " "], "reduce": "cat"}, "runs"),
        ("fanout", {"runs": "true", "reduce": "cat"}, "runs"),
        ("fanout", {"runs": ["true"], "reduce": 3}, "reduce"),
        ("fanout", {"runs": ["true"], "reduce": "cat", "rev": "a b"}, "rev"),
        ("fanout", {"runs": ["true"], "reduce": "cat", "reduc": "cat"}, "reduc"),
        ("refine", {"run": "x", "check": ""}, "check"),
        ("refine", {"run": "x", "check": "y", "max_rounds": 0}, "max_rounds"),
        ("refine", {"run": "x", "check": "y", "max_rounds": 101}, "max_rounds"),
        ("refine", {"run": "x", "check": "y", "max_rounds": True}, "max_rounds"),
        ("refine", {"check": "y"}, "run"),
        ("bisect", {"good": "v1", "check": "y"}, "bad"),
        ("bisect", {"good": "-v1", "bad": "HEAD", "check": "y"}, "good"),
        ("bisect", {"good": "v1", "bad": "HEAD", "check": "y", "parallel": 33}, "parallel"),
        ("bisect", {"good": "v1", "bad": "HEAD", "check": "y", "parallel": 2.5}, "parallel"),
        ("bisect", {"good": "v1", "bad": "HEAD", "check": "y", "paralel": 2}, "paralel"),
    ],
)
def test_a_bad_arg_is_refused_in_one_line_naming_it(name: str, args: dict, arg: str) -> None:
    BUILTINS[name](GOOD_ARGS[name])  # the good ones build
    with pytest.raises(ValueError) as caught:
        BUILTINS[name](args)
    text = str(caught.value)
    assert f"'{arg}'" in text and text.startswith(f"{name}: ")
    assert "\n" not in text


def test_the_bisect_example_is_a_plan_whose_args_build() -> None:
    spec = load_plan(Path(__file__).parents[2] / "examples" / "bisect.toml")
    assert spec.coordinator == "bisect" and not spec.tasks
    program = BUILTINS[spec.coordinator](spec.args)
    assert len(program.good) == len(program.bad) == 40  # full shas: the answer cannot move


def test_a_misspelt_arg_is_named_with_the_near_one() -> None:
    with pytest.raises(ValueError, match="did you mean 'parallel'"):
        Bisect({"good": "v1", "bad": "HEAD", "check": "y", "paralel": 2})


# --- bisect --------------------------------------------------------------------------------------


def breaks_at(first_bad: int, commits: int, *, skip: frozenset[int] = frozenset()) -> SeatInMemory:
    """A seat over `commits` made-up commits whose check fails from commit `first_bad` on
    (exit 1) and exits 125 at the commits in `skip`."""
    number = {sha(n): n for n in range(1, commits + 1)}

    def lane_end(params: dict[str, str]) -> dict[str, Any]:
        n = number[params["rev"]]
        code = 125 if n in skip else int(n >= first_bad)
        return {"status": "failed" if code else "succeeded", "exit_code": code}

    return SeatInMemory(lane_end, commits=commits)


def bisect(seat: SeatInMemory, parallel: int, good: str = "c1", bad: str = "HEAD") -> Any:
    args = {"good": good, "bad": bad, "check": "grep -qx ok value", "parallel": parallel}
    return drive(lambda: Bisect(args), seat)


@pytest.mark.parametrize("parallel", [1, 2, 3, 5])
def test_bisect_finds_every_first_bad_commit_in_the_rounds_kary_bisection_needs(
    parallel: int,
) -> None:
    commits = 24
    candidates = commits - 1  # after good (commit 1), up to bad (commit 24) included
    bound = math.ceil(math.log(candidates, parallel + 1) - 1e-9)
    for first_bad in range(2, commits + 1):
        seat = breaks_at(first_bad, commits)
        result = bisect(seat, parallel)
        assert result["first_bad"] == sha(first_bad)
        assert result["candidates"] == candidates
        assert result["rounds"] <= bound, (first_bad, result["rounds"])
        revs = [lane["rev"] for lane in seat.started]
        assert len(revs) == len(set(revs)) == len(result["tested"])
        assert all(len(lane) <= parallel for lane in _by_round(result["tested"]).values())
        assert sha(commits) not in revs  # bad is taken as given


def _by_round(tested: list[dict[str, Any]]) -> dict[int, list[str]]:
    rounds: dict[int, list[str]] = {}
    for t in tested:
        rounds.setdefault(t["round"], []).append(t["rev"])
    return rounds


def test_bisect_on_the_issues_repository_takes_three_rounds_at_parallel_3() -> None:
    seat = breaks_at(15, 24)
    result = bisect(seat, 3)
    assert (result["first_bad"], result["rounds"]) == (sha(15), 3)
    assert result["tested"][0] == {"rev": sha(7), "status": "good", "round": 1}
    assert all(lane["run"] == "grep -qx ok value" for lane in seat.started)


def test_bisect_killed_at_every_lane_start_resumes_without_testing_a_revision_twice() -> None:
    whole = breaks_at(15, 24)
    expected = bisect(whole, 3)
    for kill in range(1, len(whole.started) + 1):
        seat = breaks_at(15, 24)
        seat.kill_after(kill)
        assert bisect(seat, 3) == expected, kill
        assert [lane["rev"] for lane in seat.started] == [t["rev"] for t in expected["tested"]]


def test_bisect_skips_an_untestable_revision_and_never_picks_it_again() -> None:
    seat = breaks_at(15, 24, skip=frozenset({13}))
    result = bisect(seat, 3)
    assert (result["first_bad"], result["rounds"]) == (sha(15), 3)
    assert {"rev": sha(13), "status": "skip", "round": 1} in result["tested"]
    revs = [lane["rev"] for lane in seat.started]
    assert len(revs) == len(set(revs))


def test_bisect_with_only_skipped_revisions_beside_the_answer_names_them_all() -> None:
    result = bisect(breaks_at(15, 24, skip=frozenset({13, 14})), 3)
    assert result == (
        f"failure: the first bad revision is one of {sha(13)}, {sha(14)}, "
        f"{sha(15)}: the others skipped"
    )


def test_bisect_fails_when_good_is_not_below_bad_or_is_bad() -> None:
    assert "good is not among" in bisect(breaks_at(15, 24), 3, good="c20", bad="c10")
    assert "same commit" in bisect(breaks_at(15, 24), 3, good="c10", bad="c10")
    assert "unknown rev 'nope'" in bisect(breaks_at(15, 24), 3, good="nope")


def test_bisect_fails_when_a_check_lane_ends_without_an_exit_code() -> None:
    seat = SeatInMemory(
        lambda p: {"status": "cancelled", "exit_code": None, "error": "cancelled by ctl"},
        commits=24,
    )
    result = bisect(seat, 3)
    assert result.startswith("failure: check at ") and "did not finish" in result
    assert "cancelled by ctl" in result


# --- fanout --------------------------------------------------------------------------------------


def echoes(reduce_code: int = 0) -> SeatInMemory:
    """Each run lane prints its command; the reduce lane prints how many outputs it was fed."""

    def lane_end(params: dict[str, str]) -> dict[str, Any]:
        if "feedback" in params:
            fed = json.loads(params["feedback"])
            return {
                "status": "failed" if reduce_code else "succeeded",
                "exit_code": reduce_code,
                "output_tail": f"fed {len(fed)}: {fed[0]}\n",
            }
        failed = params["run"] == "false"
        return {
            "status": "failed" if failed else "succeeded",
            "exit_code": int(failed),
            "output_tail": f"out of {params['run']}\n",
        }

    return SeatInMemory(lane_end)


def test_fanout_runs_every_lane_then_a_reduce_fed_their_outputs() -> None:
    seat = echoes()
    args = {"runs": ["echo a", "false", "echo c"], "reduce": "sum", "rev": "v2"}
    result = drive(lambda: Fanout(args), seat)
    assert [o["run"] for o in result["outputs"]] == args["runs"]
    assert [o["status"] for o in result["outputs"]] == ["succeeded", "failed", "succeeded"]
    assert result["outputs"][1]["exit_code"] == 1
    fed = json.loads(seat.started[-1]["feedback"])
    assert fed[1] == {"run": "false", "status": "failed", "output_tail": "out of false\n"}
    assert result["reduce"] == {
        "status": "succeeded",
        "exit_code": 0,
        "output_tail": f"fed 3: {fed[0]}\n",
    }
    assert [lane.get("rev") for lane in seat.started] == ["v2"] * 4


def test_fanout_fails_when_its_reduce_lane_fails() -> None:
    result = drive(lambda: Fanout({"runs": ["echo a"], "reduce": "sum"}), echoes(reduce_code=2))
    assert result.startswith("failure: reduce lane lane1 failed (exit 2): fed 1:")


def test_fanout_killed_at_every_start_starts_no_lane_twice() -> None:
    args = {"runs": [f"echo {i}" for i in range(5)], "reduce": "sum"}
    expected = drive(lambda: Fanout(args), echoes())
    for kill in range(1, 7):
        seat = echoes()
        seat.kill_after(kill)
        assert drive(lambda: Fanout(args), seat) == expected
        assert len(seat.started) == 6


def test_fanout_cuts_tails_to_fit_the_feedback_and_the_result() -> None:
    def entries(count: int, run: str = "pytest tests/unit/test_{}.py") -> list[dict[str, Any]]:
        tail = "é" * 4096
        return [
            {"run": run.format(i), "status": "failed", "output_tail": tail} for i in range(count)
        ]

    for count, limit in ((200, MAX_FEEDBACK_BYTES), (1000, RESULT_MAX_BYTES // 2)):
        whole = entries(count)
        cut = fit(whole, limit)
        size = len(json.dumps(cut, ensure_ascii=False).encode())
        assert limit - 2 * count <= size <= limit  # as full as whole characters allow
        assert all(c["output_tail"] == "é" * len(c["output_tail"]) for c in cut)
        assert [c["run"] for c in cut] == [e["run"] for e in whole]
    # 1000 commands alone are more than the feedback holds: they are cut too, to their starts
    many = entries(1000)
    cut = fit(many, MAX_FEEDBACK_BYTES)
    assert len(json.dumps(cut, ensure_ascii=False).encode()) <= MAX_FEEDBACK_BYTES
    assert all(c["output_tail"] == "" for c in cut)
    assert all(e["run"].startswith(c["run"]) for c, e in zip(cut, many, strict=True))
    assert fit(many[:3], MAX_FEEDBACK_BYTES) == many[:3]


# --- refine --------------------------------------------------------------------------------------


def passes_at(round_: int, *, commits: bool = True) -> SeatInMemory:
    """A seat whose run lanes each commit a new sha (or none) and whose check passes from the
    `round_`-th check on, printing "N failures" before."""
    checks = []

    def lane_end(params: dict[str, str]) -> dict[str, Any]:
        if params["run"] == "fix":
            made = len([p for p in seat.started if p["run"] == "fix"])
            return {"commit": sha(100 + made) if commits else None}
        checks.append(params["rev"])
        left = round_ - len(checks)
        return {
            "status": "failed" if left > 0 else "succeeded",
            "exit_code": int(left > 0),
            "output_tail": f"ran\n{left} failures\n",
        }

    seat = SeatInMemory(lane_end, commits=5)
    return seat


def test_refine_feeds_each_check_back_until_it_passes() -> None:
    seat = passes_at(3)
    result = drive(lambda: Refine({"run": "fix", "check": "test"}), seat)
    assert result == {"rounds": 3, "commit": sha(103), "check_output": "ran\n0 failures\n"}
    runs = [p for p in seat.started if p["run"] == "fix"]
    assert [p.get("feedback") for p in runs] == [None, "ran\n2 failures\n", "ran\n1 failures\n"]
    assert all(p["commit"] == "true" for p in runs)
    checks = [p["rev"] for p in seat.started if p["run"] == "test"]
    assert checks == [sha(101), sha(102), sha(103)]


def test_refine_checks_the_head_when_the_run_made_no_commit() -> None:
    seat = passes_at(1, commits=False)
    result = drive(lambda: Refine({"run": "fix", "check": "test"}), seat)
    assert result["commit"] == sha(5)
    assert seat.started[1]["rev"] == sha(5)


def test_refine_fails_with_the_last_check_line_when_rounds_end() -> None:
    result = drive(lambda: Refine({"run": "fix", "check": "test", "max_rounds": 2}), passes_at(9))
    assert result == "failure: check still fails after 2 rounds: 7 failures"


def test_refine_fails_when_the_budget_refuses_the_next_lane() -> None:
    seat = passes_at(9)
    seat.lanes_allowed = 3
    result = drive(lambda: Refine({"run": "fix", "check": "test"}), seat)
    assert result.startswith("failure: budget spent after 1 rounds (the session's budget")
    assert result.endswith("): 8 failures")


def test_refine_killed_at_every_start_resumes_at_its_round() -> None:
    expected = drive(lambda: Refine({"run": "fix", "check": "test"}), passes_at(3))
    for kill in range(1, 7):
        seat = passes_at(3)
        seat.kill_after(kill)
        assert drive(lambda: Refine({"run": "fix", "check": "test"}), seat) == expected
        assert len(seat.started) == 6
