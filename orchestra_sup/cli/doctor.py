"""`orchestra-sup doctor`: which isolation layers lanes get on this machine."""

from __future__ import annotations

import msgspec
import typer

from orchestra_sup.cli.options import JsonOpt
from orchestra_sup.cli.output import print_json


def doctor(as_json: JsonOpt = False) -> None:
    """Say which isolation layers lanes get on this machine, why not, and what mode auto picks.

    Example: orchestra-sup doctor --json
    """
    from orchestra_sup.shards.doctor import diagnose

    report = diagnose()
    if as_json:
        print_json(msgspec.to_builtins(report))
        return
    for layer in report.layers:
        mark = "yes" if layer.available else "no "
        used = " (used)" if layer.used else ""
        typer.echo(f"{mark} {layer.name:<20} {layer.detail}{used}")
    typer.echo(f'[isolation] mode = "auto" runs lanes with: {report.auto_mode}')
