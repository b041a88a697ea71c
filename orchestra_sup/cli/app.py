"""The `orchestra-sup` command: a thin adapter that parses, sends, and renders.

Its commands live a group or a concept a module (`start`, `ctl`, `bench`, `keys`,
`systemd_unit`, `doctor`); this module puts them together, in the order `--help` lists them, and
runs them (`main`). Exit statuses are `exits`'s: 0 success, 1 failed, 2 bad input, 3 unreachable.
"""

from __future__ import annotations

import sys

import typer

from orchestra_sup.cli.bench import bench_app
from orchestra_sup.cli.ctl import ctl_app
from orchestra_sup.cli.doctor import doctor
from orchestra_sup.cli.exits import EXIT_INTERRUPTED, EXIT_USAGE
from orchestra_sup.cli.host import host
from orchestra_sup.cli.keys import keys_app
from orchestra_sup.cli.options import JsonOpt
from orchestra_sup.cli.output import print_json
from orchestra_sup.cli.start import run, start
from orchestra_sup.cli.systemd_unit import systemd_unit
from orchestra_sup.release import INSTALLED_VERSION

app = typer.Typer(
    help="A supervisor that gives an agent platform's coordinator, tree custodian and worker "
    "shards their own OS processes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def version(as_json: JsonOpt = False) -> None:
    """Print the version (with --json: {"version"}).

    Example: orchestra-sup version --json
    """
    if as_json:
        print_json({"version": INSTALLED_VERSION})
    else:
        typer.echo(INSTALLED_VERSION)


app.command()(start)
app.command()(host)
app.command()(run)
app.command("systemd-unit")(systemd_unit)
app.command()(doctor)
app.command()(version)
app.add_typer(ctl_app, name="ctl")
app.add_typer(bench_app, name="bench")
app.add_typer(keys_app, name="keys")


def main() -> None:
    """Run the CLI. Usage errors are one line and exit 2, like every other bad input."""
    try:
        code = app(standalone_mode=False)
    except _ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        typer.echo(f"orchestra-sup: {exc.format_message()}{hint}", err=True)
        sys.exit(EXIT_USAGE)
    except typer.Abort:
        typer.echo("orchestra-sup: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


# typer vendors click in recent releases and re-exports only some of it; BadParameter's bases
# give its ClickException (usage errors and bad values) whichever click is underneath.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
