"""The custodian's read tools: path confinement, reads, truncation, listings and stat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra_sup.custodian import readtools
from orchestra_sup.errors import ErrorCode, PathEscape, RemoteError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / ".git").mkdir(parents=True)
    (r / ".git" / "config").write_text("[core]\n")
    (r / "docs").mkdir()
    (r / "docs" / "guide.md").write_text("# guide\n")
    (r / "hello.txt").write_text("hello\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("secret\n")
    return r


def test_empty_and_dot_mean_root(root: Path) -> None:
    """resolve maps "" and "." to the root's realpath."""
    assert readtools.resolve(root, "") == Path(os.path.realpath(root))
    assert readtools.resolve(root, ".") == Path(os.path.realpath(root))
    assert (
        readtools.resolve(root, "docs/guide.md") == Path(os.path.realpath(root)) / "docs/guide.md"
    )


def test_a_root_that_is_not_a_realpath_fails_closed(root: Path, tmp_path: Path) -> None:
    """`root` is taken as a realpath, not resolved per call (the reads' hot path). Given one
    reached through a symlink, a plain file still reads, and every symlink below it is refused,
    the one leaving the root and the one staying inside alike: nothing outside is reached."""
    (root / "leak").symlink_to(tmp_path / "outside" / "secret")
    (root / "alias").symlink_to("hello.txt")
    linked = tmp_path / "linked"
    linked.symlink_to(root)
    assert readtools.read_file(linked, "hello.txt")["text"] == "hello\n"
    for path in ("leak", "alias"):
        with pytest.raises(PathEscape):
            readtools.read_file(linked, path)


@pytest.mark.parametrize("path", ["../outside/secret", "docs/../../x", "docs/..", ".."])
def test_dotdot_is_refused(root: Path, path: str) -> None:
    """Any `..` component raises PathEscape, even one that would stay inside."""
    with pytest.raises(PathEscape) as info:
        readtools.resolve(root, path)
    assert info.value.path == path


def test_absolute_path_is_refused(root: Path) -> None:
    """An absolute path raises PathEscape, even one naming a file inside the root."""
    for path in ("/etc/passwd", str(root / "hello.txt")):
        with pytest.raises(PathEscape):
            readtools.read_file(root, path)


def test_symlink_pointing_outside_is_refused(root: Path, tmp_path: Path) -> None:
    """A symlink (file or directory) whose target leaves the root raises PathEscape everywhere."""
    (root / "leak").symlink_to(tmp_path / "outside" / "secret")
    (root / "leakdir").symlink_to(tmp_path / "outside")
    (root / "relleak").symlink_to("../outside/secret")
    for path in ("leak", "relleak", "leakdir/secret"):
        with pytest.raises(PathEscape):
            readtools.read_file(root, path)
    with pytest.raises(PathEscape):
        readtools.list_dir(root, "leakdir")
    with pytest.raises(PathEscape):
        readtools.stat(root, "leak")


@pytest.mark.parametrize("path", [".git", ".git/config", "docs/.git", ".GIT/config", "./.git"])
def test_git_directory_is_refused(root: Path, path: str) -> None:
    """Any `.git` component raises PathEscape."""
    with pytest.raises(PathEscape):
        readtools.resolve(root, path)


def test_symlink_into_git_directory_is_refused(root: Path) -> None:
    """A symlink inside the root that resolves into .git raises PathEscape."""
    (root / "cfg").symlink_to(".git/config")
    with pytest.raises(PathEscape):
        readtools.read_file(root, "cfg")


def test_symlink_inside_root_is_followed(root: Path) -> None:
    """A symlink whose target stays inside the root reads its target; stat reports the link."""
    (root / "alias").symlink_to("docs/guide.md")
    (root / "docsalias").symlink_to("docs")
    assert readtools.read_file(root, "alias")["text"] == "# guide\n"
    assert readtools.read_file(root, "docsalias/guide.md")["text"] == "# guide\n"
    assert readtools.stat(root, "alias")["type"] == "symlink"
    assert [e["name"] for e in readtools.list_dir(root, "docsalias")["entries"]] == ["guide.md"]


