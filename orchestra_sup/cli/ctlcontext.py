"""What every ctl command shares: where the tree is and how it is reached (`CtlContext`, the
`ctx.obj` of the `ctl` group), the options every command takes, declared once (`ctl_options`),
and their routine, one request answered and printed (`CtlCommand`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from orchestra_sup.cli.exits import EXIT_FAILED, fail, guarded
from orchestra_sup.cli.invocation import ctl_command
from orchestra_sup.cli.options import JsonOpt, RunDirOpt, TimeoutOpt, WideOpt, dressed, option
from orchestra_sup.cli.output import done, print_json, screen
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.paths import default_run_dir
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.keys import DEFAULT_CLIENT, ClientKeys

A = TypeVar("A", bound=f.Frame)


class CtlContext:
    """What every ctl command shares: where the tree is, and for a remote one (`connect`, a
    `tcp://` address) the CURVE client keys to reach it with."""

    def __init__(
        self,
        run_dir: Path | None,
        connect: str | None,
        keys: ClientKeys | None,
        keys_dir: Path | None,
    ):
        self.group_run_dir = run_dir
        self.connect = connect
        self.keys = keys
        self.keys_dir = keys_dir

    def command(self, run_dir: Path | None) -> str:
        """The ctl command that reaches this tree, as a hint to paste (`invocation`)."""
        key = self.keys.name if self.keys is not None and self.keys.name != DEFAULT_CLIENT else None
        return ctl_command(run_dir or self.group_run_dir, self.connect, self.keys_dir, key)

    def run_dir(self, override: Path | None) -> Path:
        return (override or self.group_run_dir or default_run_dir()).absolute()

    def client(self, run_dir: Path | None) -> CtlClient:
        """A client of the tree; raises `TreeUnreachable` when no tree runs at the run dir."""
        return CtlClient(self.run_dir(run_dir), connect=self.connect, keys=self.keys)


@dataclass(frozen=True)
class CtlCommand:
    """One ctl command as it was called: the group's `CtlContext` and the command's own
    --json (`as_json`), --wide, --timeout (seconds) and --run-dir (None: the group's)."""

    context: CtlContext
    as_json: bool
    timeout: float
    run_dir: Path | None
    wide: bool = False

    def client(self) -> CtlClient:
        """A client of the tree; raises `TreeUnreachable` when no tree runs at the run dir."""
        return self.context.client(self.run_dir)

    def where(self) -> Path:
        """The tree's run directory, absolute."""
        return self.context.run_dir(self.run_dir)

    def command(self) -> str:
        """The ctl command that reaches this tree, as a hint to paste (`invocation`)."""
        return self.context.command(self.run_dir)

    def screen(self) -> tuple[Console, int | None]:
        """Where a table is printed and the width it is fitted to (`output.screen`, --wide)."""
        return screen(self.wide)

    def ask(self, body: f.Body, about: str = "") -> f.Body:
        """Send `body` to the tree, waiting up to --timeout, and return its answer. The tree's
        errors end the command as `exits.guarded` says: one line on stderr, exit 2 for bad
        input (a remote BAD_REQUEST, NOT_FOUND...), 3 for an unreachable tree, else 1. A
        refusal of the request as bad (`bad_request`) begins with `about` when given (the
        plan file a submit sent), as a refusal read from the file does."""

        def go() -> f.Body:
            with self.client() as client:
                try:
                    return client.request(body, timeout_s=self.timeout)
                except RemoteError as exc:
                    if about and exc.code is ErrorCode.BAD_REQUEST:
                        raise RemoteError(exc.code, f"{about}: {exc.message}") from None
                    raise

        return guarded(go)

    def expect(self, answer: type[A], body: f.Body, about: str = "") -> A:
        """`ask` (with `about`), and its answer checked to be an `answer`; any other ends the
        command with one line naming both and exit 1."""
        reply = self.ask(body, about)
        if not isinstance(reply, answer):
            raise fail(
                f"the tree answered {type(body).__name__} with {type(reply).__name__}, "
                f"not {answer.__name__}",
                EXIT_FAILED,
            )
        return reply

    def show(
        self,
        answer: type[A],
        body: f.Body,
        *,
        json: Callable[[A], Any],
        table: Callable[[A], object],
    ) -> None:
        """The routine of a ctl command: `expect` an `answer` to `body`, then print it, with
        --json as `json(answer)` (JSON on stdout, `output.print_json`), else by `table(answer)`
        (a table or lines, for a person)."""
        reply = self.expect(answer, body)
        if self.as_json:
            print_json(json(reply))
        else:
            table(reply)

    def done(self, value: dict[str, Any], text: str) -> None:
        """What the command did: `value` as JSON with --json, else the line `text`."""
        done(self.as_json, value, text)


def ctl_options(
    timeout: float = 10.0,
    *,
    wide: bool = False,
    json_option: Any = JsonOpt,
    timeout_option: Any = TimeoutOpt,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a ctl command the options every one takes, after its own: --json, --wide (with
    `wide`), --timeout (seconds, default `timeout`) and --run-dir. The command's first parameter
    is the `CtlCommand` built from them; typer sees, by `__signature__`, the command's own
    parameters with the typer context before them and these options after. `json_option` and
    `timeout_option` (an `Annotated[type, typer.Option(...)]`) stand for `options.JsonOpt` and
    `options.TimeoutOpt` where a command's --json or --timeout says more."""
    options = [
        option("as_json", json_option, False),
        *([option("wide", WideOpt, False)] if wide else []),
        option("timeout", timeout_option, timeout),
        option("run_dir", RunDirOpt, None),
    ]
    context = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
    )

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        def run(ctx: typer.Context, **kwargs: Any) -> None:
            called = {o.name: kwargs.pop(o.name) for o in options}
            command(CtlCommand(ctx.obj, **called), **kwargs)

        return dressed(run, command, before=[context], skip=1, after=options)

    return decorate
