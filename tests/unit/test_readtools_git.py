"""The custodian's git read tools (`diff`, `log`) over real repositories, and the custodian's
dispatch of every read tool (threaded and async) under its read semaphore."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from orchestra_sup.custodian import history, readtools, searchproc
from orchestra_sup.custodian.role import READ_CONCURRENCY, Custodian
from orchestra_sup.custodian.workspace import Workspace
from orchestra_sup.errors import ErrorCode, PathEscape, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.version import PROTOCOL_VERSION

DATES = ["2024-01-01T10:00:00+00:00", "2024-01-02T10:00:00+00:00", "2024-01-03T10:00:00+00:00"]


def _env(date: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return env


def git(repo: Path, *args: str, date: str | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
        env=_env(date),
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Three commits: c1 adds a.txt and docs/b.md, c2 changes a.txt, c3 changes docs/b.md."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "docs").mkdir()
    (r / "a.txt").write_text("one\n")
    (r / "docs" / "b.md").write_text("bee\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "c1: start", date=DATES[0])
    (r / "a.txt").write_text("one\ntwo\n")
    git(r, "commit", "-q", "-am", "c2: two", date=DATES[1])
    (r / "docs" / "b.md").write_text("bee\nsea\n")
    git(r, "commit", "-q", "-am", "c3: sea", date=DATES[2])
    return r


def _sha(repo: Path, rev: str) -> str:
    return git(repo, "rev-parse", rev).strip()


def _code(exc: pytest.ExceptionInfo[RemoteError]) -> ErrorCode:
    return exc.value.code


# --- diff ----------------------------------------------------------------------------------------


def test_diff_shows_a_working_tree_change(repo: Path) -> None:
    """The default rev HEAD compares the working tree against it."""
    assert asyncio.run(history.diff(repo)) == {
        "path": ".",
        "rev": "HEAD",
        "diff": "",
        "truncated": False,
    }
    (repo / "a.txt").write_text("one\ntwo\nthree\n")
    out = asyncio.run(history.diff(repo))
    assert out["truncated"] is False
    assert "diff --git a/a.txt b/a.txt" in out["diff"]
    assert "\n+three\n" in out["diff"]
    older = asyncio.run(history.diff(repo, "", "HEAD~2"))["diff"]
    assert "+two\n+three\n" in older and "+sea\n" in older


def test_diff_between_two_revs(repo: Path) -> None:
    """`A..B` compares commit A against commit B (the working tree plays no part)."""
    (repo / "a.txt").write_text("changed\n")
    both = asyncio.run(history.diff(repo, "", "HEAD~2..HEAD"))["diff"]
    assert "+two\n" in both and "+sea\n" in both and "changed" not in both
    last = asyncio.run(history.diff(repo, "", "HEAD~1..HEAD"))["diff"]
    assert "+sea\n" in last and "a.txt" not in last
    sha = _sha(repo, "HEAD~1")
    assert asyncio.run(history.diff(repo, "", f"{sha}..main"))["diff"] == last
    assert asyncio.run(history.diff(repo, "", f"{sha}.."))["diff"] == last


def test_diff_is_restricted_to_path(repo: Path) -> None:
    """Only changes under `path` show; a file path, a directory path, literally."""
    (repo / "a.txt").write_text("changed\n")
    assert asyncio.run(history.diff(repo, "docs"))["diff"] == ""
    docs = asyncio.run(history.diff(repo, "docs", "HEAD~2..HEAD"))
    assert docs["path"] == "docs" and "+sea\n" in docs["diff"] and "a.txt" not in docs["diff"]
    only_a = asyncio.run(history.diff(repo, "a.txt", "HEAD~2"))["diff"]
    assert "+changed\n" in only_a and "b.md" not in only_a
    # pathspec magic is not honoured: ":(glob)*" is a (missing) file name, not a pattern
    assert asyncio.run(history.diff(repo, ":(glob)*"))["diff"] == ""


@pytest.mark.parametrize(
    "rev",
    [
        "--output={out}",
        "-p",
        "-R",
        "--no-index",
        "HEAD HEAD",
        "HEAD\tHEAD",
        "HEAD~1...HEAD",
        "..",
        "a..b..c",
        "HEAD:a.txt",
        ":/c2",
        "-",
        "",
    ],
)
def test_diff_refuses_option_looking_revs(repo: Path, tmp_path: Path, rev: str) -> None:
    """Anything but a revision or A..B is a bad_request, and git never sees it."""
    out = tmp_path / "x"
    rev = rev.format(out=out)
    with pytest.raises(RemoteError) as info:
        asyncio.run(history.diff(repo, "", rev))
    assert _code(info) is ErrorCode.BAD_REQUEST
    assert repr(rev) in info.value.message
    assert not out.exists()


@pytest.mark.parametrize("rev", ["nope", "HEAD~9", "nope..HEAD", "HEAD..nope", "deadbeef"])
def test_diff_unknown_rev_is_not_found(repo: Path, rev: str) -> None:
    """A well-formed rev that names no commit is not_found, naming it."""
    with pytest.raises(RemoteError) as info:
        asyncio.run(history.diff(repo, "", rev))
    assert _code(info) is ErrorCode.NOT_FOUND
    assert repr(rev) in info.value.message


@pytest.mark.parametrize(
    "rev", ["HEAD", "HEAD~1", "HEAD^", "main", "main@{0}", "@", "HEAD^{commit}"]
)
def test_diff_accepts_typical_revs(repo: Path, rev: str) -> None:
    """Ref names, shas and the usual suffixes pass validation."""
    assert asyncio.run(history.diff(repo, "", rev))["rev"] == rev
    sha = _sha(repo, "HEAD~1")
    assert asyncio.run(history.diff(repo, "", sha[:10]))["rev"] == sha[:10]


@pytest.mark.parametrize("path", ["..", "../x", "/etc", ".git", ".git/config", "escape"])
def test_git_tools_refuse_escaping_paths(repo: Path, tmp_path: Path, path: str) -> None:
    """diff and log apply read_file's path rules."""
    (repo / "escape").symlink_to(tmp_path)
    with pytest.raises(PathEscape):
        asyncio.run(history.diff(repo, path))
    with pytest.raises(PathEscape):
        asyncio.run(history.log(repo, path))


