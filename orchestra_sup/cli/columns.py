"""Tables for people that fit the terminal: columns kept by priority, nothing essential cut.

A table is a sequence of `Field`s and rows of strings. `fit` keeps every field when the width is
unbounded (`--wide`, piped output: every column, each line as long as it needs) and otherwise
drops fields, the highest `rank` first (rank 0 is never dropped), until the rest fits. A field
with `squeeze` (free text: an error, a question) is narrowed to that many columns, wrapping its
text, before anything is dropped for it. No cell is ever cut: each column is as wide as its
widest cell, and only when even the rank-0 fields cannot fit are the widest columns' cells
folded onto more lines (a lane id, not a state).

Tables are borderless, their columns two spaces apart, as `ps` prints them: borders cost three
columns per field that an 80-column terminal does not have, and rows stay one line each for
`grep` and `awk` when piped. A header wraps between its words when its column is narrower.

`pack` lays short facts ("supervisor pid 7451", "isolation bwrap") on lines of the width,
breaking between facts only, never inside one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec
from rich.cells import cell_len
from rich.table import Table

GAP = 2
"""Columns between two columns of a table."""
WIDE = 100_000
"""The width of a console that prints unbounded lines (`--wide`, piped output): rich wraps at
its console's width, so "no limit" is a width no line reaches."""


class Field(msgspec.Struct, frozen=True):
    """One column: its `header`, its `rank` (0: always shown; a higher rank is dropped before a
    lower one, the rightmost first among equals), whether it is right-aligned (figures), and
    `squeeze`: the width (columns) its cells may be wrapped to before another field is dropped
    to make room for it (0: never narrowed but as a last resort)."""

    header: str
    rank: int = 0
    right: bool = False
    squeeze: int = 0


class Fitted(NamedTuple):
    """What `fit` made: the table and the headers of the fields it left out, in table order."""

    table: Table
    dropped: list[str]


def fit(fields: Sequence[Field], rows: Sequence[Sequence[str]], width: int | None) -> Fitted:
    """A borderless table of `rows` (one string per field each; a string may hold several lines)
    that fits in `width` columns, dropping fields by rank; None: every field, nothing wrapped."""
    cells = [[row[i] for row in rows] for i in range(len(fields))]
    natural = [_natural(f.header, column) for f, column in zip(fields, cells, strict=True)]
    if width is None:
        return Fitted(_table(fields, range(len(fields)), natural, rows), [])
    need = [max(_longest_word(f.header), _widest(c)) for f, c in zip(fields, cells, strict=True)]
    least = [min(n, f.squeeze) if f.squeeze else n for f, n in zip(fields, need, strict=True)]
    keep = list(range(len(fields)))
    for i in sorted(keep, key=lambda i: (-fields[i].rank, -i)):
        if _span([least[k] for k in keep]) <= width or fields[i].rank == 0:
            break
        keep.remove(i)
    widths = {k: least[k] for k in keep}
    slack = width - _span(list(widths.values()))
    for k in keep:  # room left: unwrap squeezed cells first ...
        grow = max(0, min(slack, need[k] - widths[k]))
        widths[k] += grow
        slack -= grow
    for k in keep:  # ... then headers, each only if it then fits on one line
        if 0 < natural[k] - widths[k] <= slack:
            slack -= natural[k] - widths[k]
            widths[k] = natural[k]
    if slack < 0:  # even the rank-0 fields do not fit: fold the widest, keep the short whole
        capped = _capped([widths[k] for k in keep], width - GAP * (len(keep) - 1))
        widths = dict(zip(keep, capped, strict=True))
    dropped = [f.header for i, f in enumerate(fields) if i not in keep]
    table = _table(fields, keep, [widths.get(i, 0) for i in range(len(fields))], rows)
    return Fitted(table, dropped)


def dropped_line(dropped: list[str], how: str) -> str:
    """The line under a table that left columns out: what, and `how` to see them ("--wide shows
    them"); "" when nothing was left out."""
    if not dropped:
        return ""
    return f"not shown: {', '.join(dropped)} ({how})"


def pack(facts: Sequence[str], width: int | None) -> list[str]:
    """`facts` joined by two spaces into lines of at most `width` columns (None: one line),
    breaking between facts only; a fact longer than the width is a line of its own."""
    lines: list[str] = []
    for fact in facts:
        if lines and (width is None or cell_len(lines[-1]) + GAP + cell_len(fact) <= width):
            lines[-1] += " " * GAP + fact
        else:
            lines.append(fact)
    return lines


def _table(
    fields: Sequence[Field], keep: Sequence[int], widths: list[int], rows: Sequence[Sequence[str]]
) -> Table:
    table = Table(box=None, pad_edge=False, padding=(0, GAP // 2), header_style="bold")
    for k in keep:
        justify = "right" if fields[k].right else "left"
        table.add_column(fields[k].header, width=widths[k], justify=justify, overflow="fold")
    for row in rows:
        table.add_row(*(row[k] for k in keep))
    return table


def _capped(widths: list[int], room: int) -> list[int]:
    """`widths` with the widest cut down to one cap, the largest at which they sum to at most
    `room` (at least 1): the narrow columns (a pid, a state) keep their width."""
    cap = max(widths, default=1)
    while cap > 1 and sum(min(w, cap) for w in widths) > room:
        cap -= 1
    return [min(w, cap) for w in widths]


def _span(widths: list[int]) -> int:
    return sum(widths) + GAP * max(0, len(widths) - 1)


def _widest(cells: list[str]) -> int:
    return max((cell_len(line) for cell in cells for line in cell.splitlines()), default=0)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _natural(header: str, cells: list[str]) -> int:
    """The width that wraps nothing: the header on one line, every cell line whole."""
    return max(cell_len(header), _widest(cells))
