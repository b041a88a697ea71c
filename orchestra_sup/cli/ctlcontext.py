"""What every ctl command shares: where the tree is, how it is reached, and the routine of most
of them, one request answered and printed (`CtlContext`, the `ctx.obj` of the `ctl` group)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from orchestra_sup.cli.exits import EXIT_FAILED, fail, guarded
from orchestra_sup.cli.invocation import ctl_command
from orchestra_sup.cli.output import print_json
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.config import default_run_dir
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

    def ask(self, body: f.Body, timeout: float, run_dir: Path | None) -> f.Body:
        """Send `body` to the tree, waiting up to `timeout` seconds, and return its answer. The
        tree's errors end the command as `exits.guarded` says: one line on stderr, exit 2 for
        bad input (a remote BAD_REQUEST, NOT_FOUND...), 3 for an unreachable tree, else 1."""

        def go() -> f.Body:
            with self.client(run_dir) as client:
                return client.request(body, timeout_s=timeout)

        return guarded(go)

    def expect(self, answer: type[A], body: f.Body, timeout: float, run_dir: Path | None) -> A:
        """`ask`, and its answer checked to be an `answer`; any other ends the command with one
        line naming both and exit 1."""
        reply = self.ask(body, timeout, run_dir)
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
        as_json: bool,
        timeout: float,
        run_dir: Path | None,
        json: Callable[[A], Any],
        table: Callable[[A], object],
    ) -> None:
        """The routine of a ctl command: `expect` an `answer` to `body`, then print it, with
        --json (`as_json`) as `json(answer)` (JSON on stdout, `output.print_json`), else by
        `table(answer)` (a table or lines, for a person)."""
        reply = self.expect(answer, body, timeout, run_dir)
        if as_json:
            print_json(json(reply))
        else:
            table(reply)
