"""Tests for `orchestra_sup.supervisor.gate`: one change of the tree at a time, and the root
supervisor's collaborators seeing it only through their views (`supervisor.views`)."""

from __future__ import annotations

import ast
import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import orchestra_sup.supervisor as supervisor_package
from orchestra_sup.supervisor.gate import Busy, ChangeGate
from orchestra_sup.supervisor.reload import Reloads


@dataclass(frozen=True)
class Moving:
    id: str
    target: str


def tree(loop: asyncio.AbstractEventLoop) -> Any:
    """A running tree with no children, as a reload sees it (`views.TreeHost`)."""
    return cast(
        Any,
        SimpleNamespace(
            stopping=False,
            tree=SimpleNamespace(running=True),
            spawn=loop.create_task,
            children=SimpleNamespace(workers=[], summary=lambda: "0/0 children running"),
        ),
    )


def test_the_gate_is_held_until_the_changes_task_is_done() -> None:
    async def main() -> None:
        gate = ChangeGate()
        assert not gate.held() and not gate.reloading() and gate.rollover() is None
        release = asyncio.Event()
        task = asyncio.get_running_loop().create_task(release.wait())
        moving = Moving("abcd1234", "shards")
        gate.enter(task, moving)
        assert gate.rollover() is moving and not gate.reloading()
        with pytest.raises(AssertionError):
            gate.enter(asyncio.get_running_loop().create_task(asyncio.sleep(0)))
        release.set()
        await task
        assert not gate.held() and gate.rollover() is None

    asyncio.run(main())


def test_a_reload_holds_the_gate_and_is_refused_while_a_rollover_does() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = ChangeGate()
        reloads = Reloads(tree(loop), gate, None)
        task = reloads.begin()
        assert gate.reloading()  # a rollover asked now is refused busy
        with pytest.raises(Busy, match="a config reload is already in progress"):
            reloads.begin()
        report = await task
        assert not report.refused and not gate.held()
        release = asyncio.Event()
        gate.enter(loop.create_task(release.wait()), Moving("abcd1234", "all"))
        with pytest.raises(Busy) as info:
            reloads.begin()
        assert str(info.value) == (
            "rollover abcd1234 of all is running; reload once it is done (ctl rollover prints when)"
        )
        release.set()

    asyncio.run(main())


def imported(path: Path) -> set[str]:
    """Every module `path` imports, wherever the import is (a function, `TYPE_CHECKING`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_collaborator_of_the_root_supervisor_imports_it() -> None:
    """The root hands each collaborator a view (`supervisor.views`); none imports the root, not
    even for a type, so the supervisor package has no import circle through it."""
    package = Path(supervisor_package.__file__).parent
    offenders = sorted(
        path.name
        for path in package.glob("*.py")
        if path.name != "root.py" and "orchestra_sup.supervisor.root" in imported(path)
    )
    assert offenders == []
