"""`orchestra-sup systemd-unit`: the unit file (`cli.unit`) for this installation, printed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestra_sup.cli.exits import guarded
from orchestra_sup.cli.host import check_host_options, parse_names
from orchestra_sup.cli.options import LanesOpt, ShardsOpt
from orchestra_sup.config import load_settings
from orchestra_sup.errors import ConfigError
from orchestra_sup.system.pathcheck import check_paths


def systemd_unit(
    user: Annotated[
        bool, typer.Option("--user", help="A user unit (systemctl --user), not a system one.")
    ] = False,
    template: Annotated[
        bool,
        typer.Option(
            "--template",
            help="orchestra-sup@.service: one tree per instance, config %E/orchestra-sup/%i.toml.",
        ),
    ] = False,
    workspace: Annotated[
        str | None,
        typer.Option(
            "--workspace",
            help="The git repository the custodian owns (systemd specifiers allowed: a "
            "literal % is written %%).",
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="The TOML config the unit starts with; it also sizes TimeoutStopSec= and "
            "WatchdogSec= (systemd specifiers allowed: then the defaults size them; a literal % "
            "is written %%).",
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="A host's agent's unit instead (orchestra-sup-host.service): `host --name "
            "NAME`, with --join and --keys, and --shards, --lanes-per-shard, --capabilities, "
            "--tenants as `host` takes them.",
        ),
    ] = None,
    join: Annotated[
        str | None, typer.Option("--join", help="With --host: the root's tcp://HOST:PORT.")
    ] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="With --host: the host's keys directory.")
    ] = None,
    listen: Annotated[
        str | None, typer.Option("--listen", help="With --host: its data port, tcp://HOST:PORT.")
    ] = None,
    shards: ShardsOpt = None,
    lanes_per_shard: LanesOpt = None,
    capabilities: Annotated[
        str | None, typer.Option("--capabilities", help="With --host: what its shards offer.")
    ] = None,
    tenants: Annotated[
        str | None, typer.Option("--tenants", help="With --host: whom its shards serve.")
    ] = None,
) -> None:
    """Print a systemd unit that runs `start` with this installation (Type=notify, watchdog,
    reload on SIGHUP, hardening); every directive carries a comment saying why. With --host,
    one that runs a host's agent (`orchestra-sup host`) instead.

    Example: orchestra-sup systemd-unit --workspace /srv/project > orchestra-sup.service

    Example: orchestra-sup systemd-unit --host host-a --join tcp://10.0.0.2:7450 --keys
    /etc/orchestra-sup/keys
    """
    from orchestra_sup.cli.unit import UnitSpec, installed_command, render

    def host_words() -> tuple[str, ...]:
        given = {
            "--listen": listen,
            "--shards": shards,
            "--lanes-per-shard": lanes_per_shard,
            "--capabilities": capabilities,
            "--tenants": tenants,
        }
        if host is None:
            extra = [k for k, v in {"--join": join, "--keys": keys, **given}.items() if v]
            if extra:
                raise ConfigError(f"{extra[0]} is for a host's unit: give --host NAME too")
            return ()
        if join is None or keys is None:
            raise ConfigError("--host needs --join tcp://ROOT:PORT and --keys DIR")
        check_host_options(host, join, listen)
        for option, names in (("--capabilities", capabilities), ("--tenants", tenants)):
            parse_names(option, names or "")
        if "%" not in keys and not Path(keys).is_dir():
            raise ConfigError(f"--keys {keys}: no such directory (server.public, NAME.secret)")
        words = ["--join", join, "--keys", _unit_path(keys) or keys, "--name", host]
        for option, value in given.items():
            if value is not None:
                words += [option, str(value)]
        return tuple(words)

    def spec() -> UnitSpec:
        check_paths({"--config": config, "--workspace": workspace})
        sizes = {"shards": shards, "lanes_per_shard": lanes_per_shard}
        settings = load_settings(None, **sizes)
        if config is not None and "%" not in config:
            settings = load_settings(Path(config), **sizes)
        if workspace is not None and "%" not in workspace and not Path(workspace).is_dir():
            raise ConfigError(f"workspace {workspace} is not a directory")
        return UnitSpec(
            command=installed_command(),
            user=user,
            template=template,
            workspace=_unit_path(workspace),
            config=_unit_path(config),
            settings=settings,
            host=host_words(),
        )

    sys.stdout.write(guarded(lambda: render(spec())))


def _unit_path(path: str | None) -> str | None:
    """`path` made absolute for a unit file (systemd has no working directory to resolve a
    relative one against); one that starts with a specifier (`%h/...`) is left as it is."""
    if path is None or path.startswith("%"):
        return path
    return str(Path(path).absolute())
