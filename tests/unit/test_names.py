"""File names the file system and git allow, however hostile, through every read tool and the
commit path (issue 24), against real git repositories in tmp_path; and `protocol.names`, the
wire form of a name that is not UTF-8."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.custodian import history, readtools, searchproc
from orchestra_sup.custodian.workspace import Workspace, open_workspace
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import names

HOSTILE: dict[str, bytes] = {
    "not-utf8": b"caf\xe9.txt",
    "newline": b"new\nline.txt",
    "leading-dash": b"--output=pwned",
    "leading-space": b" space.txt",
    "glob-magic": b":(glob)x",
    "exclude-magic": b":!x",
    "star": b"*",
    "quote-backslash": b'q"uo\\te.txt',
}
"""Names a lane can create; each is listed, read, searched, diffed, logged and committed as
itself. `x` (which the magic names and `*` would match as pathspecs) is in the base commit."""


def _git(cwd: Path, *args: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    ).stdout


def _name(raw: bytes) -> str:
    return os.fsdecode(raw)


def _exact(fields: dict, key: str) -> bytes:
    """The exact bytes of the name `fields` carry under `key` (the client's side of it)."""
    name = names.from_wire(fields, key)
    assert name is not None
    return os.fsencode(name)


def _json_round_trip(value: object) -> object:
    """What a client gets: the answer as JSON (as msgpack, it would fail the same way)."""
    return msgspec.json.decode(msgspec.json.encode(value))


# --- the wire form -------------------------------------------------------------------------------


def test_a_utf8_name_is_itself_and_any_other_carries_its_bytes() -> None:
    assert names.wire("name", "café.txt") == {"name": "café.txt"}
    odd = names.wire("name", _name(b"caf\xe9.txt"))
    assert odd == {"name": "caf\ufffd.txt", "name_b64": base64.b64encode(b"caf\xe9.txt").decode()}
    assert _exact(odd, "name") == b"caf\xe9.txt"
    assert names.request_param("path", _name(b"caf\xe9.txt")) == ("path_b64", odd["name_b64"])
    assert names.request_param("path", "café") == ("path", "café")


def test_path_b64_is_the_name_when_both_are_given() -> None:
    """So the fields of an answer can be sent back as they are."""
    assert readtools.path_param({"path": "caf\ufffd", "path_b64": "Y2Fm6Q=="}) == _name(b"caf\xe9")


@pytest.mark.parametrize(
    "fields", [{"path_b64": "not base64!"}, {"path_b64": "YQ"}], ids=["not-base64", "unpadded"]
)
def test_a_bad_path_parameter_is_bad_request(fields: dict[str, str]) -> None:
    with pytest.raises(RemoteError) as info:
        readtools.path_param(fields)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_a_missing_path_is_the_root_or_refused_where_required() -> None:
    assert readtools.path_param({}) == ""
    with pytest.raises(RemoteError) as info:
        readtools.path_param({}, required=True)
    assert info.value.code is ErrorCode.BAD_REQUEST


# --- read tools ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose base commit holds `x`, and whose second commit adds every HOSTILE
    name (each holding `needle <its key>`)."""
    root = tmp_path_factory.mktemp("hostile") / "ws"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "x").write_text("needle base\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")
    for key, raw in HOSTILE.items():
        with open(os.path.join(os.fsencode(root), raw), "w") as out:
            out.write(f"needle {key}\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "hostile names")
    return root


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_every_inline_read_tool_takes_and_answers_the_exact_name(
    hostile_ws: Path, raw: bytes
) -> None:
    """list_dir, stat and read_file, as a client sees them: each name comes back exact (as text
    when it is UTF-8), and the name given back reaches the same file."""
    listing = _json_round_trip(readtools.list_dir(hostile_ws, ""))
    assert isinstance(listing, dict)
    (entry,) = [e for e in listing["entries"] if _exact(e, "name") == raw]
    assert ("name_b64" in entry) == (raw == HOSTILE["not-utf8"])
    path = readtools.path_param({k.replace("name", "path"): v for k, v in entry.items()})
    stat = _json_round_trip(readtools.stat(hostile_ws, path))
    assert isinstance(stat, dict) and stat["type"] == "file" and _exact(stat, "path") == raw
    read = _json_round_trip(readtools.read_file(hostile_ws, path))
    assert isinstance(read, dict) and _exact(read, "path") == raw
    assert read["text"].startswith("needle ")


def test_search_answers_every_match_under_its_exact_name(hostile_ws: Path) -> None:
    """search, in its child process as the custodian runs it: one match per file, each under
    its exact name (on main the child could not encode a name that is not UTF-8, and the search
    failed `internal`)."""
    found = asyncio.run(searchproc.search(hostile_ws, "", "needle", 100))
    assert sorted(_exact(m, "path") for m in found["matches"]) == sorted([b"x", *HOSTILE.values()])
    one = asyncio.run(searchproc.search(hostile_ws, _name(HOSTILE["not-utf8"]), "needle", 10))
    assert [_exact(m, "path") for m in one["matches"]] == [HOSTILE["not-utf8"]]
    assert _exact(one, "path") == HOSTILE["not-utf8"]


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_diff_and_log_take_a_name_literally_never_as_an_option(
    hostile_ws: Path, raw: bytes, tmp_path: Path
) -> None:
    """diff and log restricted to a hostile name see that one file only: pathspec magic, a
    glob and a leading `-` are the name itself, never `x` as well, never an option (an
    `--output=` would have written a file)."""
    name = _name(raw)
    diff = asyncio.run(history.diff(hostile_ws, name, "HEAD~1"))
    assert _exact(diff, "path") == raw
    key = next(k for k, v in HOSTILE.items() if v == raw)
    assert diff["diff"].count("diff --git") == 1 and f"+needle {key}" in diff["diff"]
    log = asyncio.run(history.log(hostile_ws, name))
    assert [c["subject"] for c in log["commits"]] == ["hostile names"]
    assert not (hostile_ws / "pwned").exists() and not Path("pwned").exists()


def test_diff_names_a_file_that_is_not_utf8_exactly_whatever_the_config(
    hostile_ws: Path,
) -> None:
    """With `core.quotePath=false` in the repository's config git would write the raw byte,
    which UTF-8 decoding turns into U+FFFD; the read tools force git's C-quoting instead."""
    _git(hostile_ws, "config", "core.quotePath", "false")
    try:
        diff = asyncio.run(history.diff(hostile_ws, _name(HOSTILE["not-utf8"]), "HEAD~1"))
    finally:
        _git(hostile_ws, "config", "--unset", "core.quotePath")
    assert '"b/caf\\351.txt"' in diff["diff"] and "\ufffd" not in diff["diff"]


# --- commits -------------------------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "x").write_text("x\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")
    return asyncio.run(open_workspace(root, tmp_path / "state"))


def test_a_sandbox_full_of_hostile_names_commits_each_as_itself(
    ws: Workspace, tmp_path: Path
) -> None:
    """Every hostile name a lane creates lands in one commit under its exact bytes, and is
    checked out under them in the workspace; `x` is untouched."""
    path, _ = asyncio.run(ws.create_sandbox("l", tmp_path / "sb" / "l"))
    for key, raw in HOSTILE.items():
        with open(os.path.join(os.fsencode(path), raw), "w") as out:
            out.write(f"{key}\n")
    head = asyncio.run(ws.commit_sandbox("l", Path(path), "hostile"))
    assert head is not None
    changed = _git(ws.root, "diff-tree", "-z", "--no-commit-id", "--name-only", "-r", "HEAD")
    assert sorted(changed.split(b"\0")[:-1]) == sorted(HOSTILE.values())
    for key, raw in HOSTILE.items():
        with open(os.path.join(os.fsencode(ws.root), raw)) as got:
            assert got.read() == f"{key}\n"
    assert _git(ws.root, "status", "--porcelain") == b""


# --- ctl call ------------------------------------------------------------------------------------


def test_ctl_call_refuses_an_argument_that_is_not_utf8_other_than_a_path(tmp_path: Path) -> None:
    """One line and exit 2, before any tree is asked (none runs here): only `path=` has a bytes
    form to be sent as."""
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tmp_path)]
    proc = subprocess.run(
        [*argv, "call", "search", b"pattern=caf\xe9"],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "orchestra-sup: parameter 'pattern=caf\\udce9' is not UTF-8 (only path= may name any "
        "bytes)\n"
    )