def _reference_resolve(root: Path, path: str) -> Path:
    """The definition `resolve` must agree with: realpath everything, then check."""
    pure = readtools.normalize(path)
    real_root = Path(os.path.realpath(root))
    candidate = real_root.joinpath(*pure.parts)
    target = Path(os.path.realpath(candidate))
    if not target.is_relative_to(real_root) or any(
        part.lower() == ".git" for part in target.relative_to(real_root).parts
    ):
        raise PathEscape(path)
    return candidate


def test_resolve_agrees_with_realpath_everywhere(root: Path, tmp_path: Path) -> None:
    """The one-lstat-per-component walk gives what full realpath checks give, for chains of
    links, links out of the root or into .git, dangling links, loops and missing components
    (a root reached through a symlink: `test_a_root_that_is_not_a_realpath_fails_closed`)."""
    (root / "chain1").symlink_to("chain2")
    (root / "chain2").symlink_to("docs")
    (root / "out").symlink_to(tmp_path / "outside")
    (root / "gitdir").symlink_to(".git")
    (root / "dangling").symlink_to("nowhere")
    (root / "dangling-out").symlink_to("../nowhere")
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    (root / "docs" / "up").symlink_to("..")
    paths = [
        *("", ".", "hello.txt", "docs", "docs/guide.md", "./docs//guide.md", "docs/"),
        *("chain1", "chain1/guide.md", "chain2/guide.md", "out", "out/secret", "gitdir"),
        *("gitdir/config", "dangling", "dangling-out", "loop1", "loop1/x", "docs/up"),
        *("docs/up/hello.txt", "docs/up/out/secret", "nope", "nope/deeper", "hello.txt/x"),
    ]
    for path in paths:
        try:
            expected: Path | type[PathEscape] = _reference_resolve(root, path)
        except PathEscape:
            expected = PathEscape
        try:
            got: Path | type[PathEscape] = readtools.resolve(root, path)
        except PathEscape:
            got = PathEscape
        assert got == expected, path


def test_read_five_megabyte_file(root: Path) -> None:
    """A 5 MiB file under the default 8 MiB cap is read whole, not truncated."""
    data = ("0123456789abcdef" * 63 + "0123456789abcde\n") * 5 * 1024  # 1 KiB lines
    (root / "big.txt").write_text(data)
    out = readtools.read_file(root, "big.txt")
    assert out["size"] == 5 * 1024 * 1024
    assert out["truncated"] is False
    assert out["text"] == data
    assert out["path"] == "big.txt"


def test_truncation_at_max_bytes(root: Path) -> None:
    """Reading past max_bytes returns the first max_bytes, the full size and truncated=True."""
    (root / "f.txt").write_text("abcdefghij" * 10)
    out = readtools.read_file(root, "f.txt", max_bytes=10)
    assert out == {"path": "f.txt", "size": 100, "truncated": True, "text": "abcdefghij"}
    exact = readtools.read_file(root, "f.txt", max_bytes=100)
    assert exact["truncated"] is False and len(exact["text"]) == 100


def test_truncation_drops_a_cut_character_and_replaces_invalid_bytes(root: Path) -> None:
    """A multi-byte character cut by the cap is dropped; invalid UTF-8 becomes U+FFFD."""
    (root / "u.txt").write_bytes("aé".encode() + b"\xff" + "ü".encode())
    assert readtools.read_file(root, "u.txt")["text"] == "aé\ufffdü"
    cut = readtools.read_file(root, "u.txt", max_bytes=2)  # "a" + first byte of "é"
    assert cut["text"] == "a" and cut["truncated"] is True


def test_read_errors(root: Path) -> None:
    """A missing file raises FileNotFoundError, a directory IsADirectoryError."""
    with pytest.raises(FileNotFoundError):
        readtools.read_file(root, "nope.txt")
    with pytest.raises(IsADirectoryError):
        readtools.read_file(root, "docs")
    with pytest.raises(ValueError):
        readtools.read_file(root, "hello.txt", max_bytes=-1)


