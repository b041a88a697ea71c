"""`orchestra-sup ctl`: the group that talks to a running tree, its options (where the tree is,
how to reach a remote one) and its commands, listed in the order `ctl --help` shows them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestra_sup.cli import (
    ctl_answers,
    ctl_call,
    ctl_events,
    ctl_lifecycle,
    ctl_logs,
    ctl_plans,
    ctl_prune,
    ctl_view,
)
from orchestra_sup.cli.ctlcontext import CtlContext
from orchestra_sup.cli.exits import guarded
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.keys import DEFAULT_CLIENT, ClientKeys, load_client_keys

ctl_app = typer.Typer(
    help="Talk to a running tree.\n\n"
    "Example: orchestra-sup ctl --run-dir /run/orchestra-sup status",
    no_args_is_help=True,
)


@ctl_app.callback()
def ctl_main(
    ctx: typer.Context,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="The tree's run directory.")
    ] = None,
    connect: Annotated[
        str | None,
        typer.Option(
            "--connect",
            help="A remote tree's ctl endpoint, tcp://HOST:PORT (its start --ctl-tcp), reached "
            "with CURVE keys from --keys.",
        ),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option(
            "--keys",
            help="Directory with server.public and KEY.secret (from keys init) for --connect.",
        ),
    ] = None,
    key: Annotated[
        str, typer.Option("--key", help="The client key's name in --keys.")
    ] = DEFAULT_CLIENT,
) -> None:
    """Talk to the tree whose run directory is RUN_DIR (default: as `start` picks it), or with
    --connect to a remote tree over CURVE."""

    def client_keys() -> ClientKeys | None:
        if connect is None:
            if keys is not None:
                raise ConfigError("--keys is for --connect; give both or neither")
            return None
        if not connect.startswith("tcp://"):
            raise ConfigError(f"--connect {connect}: give a tcp://HOST:PORT address")
        if keys is None:
            raise ConfigError(f"--connect {connect}: a tcp:// endpoint needs --keys DIR")
        return load_client_keys(keys, key)

    ctx.obj = CtlContext(run_dir, connect, guarded(client_keys), keys)


for name, command in (
    ("status", ctl_view.status),
    ("tree", ctl_view.tree),
    ("restart", ctl_lifecycle.restart),
    ("stop", ctl_lifecycle.stop),
    ("stop-host", ctl_lifecycle.stop_host),
    ("submit", ctl_plans.submit),
    ("plans", ctl_plans.plans_cmd),
    ("plan", ctl_plans.plan_cmd),
    ("prune", ctl_prune.prune),
    ("message", ctl_plans.message),
    ("call", ctl_call.call),
    ("lanes", ctl_view.lanes),
    ("top", ctl_view.top),
    ("cancel", ctl_plans.cancel),
    ("approve", ctl_answers.approve),
    ("reject", ctl_answers.reject),
    ("redirect", ctl_answers.redirect),
    ("accept-partial", ctl_answers.accept_partial),
    ("logs", ctl_logs.logs),
    ("events", ctl_events.events),
    ("rollover", ctl_lifecycle.rollover),
    ("reload", ctl_lifecycle.reload),
):
    ctl_app.command(name)(command)
