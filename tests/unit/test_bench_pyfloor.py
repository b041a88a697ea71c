"""`bench.pyfloor.answer`: the Python floor's peer does the custodian's inline work for real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra_sup.bench.pyfloor import answer
from orchestra_sup.bench.relay import request_frame
from orchestra_sup.errors import PathEscape
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "README").write_text("x" * 200)
    return Path(os.path.realpath(tmp_path))


def reply(root: Path, tool: str, path: str) -> f.Envelope:
    request = request_frame(f.ToolCall(tool=tool, params={"path": path}))
    return Codec().decode(answer(Codec(), root, 7, request))


def test_a_stat_is_answered_with_the_files_own_stat(root: Path) -> None:
    env = reply(root, "stat", "README")
    assert env.corr == Codec().decode(request_frame()).id and env.id == "custodian.1.f7"
    assert isinstance(env.body, f.ToolResult)
    assert env.body.value["type"] == "file" and env.body.value["size"] == 200
    assert env.body.value["mtime"] == (root / "README").stat().st_mtime


def test_a_read_file_is_answered_with_the_files_bytes(root: Path) -> None:
    (root / "README").write_text("hello")
    env = reply(root, "read_file", "README")
    assert isinstance(env.body, f.ToolResult) and env.body.value["text"] == "hello"


def test_the_tools_own_checks_run(root: Path) -> None:
    with pytest.raises(PathEscape):
        reply(root, "stat", "../README")
    with pytest.raises(FileNotFoundError):
        reply(root, "stat", "missing")
