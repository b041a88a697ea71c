"""`orchestra-sup systemd-unit`: the unit file (`cli.unit`) for this installation, printed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestra_sup.cli.exits import guarded
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
) -> None:
    """Print a systemd unit that runs `start` with this installation (Type=notify, watchdog,
    reload on SIGHUP, hardening); every directive carries a comment saying why.

    Example: orchestra-sup systemd-unit --workspace /srv/project > orchestra-sup.service
    """
    from orchestra_sup.cli.unit import UnitSpec, installed_command, render

    def spec() -> UnitSpec:
        check_paths({"--config": config, "--workspace": workspace})
        settings = load_settings(None)
        if config is not None and "%" not in config:
            settings = load_settings(Path(config))
        if workspace is not None and "%" not in workspace and not Path(workspace).is_dir():
            raise ConfigError(f"workspace {workspace} is not a directory")
        return UnitSpec(
            command=installed_command(),
            user=user,
            template=template,
            workspace=_unit_path(workspace),
            config=_unit_path(config),
            settings=settings,
        )

    sys.stdout.write(guarded(lambda: render(spec())))


def _unit_path(path: str | None) -> str | None:
    """`path` made absolute for a unit file (systemd has no working directory to resolve a
    relative one against); one that starts with a specifier (`%h/...`) is left as it is."""
    if path is None or path.startswith("%"):
        return path
    return str(Path(path).absolute())
