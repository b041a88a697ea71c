"""`bench soak`'s arithmetic and plot (`bench.soak.judge`, `bench.svgplot`): the quarters' means
and their ratio, what is judged and what is not, the config it writes, a well-formed SVG."""

from __future__ import annotations

import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from orchestra_sup.bench import svgplot
from orchestra_sup.bench.soak import RETENTION, _toml, judge

TIMES = [float(t) for t in range(100)]  # one sample a second over a run of 100 s


def test_the_quarters_are_the_second_and_the_last() -> None:
    """Means over [25, 50) and [75, 100]: a figure that doubles from the second quarter on is
    over any bound below 2; one that is flat there is bounded, however it rose at first."""
    doubling = [1.0 if t < 50 else 2.0 for t in TIMES]
    figure = judge(TIMES, doubling, 100.0, 1.1)
    assert (figure.second_quarter, figure.last_quarter, figure.ratio) == (1.0, 2.0, 2.0)
    assert figure.bounded is False
    warmed = [t if t < 25 else 25.0 for t in TIMES]
    assert judge(TIMES, warmed, 100.0, 1.1).bounded is True


@pytest.mark.parametrize(
    ("values", "ratio", "bounded"),
    [
        ([0.0] * 100, 1.0, True),  # nothing, throughout
        ([0.0 if t < 50 else 3.0 for t in TIMES], None, False),  # grew from nothing
        ([None] * 100, None, None),  # never read (the event log before it exists)
        ([None if t < 50 else 3.0 for t in TIMES], None, None),  # not read in the second
    ],
)
def test_zero_and_absent(values: list[float | None], ratio: float | None, bounded: bool) -> None:
    figure = judge(TIMES, values, 100.0, 1.5)
    assert (figure.ratio, figure.bounded) == (ratio, bounded)


def test_the_retention_it_writes_is_toml_the_tree_reads() -> None:
    assert tomllib.loads(_toml(RETENTION)) == RETENTION


def test_the_plot_is_one_well_formed_svg_with_a_panel_per_figure(tmp_path: Path) -> None:
    path = tmp_path / "soak.svg"
    series: dict[str, list[float | None]] = {
        "a": [1.0, None, 3.0, 4.0],
        "b": [0.0, 0.0, 0.0, 0.0],
        "c": [None] * 4,
    }
    svgplot.write_panels(
        path, "t <&>", [0.0, 1.0, 2.0, 3.0], series, captions={"a": "x"}, marks=(1.5,)
    )
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 3  # a: two segments around its gap (one of a single point); b: one
    assert len(root.findall(f"{ns}line")) == len(series)  # the mark, in every panel
