"""Every command of `orchestra-sup` has an example in its --help, and every command that prints
something accepts --json: a command added without them fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from orchestra_sup.cli.app import app

NO_JSON = {
    "start": "prints nothing but the tree's log (stderr) while it runs",
    "host": "prints nothing but the agent's log (stderr) while it runs",
    "systemd-unit": "prints a unit file, itself the format systemd and tools read",
}
"""Commands exempt from --json, and why."""


def commands() -> Iterator[tuple[str, Any]]:
    """(path, command) for every leaf command, e.g. ("ctl top", <Command>)."""

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield " ".join(path), cmd
            return
        for name, sub in subs.items():
            yield from walk(sub, [*path, name])

    return walk(typer.main.get_command(app), [])


ALL = sorted(commands(), key=lambda pair: pair[0])
GROUPS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
"""Every name under the root, sub-apps ("ctl") and commands alike."""


def test_the_walk_sees_every_group() -> None:
    """The walk reaches into every sub-app (a broken walk would make the tests below vacuous)."""
    groups = {path.split()[0] for path, _ in ALL if " " in path}
    assert groups == {"ctl", "bench", "keys"}
    assert {"start", "ctl status", "ctl top", "keys init"} <= {path for path, _ in ALL}


@pytest.mark.parametrize("path", sorted({p for p, _ in ALL} | set(GROUPS)))
def test_help_has_an_example(path: str) -> None:
    """`--help` shows an "Example: orchestra-sup PATH ..." line for the command (or sub-app:
    `ctl`, `bench`, `keys`) itself."""
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert f"Example: orchestra-sup {path}" in result.output


@pytest.mark.parametrize(("path", "cmd"), ALL, ids=[path for path, _ in ALL])
def test_printing_commands_accept_json(path: str, cmd: Any) -> None:
    """Every command but the documented exemptions has a --json option."""
    options = {opt for param in cmd.params for opt in getattr(param, "opts", [])}
    assert ("--json" in options) != (path in NO_JSON), f"{path}: --json {options}"


@pytest.mark.parametrize(("path", "cmd"), ALL, ids=[path for path, _ in ALL])
def test_help_keeps_config_section_names(path: str, cmd: Any) -> None:
    """A "[section] key" the help text names (where a config key lives) is printed, not
    swallowed as rich markup, in the command's own help and its options' help."""
    texts = [cmd.help or "", *(getattr(param, "help", None) or "" for param in cmd.params)]
    wanted = {
        f"[{m.group(1)}] {m.group(2)}"
        for text in texts
        for m in re.finditer(r"\\?\[([a-z_]+)\] ([a-z_]+)", text)
    }
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for phrase in wanted:
        assert phrase in result.output, (phrase, result.output)
