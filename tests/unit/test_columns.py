"""Tables that fit the terminal: which columns a width keeps (by rank), that no kept cell is cut,
and facts packed on lines without being broken."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from orchestra_sup.cli.columns import Field, dropped_line, fit, pack

FIELDS = (
    Field("name"),
    Field("role", rank=5),
    Field("pid", right=True),
    Field("state"),
    Field("loop lag ms p50/p99/max", rank=2, right=True),
    Field("op restarts", rank=4, right=True),
    Field("release", rank=5),
)
ROWS = [
    ["coordinator", "coordinator", "4194304", "running", "123.4/1234.5/9999.9", "0", "0.1.0"],
    ["shard-11", "shard", "17", "backoff", "-", "12", "0.1.0 /opt/python3"],
]


def drawn(fitted_width: int | None, console_width: int = 1000) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, width=console_width, color_system=None)
    console.print(fit(FIELDS, ROWS, fitted_width).table)
    return buf.getvalue().splitlines()


def test_unbounded_keeps_every_column_on_one_line_each() -> None:
    """No width (`--wide`, piped): every field, one header line, one line per row."""
    fitted = fit(FIELDS, ROWS, None)
    assert fitted.dropped == []
    lines = drawn(None)
    assert len(lines) == 1 + len(ROWS)
    assert lines[0].split() == [
        "name",
        "role",
        "pid",
        "state",
        "loop",
        "lag",
        "ms",
        "p50/p99/max",
        "op",
        "restarts",
        "release",
    ]
    assert "/opt/python3" in lines[2]


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120])
def test_a_width_drops_by_rank_and_cuts_no_kept_cell(width: int) -> None:
    """Every line fits the width; what is dropped goes highest rank first (the rightmost first
    among equals); rank 0 stays; every cell kept is shown whole on its row's line."""
    fitted = fit(FIELDS, ROWS, width)
    lines = drawn(width, console_width=width)
    assert max(len(line) for line in lines) <= width
    kept = [f for f in FIELDS if f.header not in fitted.dropped]
    assert not any(f.rank == 0 for f in FIELDS if f.header in fitted.dropped)
    assert {"name", "pid", "state"} <= {f.header for f in kept}
    order = sorted(range(len(FIELDS)), key=lambda i: (-FIELDS[i].rank, -i))  # the order to go
    gone = [FIELDS[i].header for i in order][: len(fitted.dropped)]
    assert sorted(gone) == sorted(fitted.dropped)
    body = lines[-len(ROWS) :]
    for row, line in zip(ROWS, body, strict=True):
        for field, cell in zip(FIELDS, row, strict=True):
            if field in kept:
                assert cell in line, (cell, line)


def test_the_lowest_ranks_go_first() -> None:
    """At 80 columns the release goes (5, the rightmost of its rank), at 60 the role too; the
    lag (2) stays, its header wrapped between words."""
    assert fit(FIELDS, ROWS, 80).dropped == ["release"]
    assert fit(FIELDS, ROWS, 60).dropped == ["role", "release"]
    lines = drawn(60, console_width=60)
    assert "loop lag ms" in lines[0] and "p50/p99/max" in lines[1]


def test_a_squeezed_field_wraps_before_another_is_dropped() -> None:
    """Free text with `squeeze` is narrowed (wrapped at words) so a ranked column can stay."""
    fields = (Field("task"), Field("shard", rank=1), Field("error", squeeze=12))
    rows = [["build", "shard-0", "exited with status 1 after a very long story"]]
    fitted = fit(fields, rows, 40)
    assert fitted.dropped == []
    buf = io.StringIO()
    Console(file=buf, width=40, color_system=None).print(fitted.table)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 40 and len(lines) > 2
    assert "shard-0" in lines[1]
    words = " ".join(line[len("build  shard-0  ") :].strip() for line in lines[1:])
    assert words == rows[0][2]


def test_rank_zero_fields_too_wide_are_folded_not_cut() -> None:
    """When even the rank-0 fields cannot fit, a cell is folded onto more lines, never cut."""
    lane = "3f2a9c1b7d44-" + "x" * 60 + "-1"
    fitted = fit((Field("lane"), Field("state")), [[lane, "running"]], 40)
    buf = io.StringIO()
    Console(file=buf, width=40, color_system=None).print(fitted.table)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 40
    assert "".join(line.split()[0] for line in lines[1:]) == lane
    assert lines[1].split()[1] == "running"  # the narrow column is kept whole
    assert "…" not in buf.getvalue()


def test_pack_breaks_between_facts_only() -> None:
    facts = ["supervisor pid 4194304", "orchestra-sup 0.1.0", "isolation bwrap", "x" * 90]
    assert pack(facts, None) == ["  ".join(facts)]
    assert pack(facts, 50) == [
        "supervisor pid 4194304  orchestra-sup 0.1.0",
        "isolation bwrap",
        "x" * 90,
    ]
    assert pack(facts, 80) == [
        "supervisor pid 4194304  orchestra-sup 0.1.0  isolation bwrap",
        "x" * 90,
    ]


def test_dropped_line_names_the_columns_and_the_way_to_see_them() -> None:
    assert dropped_line([], "--wide shows them") == ""
    assert dropped_line(["role", "release"], "--wide shows them") == (
        "not shown: role, release (--wide shows them)"
    )
