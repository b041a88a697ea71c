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
from orchestra_sup.protocol.tokens import OPERATE, TOKENS_DIR, issue_token
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
    http_token: Annotated[
        str | None,
        typer.Option(
            "--http-token",
            help="Make a bearer token of this name for the HTTP API instead (printed once).",
        ),
    ] = None,
    role: Annotated[
        str,
        typer.Option("--role", help="The token's role: read, or operate (with --http-token)."),
    ] = OPERATE,
    as_json: JsonOpt = False,
) -> None:
    """Create the tree's CURVE keys: the server keypair and client keypairs it allows
    (default: one, "operator"); or, with --http-token NAME, a bearer token for the HTTP API
    with --role read (sees everything, changes nothing) or operate (the default), printed
    once and kept only hashed. Files 0600 in a 0700 directory; never overwrites a key. On a
    directory that has the server key already, only the clients are added (restart the tree to
    admit them). A remote operator needs server.public and their NAME.secret; so does a host,
    whose key is made with --host.

    Example: orchestra-sup keys init --client alice --client ci

    Example: orchestra-sup keys init --client host-a --host

    Example: orchestra-sup keys init --http-token dashboard --role read
    """
    guarded(lambda: check_paths({"--dir": directory, "--state-dir": state_dir}))
    where = (directory or default_keys_dir(state_dir or default_state_dir())).absolute()
    if http_token is not None:
        if clients or host:
            raise fail("--http-token makes a token only: give --client in another call", EXIT_USAGE)
        _token(where, http_token, role, as_json)
        return
    if role != OPERATE:
        raise fail("--role is for --http-token", EXIT_USAGE)
    if host and not clients:
        raise fail("--host needs the host's name: --client NAME --host", EXIT_USAGE)
    written = guarded(lambda: init_keys(where, clients or [DEFAULT_CLIENT], host=host))
    if as_json:
        print_json({"dir": str(where), "files": [str(p) for p in written]})
        return
    for path in written:
        out.print(str(path))


def _token(where: Path, name: str, role: str, as_json: bool) -> None:
    """Make HTTP token `name` in `where` and print it, the one time it is shown."""
    token = guarded(lambda: issue_token(where, name, role))
    path = where / TOKENS_DIR / f"{name}.toml"
    if as_json:
        print_json({"token": token, "name": name, "role": role, "file": str(path)})
        return
    out.print(token)
    typer.echo(
        f"HTTP token {name!r} ({role}): shown this once; {path} keeps only its SHA-256 "
        "(delete that file to revoke it)",
        err=True,
    )
