"""`orchestra-sup keys`: the tree's CURVE keys for tcp:// endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestra_sup.cli.exits import EXIT_USAGE, fail, guarded
from orchestra_sup.cli.options import JsonOpt, StateOpt
from orchestra_sup.cli.output import out, print_json
from orchestra_sup.paths import default_state_dir
from orchestra_sup.protocol.keys import DEFAULT_CLIENT, default_keys_dir, init_keys
from orchestra_sup.system.pathcheck import check_paths

keys_app = typer.Typer(
    help="The tree's CURVE keys for tcp:// endpoints.\n\nExample: orchestra-sup keys init",
    no_args_is_help=True,
)


@keys_app.command("init")
def keys_init(
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Where to put them (default: STATE/keys).")
    ] = None,
    state_dir: StateOpt = None,
    clients: Annotated[
        list[str] | None,
        typer.Option("--client", help="A client keypair to make and allow (repeatable)."),
    ] = None,
    host: Annotated[
        bool,
        typer.Option(
            "--host",
            help="The clients are hosts' agents: admitted only on the endpoint where hosts "
            "join, each only as the host of its own name; they cannot use ctl.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create the tree's CURVE keys: the server keypair and client keypairs it allows
    (default: one, "operator"). Files 0600 in a 0700 directory; never overwrites a key. On a
    directory that has the server key already, only the clients are added (restart the tree to
    admit them). A remote operator needs server.public and their NAME.secret; so does a host,
    whose key is made with --host.

    Example: orchestra-sup keys init --client alice --client ci

    Example: orchestra-sup keys init --client host-a --host
    """
    guarded(lambda: check_paths({"--dir": directory, "--state-dir": state_dir}))
    if host and not clients:
        raise fail("--host needs the host's name: --client NAME --host", EXIT_USAGE)
    where = (directory or default_keys_dir(state_dir or default_state_dir())).absolute()
    written = guarded(lambda: init_keys(where, clients or [DEFAULT_CLIENT], host=host))
    if as_json:
        print_json({"dir": str(where), "files": [str(p) for p in written]})
        return
    for path in written:
        out.print(str(path))
