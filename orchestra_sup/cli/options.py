"""The options and arguments more than one `orchestra-sup` command takes, declared once so
that their flags and help read the same everywhere, and how a decorator adds them to a
command's signature (`option`, `dressed`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

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


def option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    """The parameter `name: annotation = default`, for `dressed`: `annotation` is one of the
    `Annotated[type, typer.Option(...)]` above (or a command's own)."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def dressed(
    run: Callable[..., None],
    command: Callable[..., Any],
    *,
    before: Sequence[inspect.Parameter] = (),
    skip: int = 0,
    after: Sequence[inspect.Parameter] = (),
) -> Callable[..., None]:
    """`run` (which takes keyword arguments) dressed as `command` for typer: `command`'s name
    and docstring, and the signature typer reads (`__signature__`, annotations evaluated):
    `before`, `command`'s parameters less its first `skip`, then `after`, in the order --help
    lists them. Raises `NameError` (when the command's module is imported) if an annotation of
    `command` names what its module does not import at run time."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())[skip:]
    parameters = [*before, *own, *after]
    functools.update_wrapper(run, command)
    run.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    return run
