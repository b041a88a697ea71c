"""`orchestra-sup doctor`: which isolation layers lanes get on this machine, and which layers of
the CPU policy work here."""

from __future__ import annotations

import msgspec
import typer

from orchestra_sup.cli.options import JsonOpt
from orchestra_sup.cli.output import print_json
from orchestra_sup.system.cpudoctor import LANE_LAYERS
from orchestra_sup.system.doctorlayer import Layer


def doctor(as_json: JsonOpt = False) -> None:
    """Say which isolation layers lanes get on this machine, why not, and what mode auto picks;
    then which layers of the CPU policy (\\[cpu]) work here, and which `realtime = "auto"` and
    `lanes = "idle"` take.

    Example: orchestra-sup doctor --json
    """
    from orchestra_sup.shards.doctor import diagnose
    from orchestra_sup.system.cpudoctor import cpu_layers

    report = diagnose()
    cpu = cpu_layers()
    if as_json:
        print_json({**msgspec.to_builtins(report), "cpu": msgspec.to_builtins(cpu)})
        return
    for layer in report.layers:
        _line(layer)
    typer.echo(f'[isolation] mode = "auto" runs lanes with: {report.auto_mode}')
    typer.echo("")
    for layer in cpu:
        _line(layer)
    realtime = "SCHED_FIFO" if cpu[0].available else "SCHED_OTHER (real time refused)"
    idle = next(layer.name for layer in cpu if layer.used and layer.name in LANE_LAYERS)
    typer.echo(f'[cpu] realtime = "auto" runs the control plane in: {realtime}')
    typer.echo(f'[cpu] lanes = "idle" puts lanes below it with: {idle}')


def _line(layer: Layer) -> None:
    mark = "yes" if layer.available else "no "
    used = " (used)" if layer.used else ""
    typer.echo(f"{mark} {layer.name:<20} {layer.detail}{used}")
