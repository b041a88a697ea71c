"""`coordinator.stepping`: the marker names the session whose step runs; it outlives a process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.coordinator.seat import json_problem
from orchestra_sup.coordinator.stepping import Marker, stepped


def test_the_marker_names_the_session_only_while_its_step_runs(tmp_path: Path) -> None:
    marker = Marker(tmp_path / "stepping")
    seen: list[str | None] = []

    def held() -> str | None:  # what a read of the file sees: the mapping is its page cache
        return (tmp_path / "stepping").read_bytes().rstrip(b"\0").decode() or None

    async def program() -> str:
        seen.append(held())
        await asyncio.sleep(0)
        seen.append(held())
        return "done"

    async def main() -> str:
        result = await stepped(program(), marker, "s1")
        seen.append(held())
        return result

    assert asyncio.run(main()) == "done"
    assert seen == ["s1", "s1", None]


def test_what_the_program_raises_and_what_is_thrown_in_go_through(tmp_path: Path) -> None:
    marker = Marker(tmp_path / "stepping")

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad")

    async def waits() -> None:
        await asyncio.sleep(60)

    async def main() -> None:
        with pytest.raises(ValueError, match="bad"):
            await stepped(fails(), marker, "s1")
        task = asyncio.ensure_future(stepped(waits(), marker, "s2"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert Marker(tmp_path / "stepping").blamed is None


def test_a_process_that_dies_in_a_step_is_blamed_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "stepping"
    code = (
        "import asyncio, os, sys\n"
        "from orchestra_sup.coordinator.stepping import Marker, stepped\n"
        "async def program():\n"
        "    os._exit(7)\n"
        "asyncio.run(stepped(program(), Marker(sys.argv[1]), 'abc123'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=os.environ)
    assert done.returncode == 7
    assert Marker(path).blamed == "abc123"
    assert Marker(path).blamed is None  # opening clears it: blamed once


def test_a_marker_path_that_is_no_regular_file_gives_no_marker(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("/dev/null")
    assert Marker.open(tmp_path / "dir") is None
    assert Marker.open(tmp_path / "link") is None
    assert Marker.open(tmp_path / "fine") is not None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, 2.5, None, True, "x"]}, None),
        ((1, 2), None),
        ({1, 2}, "a set is not a JSON value"),
        (b"abc", "a bytes is not a JSON value"),
        (float("nan"), "nan is not a finite number"),
        ({1: "a"}, "a dict key 1 is not a string"),
        (2**70, f"{2**70} does not fit in 64 bits"),
    ],
)
def test_json_problem(value: object, problem: str | None) -> None:
    assert json_problem(value) == problem


def test_json_problem_of_a_list_holding_itself() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert json_problem(loop) == "nested more than 64 deep"