def test_fifo_is_refused_without_blocking(root: Path) -> None:
    """A FIFO is not read (and does not hang the call): OSError."""
    os.mkfifo(root / "pipe")
    with pytest.raises(OSError):
        readtools.read_file(root, "pipe")


def test_list_dir_of_two_thousand_files(root: Path) -> None:
    """list_dir returns all 2,000 entries sorted by name with type and size."""
    d = root / "many"
    d.mkdir()
    for i in range(2000):
        (d / f"f{i:04d}.txt").write_text("x" * (i % 7))
    out = readtools.list_dir(root, "many")
    assert out["path"] == "many"
    names = [e["name"] for e in out["entries"]]
    assert len(names) == 2000 and names == sorted(names)
    assert out["entries"][3] == {"name": "f0003.txt", "type": "file", "size": 3}


def test_list_dir_root_types_and_skips_git(root: Path) -> None:
    """The root listing has file/dir/symlink types, 0 size for dirs, and never shows .git."""
    (root / "alias").symlink_to("hello.txt")
    out = readtools.list_dir(root)
    assert out["path"] == "."
    assert out["entries"] == [
        {"name": "alias", "type": "symlink", "size": len("hello.txt")},
        {"name": "docs", "type": "dir", "size": 0},
        {"name": "hello.txt", "type": "file", "size": 6},
    ]
    with pytest.raises(NotADirectoryError):
        readtools.list_dir(root, "hello.txt")


def test_stat_shape(root: Path) -> None:
    """stat returns path, type, size in bytes and mtime in epoch seconds (lstat)."""
    os.utime(root / "hello.txt", (1_700_000_000, 1_700_000_000))
    assert readtools.stat(root, "hello.txt") == {
        "path": "hello.txt",
        "type": "file",
        "size": 6,
        "mtime": 1_700_000_000.0,
    }
    assert readtools.stat(root, "")["type"] == "dir"
    with pytest.raises(FileNotFoundError):
        readtools.stat(root, "nope")


# --- search --------------------------------------------------------------------------------------


def _search(root: Path, path: str, pattern: str, **kw: object) -> dict:
    return readtools.search(root, path, pattern, **kw)  # type: ignore[arg-type]


def test_search_finds_matches_with_line_numbers(root: Path) -> None:
    """Matches come depth first in name order, with workspace-relative paths and 1-based lines."""
    (root / "docs" / "api.md").write_text("intro\nTODO: write\nend\r\nTODO again\r\n")
    (root / "z.py").write_text("x = 1\n# TODO later")
    out = _search(root, "", r"TODO\b")
    assert out == {
        "path": ".",
        "pattern": r"TODO\b",
        "matches": [
            {"path": "docs/api.md", "line": 2, "text": "TODO: write"},
            {"path": "docs/api.md", "line": 4, "text": "TODO again"},
            {"path": "z.py", "line": 2, "text": "# TODO later"},
        ],
        "truncated": False,
    }
    assert _search(root, "docs", "^end$")["matches"] == [
        {"path": "docs/api.md", "line": 3, "text": "end"}
    ]
    single = _search(root, "z.py", "x")
    assert single["path"] == "z.py"
    assert single["matches"] == [{"path": "z.py", "line": 1, "text": "x = 1"}]


def test_search_respects_limit_and_reports_truncation(root: Path) -> None:
    """At most `limit` matches; truncated only when more exist."""
    (root / "many.txt").write_text("".join(f"hit {i}\n" for i in range(10)))
    cut = _search(root, "many.txt", "hit", limit=3)
    assert [m["line"] for m in cut["matches"]] == [1, 2, 3]
    assert cut["truncated"] is True
    exact = _search(root, "many.txt", "hit", limit=10)
    assert len(exact["matches"]) == 10 and exact["truncated"] is False
    assert _search(root, "", "hit")["truncated"] is False


