"""Where one tree keeps its files (`Paths`), and the defaults an unset path takes.

The state directory holds durable state (LMDB environments, sandboxes, the default workspace);
the run directory holds sockets and the lock. Defaults follow systemd's `StateDirectory=` and
`RuntimeDirectory=`, then the XDG base directories (`default_state_dir`, `default_run_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from orchestra_sup.errors import ConfigError
from orchestra_sup.system.pathcheck import check_path

IPC_PATH_MAX = 100
"""Longest socket path we use: AF_UNIX paths are limited to 107 bytes, and the run directory is the
prefix of every `ipc://` endpoint."""


class Paths(msgspec.Struct, frozen=True, kw_only=True):
    """Where one tree keeps its files.

    - `state_dir`: durable state (LMDB environments, sandboxes, the default workspace).
    - `run_dir`: sockets and the lock; mode 0700.
    - `workspace`: the git repository the custodian owns; None means `state_dir/workspace`, created.
    """

    state_dir: Path
    run_dir: Path
    workspace: Path | None

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.run_dir / (name + '.ipc')}"


def default_state_dir() -> Path:
    """`$STATE_DIRECTORY` (systemd), else `$XDG_STATE_HOME/orchestra-sup`, else
    `~/.local/state/orchestra-sup`."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "orchestra-sup"


def default_run_dir() -> Path:
    """`$ORCHESTRA_SUP_RUN_DIR`, else `$RUNTIME_DIRECTORY` (systemd), else
    `$XDG_RUNTIME_DIR/orchestra-sup`, else `/tmp/orchestra-sup-<uid>`."""
    if os.environ.get("ORCHESTRA_SUP_RUN_DIR"):
        return Path(os.environ["ORCHESTRA_SUP_RUN_DIR"])
    if os.environ.get("RUNTIME_DIRECTORY"):
        return Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "orchestra-sup"
    return Path(f"/tmp/orchestra-sup-{os.getuid()}")


def _env_source(names: tuple[str, ...]) -> str | None:
    """The first of the variables `names` that is set, as `$NAME`; None when none is."""
    return next((f"${name}" for name in names if os.environ.get(name)), None)


def resolve_paths(state_dir: Path | None, run_dir: Path | None, workspace: Path | None) -> Paths:
    """Fill in defaults and make paths absolute. The paths given are the caller's to check
    (`pathcheck.check_path`, naming its options); a default taken from the environment is
    checked here.

    Raises `ConfigError` when a default directory holds a control character or a line
    separator (naming the variable it came from), the run directory is too long for a socket
    path, the workspace is missing or not a directory, the state directory is a file, or it
    lies inside the workspace.
    """
    if run_dir is None:
        where = _env_source(("ORCHESTRA_SUP_RUN_DIR", "RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"))
        if where is not None:  # else /tmp/orchestra-sup-<uid>
            check_path(f"run directory (from {where})", default_run_dir())
    if state_dir is None:
        where = _env_source(("STATE_DIRECTORY", "XDG_STATE_HOME")) or "$HOME"
        check_path(f"state directory (from {where})", default_state_dir())
    run = (run_dir or default_run_dir()).absolute()
    longest = len(os.fsencode(run / "coordinator.ipc"))
    if longest > IPC_PATH_MAX:
        raise ConfigError(
            f"run directory {run} is too long for a socket path "
            f"({longest} > {IPC_PATH_MAX} bytes); pick a shorter --run-dir"
        )
    ws = workspace.absolute() if workspace is not None else None
    if ws is not None and not ws.is_dir():
        what = "does not exist" if not ws.exists() else "is not a directory"
        raise ConfigError(f"workspace {ws} {what}")
    state = (state_dir or default_state_dir()).absolute()
    if state.exists() and not state.is_dir():
        raise ConfigError(f"state directory {state} is not a directory")
    if ws is not None and Path(os.path.realpath(state)).is_relative_to(os.path.realpath(ws)):
        raise ConfigError(
            f"state directory {state} is inside the workspace {ws}; put it outside, or every "
            "sandbox would be a copy inside the tree it was cut from"
        )
    return Paths(state_dir=state, run_dir=run, workspace=ws)
