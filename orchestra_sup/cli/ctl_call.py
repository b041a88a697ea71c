"""`ctl call`: one of the coordinator's tools called through the real relay."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_USAGE, fail
from orchestra_sup.cli.output import print_json
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.tools import call_params


@ctl_options(60.0)
def call(
    ctl: CtlCommand,
    tool: Annotated[str, typer.Argument(help="read_file, list_dir, stat, list_lanes, ...")],
    params: Annotated[
        list[str] | None, typer.Argument(metavar="[KEY=VALUE]...", help="Tool parameters.")
    ] = None,
) -> None:
    """Call one of the coordinator's tools through the real relay.

    Read tools (answered by the custodian) take `path` (and `pattern` for search, `rev` for diff
    and log); lane tools take `lane`, but start_lane, which takes `run` and optionally `name`,
    `timeout_s`, `requires` (CAP,CAP), `tenant`, `ticket`, `program`, `key`, `rev` (the
    workspace revision its sandbox is made at), `commit` (true or false) and `feedback`. A path
    whose bytes are not UTF-8 is sent as `path_b64`, as are names in the answers.
    Example: orchestra-sup ctl call read_file path=README.md
    """
    try:
        pairs = call_params(params or [])
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    reply = ctl.ask(f.CtlCall(tool=tool, params=pairs))
    assert isinstance(reply, f.ToolResult)
    value = reply.value
    if not ctl.as_json and tool == "read_file" and isinstance(value, dict) and "text" in value:
        sys.stdout.write(value["text"])
    else:
        print_json(value)