def test_search_stops_at_the_byte_budget(root: Path) -> None:
    """Past max_total_bytes the scan stops with truncated=True and the matches found so far."""
    for name in ("a.txt", "b.txt", "c.txt"):
        (root / name).write_text("needle\n" + "x" * 93 + "\n")  # 101 bytes
    out = _search(root, "", "needle", max_total_bytes=250)
    assert [m["path"] for m in out["matches"]] == ["a.txt", "b.txt"]
    assert out["truncated"] is True
    # the fixture's docs/guide.md (8 bytes) and hello.txt (6) are read too: 317 in all
    assert _search(root, "", "needle", max_total_bytes=316)["truncated"] is True
    assert _search(root, "", "needle", max_total_bytes=317)["truncated"] is False


def test_search_long_line_is_cut_to_500_characters(root: Path) -> None:
    """A match's text holds at most 500 characters of its line."""
    (root / "long.txt").write_text("a" * 2000 + "needle\n")
    [match] = _search(root, "long.txt", "needle")["matches"]
    assert match["text"] == "a" * 500


def test_search_skips_binary_big_and_git(root: Path) -> None:
    """Files with a NUL in the first 8 KiB, files over 4 MiB and .git entries are not searched."""
    (root / "bin.dat").write_bytes(b"needle\n\0rest")
    (root / "late.dat").write_bytes(b"x" * 9000 + b"\0\nneedle\n")  # NUL past the probe
    (root / "big.txt").write_bytes(b"needle\n" + b"x" * (4 * 1024 * 1024))
    (root / ".git" / "needle").write_text("needle\n")
    (root / "docs" / ".GIT").mkdir()
    (root / "docs" / ".GIT" / "n.txt").write_text("needle\n")
    out = _search(root, "", "needle")
    assert [(m["path"], m["line"]) for m in out["matches"]] == [("late.dat", 2)]
    assert out["truncated"] is False


def test_search_never_follows_symlinks_while_walking(root: Path, tmp_path: Path) -> None:
    """Symlinks met in the walk are skipped (out of the root or not); a named one inside is read."""
    (root / "leak").symlink_to(tmp_path / "outside" / "secret")
    (root / "leakdir").symlink_to(tmp_path / "outside")
    (root / "alias").symlink_to("hello.txt")
    assert _search(root, "", "secret|hello")["matches"] == [
        {"path": "hello.txt", "line": 1, "text": "hello"}
    ]
    assert _search(root, "alias", "hello")["matches"] == [
        {"path": "alias", "line": 1, "text": "hello"}
    ]


@pytest.mark.parametrize("path", ["..", "../outside", "docs/../..", "/etc", ".git", "leakdir"])
def test_search_refuses_escaping_paths(root: Path, tmp_path: Path, path: str) -> None:
    """`..`, absolute paths, .git and a symlink out of the root raise PathEscape."""
    (root / "leakdir").symlink_to(tmp_path / "outside")
    with pytest.raises(PathEscape):
        _search(root, path, "secret")


def test_search_bad_pattern_limit_and_missing_path(root: Path) -> None:
    """An invalid regex or limit is a bad_request naming it; a missing path FileNotFoundError."""
    with pytest.raises(RemoteError) as info:
        _search(root, "", "foo(")
    assert info.value.code is ErrorCode.BAD_REQUEST and "'foo('" in info.value.message
    for limit in (0, 10_001):
        with pytest.raises(RemoteError) as info:
            _search(root, "", "x", limit=limit)
        assert info.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(FileNotFoundError):
        _search(root, "nope", "x")


def test_limit_and_required_params() -> None:
    """limit_param parses integers within range; required_param refuses a missing name."""
    assert readtools.limit_param({}, 200, 10_000) == 200
    assert readtools.limit_param({"limit": ""}, 200, 10_000) == 200
    assert readtools.limit_param({"limit": "10000"}, 200, 10_000) == 10_000
    for raw in ("abc", "1.5", "0", "-3", "10001"):
        with pytest.raises(RemoteError) as info:
            readtools.limit_param({"limit": raw}, 200, 10_000)
        assert info.value.code is ErrorCode.BAD_REQUEST
    assert readtools.required_param({"pattern": ""}, "pattern") == ""
    with pytest.raises(RemoteError) as info:
        readtools.required_param({}, "pattern")
    assert info.value.code is ErrorCode.BAD_REQUEST and "pattern" in info.value.message
