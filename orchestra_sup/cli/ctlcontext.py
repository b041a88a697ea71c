"""What every ctl command shares: where the tree is and how it is reached (`CtlContext`, the
`ctx.obj` of the `ctl` group)."""

from __future__ import annotations

from pathlib import Path

from orchestra_sup.cli.exits import guarded
from orchestra_sup.cli.invocation import ctl_command
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.config import default_run_dir
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.keys import DEFAULT_CLIENT, ClientKeys


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
        def go() -> f.Body:
            with self.client(run_dir) as client:
                return client.request(body, timeout_s=timeout)

        return guarded(go)
