"""Small multiples of line charts as one SVG file, written by hand (no plotting library).

For `bench soak --plot`: one panel per series, each with its own y axis from 0 to the series'
largest value (so a growth shows in proportion to what was already there), the x axis shared
(seconds), dashed vertical lines at given times (the soak's quarters), and a caption per panel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

PANEL_W, PANEL_H = 300, 150
"""A panel's size in SVG user units (pixels), its margins included."""
MARGIN_L, MARGIN_T, MARGIN_B = 8, 34, 18
COLUMNS = 3


def write_panels(
    path: Path,
    title: str,
    times: list[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    captions: dict[str, str] | None = None,
    marks: tuple[float, ...] = (),
) -> None:
    """Write `path`: a panel per entry of `series` (name -> a value for each of `times`,
    seconds; None is a gap), captioned with `captions[name]` under its name, and a dashed line
    at each of `marks` (seconds). Raises `OSError` when `path` cannot be written."""
    captions = captions or {}
    rows = -(-len(series) // COLUMNS)
    width, height = COLUMNS * PANEL_W, 30 + rows * PANEL_H
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="20" font-size="14">{escape(title)}</text>',
    ]
    span = max(times, default=0.0) or 1.0
    for i, (name, values) in enumerate(series.items()):
        x0, y0 = (i % COLUMNS) * PANEL_W, 30 + (i // COLUMNS) * PANEL_H
        parts += _panel(x0, y0, name, captions.get(name, ""), times, values, span, marks)
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def _panel(
    x0: float,
    y0: float,
    name: str,
    caption: str,
    times: list[float],
    values: Sequence[float | None],
    span: float,
    marks: tuple[float, ...],
) -> list[str]:
    """The SVG elements of one panel whose top left corner is (`x0`, `y0`)."""
    w, h = PANEL_W - 2 * MARGIN_L, PANEL_H - MARGIN_T - MARGIN_B
    left, top = x0 + MARGIN_L, y0 + MARGIN_T
    peak = max((v for v in values if v is not None), default=0.0) or 1.0

    def xy(t: float, v: float) -> str:
        return f"{left + w * t / span:.1f},{top + h * (1 - v / peak):.1f}"

    out = [
        f'<text x="{left}" y="{y0 + 13}">{escape(name)}</text>',
        f'<text x="{left}" y="{y0 + 26}" fill="#555">{escape(caption)}</text>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#bbb"/>',
        f'<text x="{left + 2}" y="{top + 10}" fill="#555">{peak:.4g}</text>',
        f'<text x="{left + w}" y="{top + h + 13}" fill="#555" '
        f'text-anchor="end">{span:.0f} s</text>',
    ]
    for t in marks:
        x = left + w * t / span
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" stroke="#ccc" '
            'stroke-dasharray="3,3"/>'
        )
    segment: list[str] = []
    for t, v in [*zip(times, values, strict=True), (0.0, None)]:  # a None ends a segment
        if v is not None:
            segment.append(xy(t, v))
            continue
        if segment:
            out.append(f'<polyline points="{" ".join(segment)}" fill="none" stroke="#1f77b4"/>')
        segment = []
    return out
