"""`orchestra-sup host`: a host's agent, the supervisor of one machine's shards in another
machine's tree (ADR 0022)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from orchestra_sup import logformat
from orchestra_sup.cli.exits import guarded
from orchestra_sup.cli.options import ConfigOpt, LanesOpt, ShardsOpt, StateOpt
from orchestra_sup.cluster.settings import check_host_cluster, is_tcp_address
from orchestra_sup.config import load_settings
from orchestra_sup.errors import ConfigError
from orchestra_sup.paths import resolve_paths
from orchestra_sup.protocol.keys import check_name
from orchestra_sup.protocol.patterns import NAME_PATTERN
from orchestra_sup.system.pathcheck import check_paths


def host(
    join: Annotated[
        str,
        typer.Option(
            "--join", help="The root's cluster endpoint (its \\[cluster] listen), tcp://HOST:PORT."
        ),
    ],
    keys: Annotated[
        Path,
        typer.Option("--keys", help="A directory with the root's server.public and NAME.secret."),
    ],
    name: Annotated[str, typer.Option("--name", help="This host's name: its key's name.")],
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            help="The host's data port, tcp://HOST:PORT, where the root's processes reach its "
            "shards (CURVE: the root's key only).",
        ),
    ] = None,
    shards: ShardsOpt = None,
    lanes_per_shard: LanesOpt = None,
    capabilities: Annotated[
        str,
        typer.Option("--capabilities", help="What this host's shards offer (comma-separated)."),
    ] = "",
    tenants: Annotated[
        str,
        typer.Option("--tenants", help="Whom they serve (comma-separated; none: every tenant)."),
    ] = "",
    state_dir: StateOpt = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="This host's sockets and lock.")
    ] = None,
    config: ConfigOpt = None,
    log_format: Annotated[
        str, typer.Option("--log-format", help="Log lines on stderr: text or json.")
    ] = "text",
) -> None:
    """Run this machine's shards for the tree whose root listens at --join, until SIGTERM or
    SIGINT. The agent restarts its shards under its own intensity, registers the host in the
    root's etcd under a lease it keeps alive, and stops every lane at once when it cannot. On
    the root: `keys init --client NAME --host`, then copy server.public and NAME.secret here.
    An etcd with TLS or users of its own is reached with what --config's \\[cluster] gives
    (etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file; etcd: other addresses).

    Example: orchestra-sup host --join tcp://10.0.0.2:7450 --keys ~/keys --name host-a
    """
    from orchestra_sup.supervisor.hostlink import HostJoin
    from orchestra_sup.supervisor.root import RootSupervisor
    from orchestra_sup.supervisor.runlock import refuse_owned

    # held until the supervisor's handler is in place; a host's agent re-reads nothing on it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    fmt = guarded(lambda: logformat.parse_format(log_format))
    logformat.configure(logformat.SUPERVISOR, 1, fmt)

    def prepare() -> tuple[Any, Any, HostJoin]:
        check_paths({"--keys": keys, "--state-dir": state_dir, "--run-dir": run_dir})
        check_host_options(name, join, listen)
        settings = load_settings(config, shards=shards, lanes_per_shard=lanes_per_shard)
        check_host_cluster(settings.cluster)
        offers = {"capabilities": parse_names("--capabilities", capabilities)}
        offers["tenants"] = parse_names("--tenants", tenants)
        given = {key: tuple(names) for key, names in offers.items() if names}
        settings = msgspec.structs.replace(
            settings, shards=msgspec.structs.replace(settings.shards, **given)
        )
        paths = resolve_paths(state_dir, run_dir, None)
        refuse_owned(paths.state_dir, paths.run_dir)
        where = str(keys.absolute())
        return settings, paths, HostJoin(root=join, keys_dir=where, name=name, listen=listen)

    settings, paths, joined = guarded(prepare)
    code = guarded(
        lambda: asyncio.run(RootSupervisor(paths, settings, log_format=fmt, join=joined).run())
    )
    raise typer.Exit(code)


def check_host_options(name: str, join: str, listen: str | None) -> None:
    """Raise `ConfigError` for a host name that is no key's name, or a `--join` or `--listen`
    that is not `tcp://HOST:PORT` (so a unit made for it is refused now, not at its start)."""
    check_name(name)
    if not is_tcp_address(join):
        raise ConfigError(f"--join {join!r}: give the root's [cluster] listen, tcp://HOST:PORT")
    if listen is not None and not is_tcp_address(listen):
        raise ConfigError(f"--listen {listen!r}: give this host's tcp://HOST:PORT")


def parse_names(option: str, text: str) -> list[str]:
    """The comma-separated names of `option` (`--capabilities`, `--tenants`). Raises
    `ConfigError` for one that is not a name."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not NAME_PATTERN.fullmatch(n):
            raise ConfigError(
                f"{option}: {n!r} is not a name (letters, digits, '_', '.', ':', '-'; at most 64)"
            )
    return names
