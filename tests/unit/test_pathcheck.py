"""`orchestra_sup.system.pathcheck`: which characters a path may not hold, and the one line
that says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError
from orchestra_sup.system.pathcheck import SHOWN_MAX, check_path, check_paths, forbidden, shown_path

REFUSED = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\x9f", "\u2028", "\u2029"]
ALLOWED = [" ", '"', "'", "\\", "%", "$", "{", ";", "#", "=", "-", "ü", "€", "\u00a0", "😀"]


@pytest.mark.parametrize("char", REFUSED, ids=[f"U+{ord(c):04X}" for c in REFUSED])
def test_control_characters_and_line_separators_are_refused(char: str) -> None:
    """Every C0 and C1 control, DEL, and U+2028/U+2029: one line naming the option, the value
    escaped as repr does, and which character it was."""
    value = f"/srv/ws{char}ExecStartPre=/bin/touch /tmp/pwned"
    with pytest.raises(ConfigError) as caught:
        check_path("--workspace", value)
    message = str(caught.value)
    assert message.startswith(f"--workspace {value!r}: holds ")
    assert f"U+{ord(char):04X} at index 7" in message
    assert len(message.splitlines()) == 1 and forbidden(message) is None


@pytest.mark.parametrize("char", ALLOWED)
def test_other_characters_are_a_path_like_any_other(char: str) -> None:
    """Spaces, quotes, backslashes, `%`, `$`, non-ASCII letters, emoji: accepted."""
    check_path("--workspace", f"/srv/a{char}b")


def test_a_relative_path_is_checked_with_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ws` given in a directory whose name holds a newline is `<cwd>/ws` once made absolute:
    refused, showing the absolute path."""
    cwd = tmp_path / "a\nb"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigError, match="holds a control character") as caught:
        check_path("--state-dir", "ws")
    assert repr(str(cwd / "ws")) in str(caught.value)
    os.chdir(tmp_path)
    check_path("--state-dir", "ws")


def test_a_long_value_is_shown_cut() -> None:
    """A 1 MB value is shown in at most about `SHOWN_MAX` characters."""
    with pytest.raises(ConfigError) as caught:
        check_path("PLAN", "/" + "x" * 1_000_000 + "\n")
    assert len(str(caught.value)) < SHOWN_MAX + 100


def test_none_is_nothing_given_and_the_first_bad_one_is_named() -> None:
    """`check_paths` skips None and names the first refused value in order."""
    with pytest.raises(ConfigError, match=r"^--run-dir "):
        check_paths({"--config": None, "--run-dir": Path("/r\n"), "--keys": "/k\n"})


def test_a_path_that_is_not_utf8_is_refused_with_the_byte_named() -> None:
    """A non-UTF-8 byte (a lone surrogate after os.fsdecode) is refused in one line that names
    the byte: the tree's paths travel as text in its frames, which cannot carry it."""
    value = os.fsdecode(b"/tmp/caf\xe9")
    with pytest.raises(ConfigError) as caught:
        check_path("--state-dir", value)
    message = str(caught.value)
    assert "not UTF-8 (0xE9 at index 8)" in message
    assert "\n" not in message
    message.encode()  # the message itself is always printable


def test_a_clean_path_is_shown_as_itself_and_a_hostile_one_escaped() -> None:
    """`shown_path` leaves an ordinary path alone and escapes one that would break a line."""
    assert shown_path("/srv/a b") == "/srv/a b"
    assert shown_path("/tmp/a\nb") == "'/tmp/a\\nb'"
