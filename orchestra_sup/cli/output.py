"""Where the `orchestra-sup` command prints: the console, the width a table is fitted to, and
JSON for programs."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.console import Console

from orchestra_sup.cli.columns import WIDE

# Piped output is for reading whole, not for an 80-column guess: every column, no line wrapped.
TTY = sys.stdout is not None and sys.stdout.isatty()  # None: started with stdout closed
"""Whether stdout is a terminal (read once, at import)."""
out = Console(width=None if TTY else WIDE, markup=False, highlight=False)
"""No markup: plan names, errors and output are the users' text, and "[/x]" in one must print as
itself, not be parsed (or refused) as rich markup."""


def screen(wide: bool = False) -> tuple[Console, int | None]:
    """Where a table is printed and the width it is fitted to (`columns.fit`): the terminal's,
    or unbounded with `--wide` or when stdout is not a terminal."""
    if not TTY:
        return out, None
    return (Console(width=WIDE, markup=False, highlight=False), None) if wide else (out, out.width)


def print_json(value: Any) -> None:
    """`value` as JSON on stdout, indented by 2, one newline after it."""
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def discard_stdout() -> None:
    """Point stdout at /dev/null: its reader has gone (`... | head`), having all it wanted, and
    what is left to flush on the way out must not raise `BrokenPipeError` again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def done(as_json: bool, value: dict[str, Any], text: str) -> None:
    """What a command did: `value` as JSON with --json, else the line `text`."""
    if as_json:
        print_json(value)
    else:
        typer.echo(text)