def test_diff_truncates_at_the_cap(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Output past DIFF_MAX_BYTES is cut and reported truncated."""
    (repo / "a.txt").write_text("".join(f"line {i}\n" for i in range(20_000)))
    full = asyncio.run(history.diff(repo))
    assert full["truncated"] is False
    monkeypatch.setattr(history, "DIFF_MAX_BYTES", 1000)
    cut = asyncio.run(history.diff(repo))
    assert cut["truncated"] is True
    assert cut["diff"] == full["diff"][:1000]


def test_diff_writes_nothing_and_runs_no_external_driver(repo: Path, tmp_path: Path) -> None:
    """A stat-dirty file does not make diff rewrite .git/index; diff.external is not run."""
    marker = tmp_path / "ran"
    script = tmp_path / "ext.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    git(repo, "config", "diff.external", str(script))
    st = os.stat(repo / "a.txt")
    os.utime(repo / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    (repo / "docs" / "b.md").write_text("changed\n")
    index = repo / ".git" / "index"
    before = (index.read_bytes(), os.stat(index).st_mtime_ns)
    out = asyncio.run(history.diff(repo))
    assert "+changed\n" in out["diff"] and "a.txt" not in out["diff"]
    assert (index.read_bytes(), os.stat(index).st_mtime_ns) == before
    assert not (repo / ".git" / "index.lock").exists()
    assert not marker.exists()


# --- log -----------------------------------------------------------------------------------------


def test_log_lists_commits_newest_first(repo: Path) -> None:
    """Full shas, author names, ISO 8601 author dates and subjects, newest first."""
    out = asyncio.run(history.log(repo))
    assert out["path"] == "." and out["rev"] == "HEAD" and out["truncated"] is False
    assert [c["subject"] for c in out["commits"]] == ["c3: sea", "c2: two", "c1: start"]
    assert [c["sha"] for c in out["commits"]] == [_sha(repo, f"HEAD~{i}") for i in range(3)]
    assert {c["author"] for c in out["commits"]} == {"t"}
    dates = [datetime.fromisoformat(c["date"]) for c in out["commits"]]
    assert dates == [datetime.fromisoformat(d) for d in reversed(DATES)]


def test_log_limit_path_and_range(repo: Path) -> None:
    """limit keeps the newest; path keeps the commits touching it; A..B keeps B's side."""
    assert [c["subject"] for c in asyncio.run(history.log(repo, limit=2))["commits"]] == [
        "c3: sea",
        "c2: two",
    ]
    docs = asyncio.run(history.log(repo, "docs"))
    assert docs["path"] == "docs"
    assert [c["subject"] for c in docs["commits"]] == ["c3: sea", "c1: start"]
    assert [c["subject"] for c in asyncio.run(history.log(repo, "a.txt"))["commits"]] == [
        "c2: two",
        "c1: start",
    ]
    assert [c["subject"] for c in asyncio.run(history.log(repo, "", "HEAD~1"))["commits"]] == [
        "c2: two",
        "c1: start",
    ]
    ranged = asyncio.run(history.log(repo, "", "HEAD~2..HEAD"))["commits"]
    assert [c["subject"] for c in ranged] == ["c3: sea", "c2: two"]
    assert asyncio.run(history.log(repo, "missing"))["commits"] == []


def test_log_refusals(repo: Path) -> None:
    """A limit out of range or an option-looking rev is bad_request; an unknown rev not_found."""
    for limit in (0, 1001):
        with pytest.raises(RemoteError) as info:
            asyncio.run(history.log(repo, limit=limit))
        assert _code(info) is ErrorCode.BAD_REQUEST
    with pytest.raises(RemoteError) as info:
        asyncio.run(history.log(repo, "", "--all"))
    assert _code(info) is ErrorCode.BAD_REQUEST
    with pytest.raises(RemoteError) as info:
        asyncio.run(history.log(repo, "", "nope"))
    assert _code(info) is ErrorCode.NOT_FOUND and "'nope'" in info.value.message


def test_log_cut_output_keeps_whole_commits(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past LOG_MAX_BYTES only the commits read whole are returned, with truncated=True."""
    monkeypatch.setattr(history, "LOG_MAX_BYTES", 100)  # one record is about 80 bytes
    out = asyncio.run(history.log(repo))
    assert out["truncated"] is True
    assert [c["subject"] for c in out["commits"]] == ["c3: sea"]


# --- the custodian's dispatch --------------------------------------------------------------------


def _custodian(root: Path) -> Custodian:
    c = Custodian()
    c.workspace = Workspace(root)
    return c


def _call(c: Custodian, tool: str, **params: str) -> object:
    body = asyncio.run(c._tool(f.ToolCall(tool=tool, params=params)))
    assert isinstance(body, f.ToolResult)
    return body.value


def _inline(c: Custodian, tool: str, **params: str) -> f.Body | None:
    env = f.Envelope(
        v=PROTOCOL_VERSION,
        id="t.1",
        corr=None,
        sender="coordinator",
        gen=1,
        ttl_s=None,
        dest_gen=None,
        body=f.ToolCall(tool=tool, params=params),
    )
    return c.serve_inline(env)


def test_custodian_serves_search_diff_and_log(repo: Path) -> None:
    """The custodian answers the three slow tools on its loop with their documented shapes, and
    read_file on its front thread's path (serve_inline)."""
    c = _custodian(repo)
    (repo / "a.txt").write_text("one\ntwo\nthree\n")
    assert _call(c, "search", path="", pattern="^t", limit="1") == {
        "path": ".",
        "pattern": "^t",
        "matches": [{"path": "a.txt", "line": 2, "text": "two"}],
        "truncated": True,
    }
    d = _call(c, "diff", path="a.txt")
    assert isinstance(d, dict) and d["rev"] == "HEAD" and "+three\n" in d["diff"]
    d2 = _call(c, "diff", path="", rev="HEAD~1..HEAD")
    assert isinstance(d2, dict) and "+sea\n" in d2["diff"]
    lg = _call(c, "log", path="docs", limit="1")
    assert isinstance(lg, dict) and [x["subject"] for x in lg["commits"]] == ["c3: sea"]
    assert _inline(c, "read_file", path="a.txt") == f.ToolResult(
        value={"path": "a.txt", "size": 14, "truncated": False, "text": "one\ntwo\nthree\n"}
    )
    assert _inline(c, "search", pattern="x") is None  # the loop's: a child process


def test_custodian_tool_errors(repo: Path) -> None:
    """Bad parameters, unknown tools, revs and paths map onto typed errors."""
    c = _custodian(repo)

    def code(tool: str, **params: str) -> ErrorCode:
        with pytest.raises(RemoteError) as info:
            asyncio.run(c._tool(f.ToolCall(tool=tool, params=params)))
        return info.value.code

    assert code("grep") is ErrorCode.BAD_REQUEST
    for tool, params, expected in (
        ("stat", {}, ErrorCode.BAD_REQUEST),  # no path
        ("read_file", {"path": "docs"}, ErrorCode.BAD_REQUEST),  # a directory
        ("stat", {"path": "nope"}, ErrorCode.NOT_FOUND),
    ):
        with pytest.raises(RemoteError) as info:
            _inline(c, tool, **params)
        assert info.value.code is expected, (tool, params)
    assert code("search", path="") is ErrorCode.BAD_REQUEST  # no pattern
    assert code("search", pattern="(") is ErrorCode.BAD_REQUEST
    assert code("search", pattern="x", limit="many") is ErrorCode.BAD_REQUEST
    assert code("search", pattern="x", path="nope") is ErrorCode.NOT_FOUND
    assert code("diff", rev="-p") is ErrorCode.BAD_REQUEST
    assert code("diff", rev="nope") is ErrorCode.NOT_FOUND
    assert code("log", limit="5000") is ErrorCode.BAD_REQUEST
    assert code("log", rev="nope") is ErrorCode.NOT_FOUND
    with pytest.raises(PathEscape):
        asyncio.run(c._tool(f.ToolCall(tool="diff", params={"path": "../x"})))


def test_custodian_runs_every_read_under_the_semaphore(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """search runs in a child process, diff and log are awaited on the loop; all hold a slot."""
    c = _custodian(repo)
    seen: dict[str, tuple[int, bool]] = {}
    loop_thread = threading.get_ident()

    async def fake_search(root: Path, path: str, pattern: str, limit: int) -> dict:
        seen["search"] = (c._reads._value, threading.get_ident() != loop_thread)
        return {"limit": limit}

    async def fake_diff(root: Path, path: str, rev: str) -> dict:
        seen["diff"] = (c._reads._value, threading.get_ident() != loop_thread)
        return {"rev": rev}

    async def fake_log(root: Path, path: str, rev: str, limit: int) -> dict:
        seen["log"] = (c._reads._value, threading.get_ident() != loop_thread)
        return {"rev": rev, "limit": limit}

    monkeypatch.setattr(searchproc, "search", fake_search)
    monkeypatch.setattr(history, "diff", fake_diff)
    monkeypatch.setattr(history, "log", fake_log)
    assert _call(c, "search", pattern="x") == {"limit": readtools.SEARCH_DEFAULT_LIMIT}
    assert _call(c, "diff", rev="") == {"rev": "HEAD"}
    assert _call(c, "log") == {"rev": "HEAD", "limit": history.LOG_DEFAULT_LIMIT}
    held = READ_CONCURRENCY - 1
    assert seen == {"search": (held, False), "diff": (held, False), "log": (held, False)}


def test_catastrophic_search_pattern_is_stopped_not_the_custodian(repo: Path) -> None:
    """`(a+)+$` on a long line of a's backtracks for ever; Python's re holds the GIL, so it runs
    in a child process that is killed after the time budget, with a typed timeout error."""
    (repo / "aaa.txt").write_text("a" * 40 + "!\n")
    started = time.monotonic()

    async def go() -> None:
        with pytest.raises(RemoteError) as info:
            await searchproc.search(repo, "aaa.txt", "(a+)+$", 10, timeout_s=1.0)
        assert info.value.code is ErrorCode.TIMEOUT and "(a+)+$" in info.value.message

    asyncio.run(go())
    assert time.monotonic() - started < 10


def test_search_in_a_child_process_gives_the_same_answers(repo: Path) -> None:
    """The child process returns what readtools.search returns, and maps its errors back."""
    (repo / "hit.txt").write_text("alpha\nbeta\n")

    async def go() -> None:
        value = await searchproc.search(repo, "", "beta", 10)
        assert value == readtools.search(repo, "", "beta", 10)
        with pytest.raises(PathEscape):
            await searchproc.search(repo, "../x", "a", 10)
        with pytest.raises(RemoteError) as info:
            await searchproc.search(repo, "", "(", 10)
        assert info.value.code is ErrorCode.BAD_REQUEST

    asyncio.run(go())


def test_a_symlink_loop_or_an_over_long_name_is_bad_request(repo: Path) -> None:
    """A self-looping symlink (ELOOP) and a name longer than the file system takes
    (ENAMETOOLONG), through every inline read tool: `bad_request` naming the path, never
    `internal` with the workspace's own path in it (a hostile tester's find)."""
    (repo / "selfref").symlink_to("selfref")
    c = _custodian(repo)
    assert _inline(c, "stat", path="selfref") == f.ToolResult(value=readtools.stat(repo, "selfref"))
    for tool in ("read_file", "stat", "list_dir"):
        for path in ("selfref", "L" * 5000, "a/" * 3000):
            if tool == "stat" and path == "selfref":  # lstat: the link itself, not its loop
                continue
            with pytest.raises(RemoteError) as info:
                _inline(c, tool, path=path)
            assert info.value.code is ErrorCode.BAD_REQUEST, (tool, path[:20], info.value)
            assert str(repo) not in info.value.message
