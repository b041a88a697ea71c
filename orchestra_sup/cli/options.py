"""The options and arguments more than one `orchestra-sup` command takes, declared once so
that their flags and help read the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for programs.")]
WideOpt = Annotated[
    bool, typer.Option("--wide", help="Every column, lines as long as they need (as piped).")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the tree to answer.")
]
WorkspaceOpt = Annotated[
    Path | None, typer.Option("--workspace", help="The git repository the custodian owns.")
]
StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="Durable state directory.")]
ShardsOpt = Annotated[int | None, typer.Option("--shards", help="Number of worker shards.")]
LanesOpt = Annotated[
    int | None, typer.Option("--lanes-per-shard", help="Lanes one shard hosts at most.")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file.")]
RunDirOpt = Annotated[
    Path | None,
    typer.Option("--run-dir", help="The tree's run directory (also accepted before the command)."),
]
LaneArg = Annotated[str, typer.Argument(help="The lane id (see `ctl lanes`).")]
