"""A lane can name a file anything the file system and git allow (issue 24): `ctl call` and the
read tools answer every name exactly, commits land every name as itself, and no name costs the
custodian its process or the tree its life."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import Tree, plan, task

pytestmark = pytest.mark.integration

NOT_UTF8 = b"caf\xe9.txt"
CALLS = 8
"""`ctl call list_dir path=` this many times: on main each one killed the custodian, and the
default restart intensity (5 in 10 s) gave up after the sixth."""


def _ctl(tree: Tree, *args: bytes | str) -> subprocess.CompletedProcess[bytes]:
    """`orchestra-sup ctl call ...` as a user runs it, arguments as raw bytes where given."""
    argv: list[bytes | str] = [sys.executable, "-m", "orchestra_sup", "ctl"]
    argv += ["--run-dir", str(tree.run_dir), "call", *args, "--json", "--timeout", "20"]
    return subprocess.run(argv, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def _json(proc: subprocess.CompletedProcess[bytes]) -> dict:
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    value = json.loads(proc.stdout)
    assert isinstance(value, dict)
    return value


def _exact(fields: dict, key: str) -> bytes:
    """The exact bytes of the name `fields` carry under `key`, as the README says to read it."""
    if key + "_b64" in fields:
        return base64.b64decode(fields[key + "_b64"])
    return os.fsencode(fields[key])


def test_a_name_that_is_not_utf8_costs_the_custodian_nothing(tree: Tree, repo: Path) -> None:
    """The issue's steps: a committing lane creates `caf\\xe9.txt`, then `ctl call list_dir
    path=` is run, again and again, and the other read tools are asked about the file by its
    name. Every call answers (the name in its documented bytes form), the custodian keeps its
    pid and the tree stays up. On main the custodian's front thread died encoding the listing
    (UnicodeEncodeError, surrogates not allowed), and after six calls the tree exited 3."""
    made = tree.submit(
        plan(
            "odd-name",
            task("a", r"""printf 'needle\n' > "$(printf 'caf\351.txt')" """, commit=True),
        )
    )
    assert tree.wait_plan(made).ok
    custodian = tree.pids()["custodian"]
    for _ in range(CALLS):
        listing = _json(_ctl(tree, "list_dir", "path="))
        (entry,) = [e for e in listing["entries"] if e["name"] != "README"]
        assert entry == {
            "name": "caf\ufffd.txt",
            "name_b64": base64.b64encode(NOT_UTF8).decode(),
            "type": "file",
            "size": 7,
        }
    by_name = b"path=" + NOT_UTF8  # argv bytes: ctl call sends them as path_b64
    stat = _json(_ctl(tree, "stat", by_name))
    assert _exact(stat, "path") == NOT_UTF8 and stat["type"] == "file"
    read = _json(_ctl(tree, "read_file", by_name))
    assert _exact(read, "path") == NOT_UTF8 and read["text"] == "needle\n"
    found = _json(_ctl(tree, "search", "path=", "pattern=needle"))
    assert [_exact(m, "path") for m in found["matches"]] == [NOT_UTF8]
    diff = _json(_ctl(tree, "diff", by_name, "rev=HEAD~1"))
    assert '"b/caf\\351.txt"' in diff["diff"] and "+needle" in diff["diff"]
    log = _json(_ctl(tree, "log", by_name))
    assert len(log["commits"]) == 1 and _exact(log, "path") == NOT_UTF8
    landed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", "-z", "HEAD"],
        capture_output=True,
        check=True,
    ).stdout
    assert landed.split(b"\0") == [b"README", NOT_UTF8, b""]
    assert tree.pids()["custodian"] == custodian
    assert tree.proc.poll() is None
    assert tree.child("custodian").internal_errors == 0


HOSTILE = {
    "newline": "new\nline.txt",
    "leading-dash": "--output=pwned",
    "leading-space": " space.txt",
    "glob-magic": ":(glob)x",
}


def _create(key: str, name: str) -> str:
    """A shell command writing `key` and a newline into a file named `name`."""
    spelt = name.replace("\n", "\\n")  # for printf %b, which makes it a newline again
    return f"printf '{key}\\n' > \"$(printf '%b' '{spelt}')\""


def test_hostile_names_through_every_read_tool_and_commits(tree: Tree, repo: Path) -> None:
    """A lane commits `x`, a second one a file under each hostile name: each name lands in the
    workspace as itself, and list_dir, stat, read_file, search, diff and log (through the
    relay, as `ctl call` asks) answer it exactly; diff and log of `:(glob)x` see that file,
    not `x`, and `--output=pwned` is never an option (no `pwned` file appears)."""
    writes = " && ".join(_create(key, name) for key, name in HOSTILE.items())
    made = tree.submit(
        plan(
            "hostile",
            task("x", "printf 'x\\n' > x", commit=True),
            task("names", writes, ["x"], commit=True),
        )
    )
    report = tree.wait_plan(made)
    assert report.ok, report
    landed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", "-z", "HEAD"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\0")
    assert set(HOSTILE.values()) <= set(landed)
    listing = tree.call("list_dir", path="")
    assert {e["name"] for e in listing["entries"]} >= set(HOSTILE.values())
    custodian = tree.pids()["custodian"]
    for key, name in HOSTILE.items():
        assert tree.call("stat", path=name)["path"] == name
        assert tree.call("read_file", path=name)["text"] == f"{key}\n"
        found = tree.call("search", path=name, pattern=key)
        assert [m["path"] for m in found["matches"]] == [name]
        diff = tree.call("diff", path=name, rev="HEAD~2")
        assert diff["diff"].count("diff --git") == 1 and f"+{key}" in diff["diff"], diff
        log = tree.call("log", path=name)
        assert len(log["commits"]) == 1, (name, log)
    assert not (repo / "pwned").exists()
    assert tree.pids()["custodian"] == custodian
