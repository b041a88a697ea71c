"""How the `orchestra-sup` command ends: its exit statuses, and the product's errors turned into
one line on stderr and the documented status.

Exit statuses: 0 success; 1 a plan had a task that did not succeed, or a request failed;
2 bad input (a plan, a config, a path); 3 the tree is unreachable (ctl) or restart intensity was
exceeded (start); 130 interrupted (Ctrl-C, or SIGTERM where a command unwinds on it). Bad input
is one line on stderr, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import typer

from orchestra_sup.errors import (
    ConfigError,
    DirBusy,
    ErrorCode,
    OrchestraError,
    RemoteError,
    TreeUnreachable,
    WorkspaceError,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as a shell reports a command Ctrl-C ended."""

T = TypeVar("T")


def fail(message: str, code: int) -> typer.Exit:
    """Print "orchestra-sup: MESSAGE" on stderr; return the `typer.Exit(code)` to raise."""
    typer.echo(f"orchestra-sup: {message}", err=True)
    return typer.Exit(code)


def guarded(fn: Callable[[], T]) -> T:
    """Run `fn`, turning the product's errors into one line and the documented exit status."""
    try:
        return fn()
    except (ConfigError, WorkspaceError, DirBusy) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except TreeUnreachable as exc:
        raise fail(str(exc), EXIT_UNREACHABLE) from None
    except RemoteError as exc:
        bad_input = exc.code in (
            ErrorCode.BAD_REQUEST,
            ErrorCode.NOT_FOUND,
            ErrorCode.PATH_ESCAPE,
            ErrorCode.VERSION_SKEW,
            ErrorCode.TOO_LARGE,
        )
        raise fail(str(exc), EXIT_USAGE if bad_input else EXIT_FAILED) from None
    except OrchestraError as exc:
        raise fail(str(exc), EXIT_FAILED) from None
