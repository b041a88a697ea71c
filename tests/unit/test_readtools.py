"""The custodian's read tools: path confinement, reads, truncation, listings and stat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra_sup.custodian import readtools
from orchestra_sup.errors import PathEscape


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
