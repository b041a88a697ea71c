"""`orchestra-sup doctor`: which isolation layers lanes get on this machine, which layers of the
CPU policy work here, whether the state disk has its reserve, and, given a config with
`[cluster] etcd`, how its etcd cluster is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import typer

from orchestra_sup.cli.exits import EXIT_FAILED, guarded
from orchestra_sup.cli.options import ConfigOpt, JsonOpt, StateOpt
from orchestra_sup.cli.output import print_json
from orchestra_sup.paths import default_state_dir
from orchestra_sup.system.cpudoctor import LANE_LAYERS
from orchestra_sup.system.doctorlayer import Layer
from orchestra_sup.system.reserve import DiskReserve, DiskSpace

if TYPE_CHECKING:  # aiohttp, which etcd's client needs, is imported only when it is used
    from orchestra_sup.cluster.health import ClusterHealth


def doctor(config: ConfigOpt = None, state_dir: StateOpt = None, as_json: JsonOpt = False) -> None:
    """Say which isolation layers lanes get on this machine, why not, and what mode auto picks;
    then which layers of the CPU policy (\\[cpu]) work here, and which `realtime = "auto"` and
    `lanes = "idle"` take; then the state directory's free space against \\[state] min_free;
    then, when `--config` names an etcd cluster (\\[cluster] etcd), whether each member
    answers and whether the cluster has a quorum. Exits 1 when the state disk is short of its
    reserve (the tree would refuse new plans) or that cluster has no quorum (a tree across
    machines could not keep its hosts), else 0.

    Example: orchestra-sup doctor --config /etc/orchestra-sup/tree.toml --json
    """
    from orchestra_sup.shards.doctor import diagnose
    from orchestra_sup.system.cpudoctor import cpu_layers

    cluster = guarded(lambda: _cluster(config))
    disk = guarded(lambda: _state_disk(config, state_dir))
    report = diagnose()
    cpu = cpu_layers()
    if as_json:
        print_json(
            {
                **msgspec.to_builtins(report),
                "cpu": msgspec.to_builtins(cpu),
                "state_disk": {**msgspec.to_builtins(disk), "short": disk.short},
                "cluster": msgspec.to_builtins(cluster),
            }
        )
        _exit_for(cluster, disk)
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
    typer.echo("")
    whose = "" if config is not None else " (the default [state] min_free; --config: the tree's)"
    typer.echo(f"{'no ' if disk.short else 'yes'} {'state disk':<20} {disk.text()}{whose}")
    if cluster is not None:
        typer.echo("")
        for member in cluster.members:
            typer.echo(
                f"{'yes' if member.ok else 'no '} etcd {member.endpoint:<27} {member.detail}"
            )
        quorum = "yes" if cluster.quorum else "no "
        typer.echo(f"{quorum} etcd quorum {'':<21} {cluster.detail}")
    _exit_for(cluster, disk)


def _exit_for(cluster: ClusterHealth | None, disk: DiskSpace) -> None:
    if disk.short or (cluster is not None and not cluster.quorum):
        raise typer.Exit(EXIT_FAILED)


def _state_disk(config: Path | None, state_dir: Path | None) -> DiskSpace:
    """The state directory's disk against `config`'s `[state] min_free` (the default without
    one); a directory not made yet is read at its nearest existing parent. Raises
    `ConfigError` for a config that cannot be read or is invalid."""
    from orchestra_sup.config import Settings, load_settings

    settings = load_settings(config) if config is not None else Settings()
    where = (state_dir or default_state_dir()).absolute()
    where = next(p for p in (where, *where.parents) if p.exists())
    return DiskReserve(where, settings.min_free).space()


def _cluster(config: Path | None) -> ClusterHealth | None:
    """The health of `config`'s etcd cluster, or None without a config or an etcd there.
    Raises `ConfigError` for a config that cannot be read or is invalid."""
    from orchestra_sup.cluster import health
    from orchestra_sup.cluster.settings import connect
    from orchestra_sup.config import load_settings

    if config is None:
        return None
    settings = load_settings(config).cluster
    if not settings.etcd:
        return None

    async def ask() -> ClusterHealth:
        async with connect(settings) as etcd:
            return await health.check(etcd, settings.prefix)

    return asyncio.run(ask())


def _line(layer: Layer) -> None:
    mark = "yes" if layer.available else "no "
    used = " (used)" if layer.used else ""
    typer.echo(f"{mark} {layer.name:<20} {layer.detail}{used}")
