"""`bench reaction`'s reduction: two processes' stamps to reaction times, then to figures."""

from __future__ import annotations

import pytest

from orchestra_sup.bench.isolation import MODES
from orchestra_sup.bench.reaction import format_table, phase_figures, reactions, shape_figures

MS = 1_000_000


def test_a_reaction_is_the_next_start_minus_this_result() -> None:
    """Step i+1's start at the shard minus step i's result at the coordinator; the lane's own
    run (its start to its result) does not count."""
    steps = [(0, 50 * MS), (53 * MS, 200 * MS), (210 * MS, 211 * MS)]
    assert reactions(steps) == [3.0, 10.0]


def test_one_step_has_no_reaction() -> None:
    assert reactions([(0, 1)]) == []


@pytest.mark.parametrize(
    "steps",
    [
        [(0, None), (5, 6)],  # a result the coordinator did not stamp
        [(0, 4), (None, 6)],  # a start from a shard that did not stamp it
    ],
)
def test_a_missing_stamp_is_refused(steps: list[tuple[int | None, int | None]]) -> None:
    with pytest.raises(ValueError, match="missing"):
        reactions(steps)


def test_a_start_before_the_result_it_reacts_to_is_refused() -> None:
    """One clock for both processes: a negative reaction is a bug, never noise."""
    with pytest.raises(ValueError, match="before step 0's result"):
        reactions([(0, 10), (9, 20)])


def test_a_result_before_its_own_start_is_refused() -> None:
    with pytest.raises(ValueError, match="before its start"):
        reactions([(10, 5), (20, 30)])


def test_phase_figures_pool_the_runs_and_give_their_spread() -> None:
    runs = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0]]
    got = phase_figures(runs)
    assert got["n"] == 6
    assert got["p50_ms"] == 4.0  # nearest rank over the six pooled: sorted[3]
    assert got["p99_ms"] == got["max_ms"] == 20.0
    assert got["runs"] == [
        {"p50_ms": 3.0, "p99_ms": 4.0, "max_ms": 4.0, "n": 4},
        {"p50_ms": 20.0, "p99_ms": 20.0, "max_ms": 20.0, "n": 2},
    ]
    assert got["spread"]["p50_ms"] == {"median": 11.5, "min": 3.0, "max": 20.0}
    assert got["spread"]["p99_ms"] == {"median": 12.0, "min": 4.0, "max": 20.0}


@pytest.mark.parametrize("runs", [[], [[1.0], []]])
def test_phase_figures_need_a_reaction_in_every_run(runs: list[list[float]]) -> None:
    with pytest.raises(ValueError):
        phase_figures(runs)


def test_shape_figures_divide_loaded_by_idle() -> None:
    got = shape_figures([[1.0, 2.0]], [[4.0, 6.0]])
    assert got["ratio"] == 3.0  # p99: 6 / 2
    assert got["ratio_p50"] == 3.0  # p50: 6 / 2 (nearest rank of two is the second)
    assert got["samples_ms"] == {"idle": [1.0, 2.0], "loaded": [4.0, 6.0]}
    assert got["idle"]["n"] == 2 and got["loaded"]["max_ms"] == 6.0


def test_the_table_shows_both_shapes_and_the_spread() -> None:
    shape = shape_figures([[1.0, 2.0], [3.0]], [[4.0, 6.0], [5.0]])
    method = {"runs": 2, "steps": 3, "loaded_lanes": 16}
    text = format_table({m: shape for m in MODES} | {"method": method})
    lines = text.splitlines()
    assert lines[0].split() == ["separated", "default", "colocated"]
    assert (
        "runs' p99 min-max idle / loaded, ms" in text and "2.0-3.0 / 5.0-6.0" in text
    )  # each run's p99: 2, 3 idle; 6, 5 loaded
    assert lines[-1] == "2 runs of 3 steps per phase, 16 loaded lanes"
