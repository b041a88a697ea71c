"""Paths a user hands orchestra-sup, refused when they hold a character no path of ours may.

A path given to `start`, `run` or `systemd-unit` (an option, an argument, an environment
variable that stands in for one) ends up in files and lines other programs read line by line:
a systemd unit, git's `objects/info/alternates` (the custodian's clones), log lines, error
messages. A newline in it is a new line there (`--workspace $'/srv/ws\\nExecStartPre=...'` was
a directive of the unit). So such a path is refused before anything is created, in one line
that names where it came from and shows it escaped.

Refused: the control characters (Unicode category Cc: U+0000-U+001F, U+007F-U+009F, which
holds `\\n`, `\\r`, `\\t`, NUL, ESC and NEL), the line and paragraph separators U+2028 and
U+2029 (line breaks to `str.splitlines` and many log readers), and bytes that are not UTF-8
(`os.fsdecode` makes each a lone surrogate, U+DC80-U+DCFF: the tree's own paths travel as text
in its frames, which cannot carry one). Any other character, spaces, quotes, `%`, `$` and
non-ASCII letters included, is a path like any other.
"""

from __future__ import annotations

import contextlib
import os
import unicodedata
from collections.abc import Mapping

from orchestra_sup.errors import ConfigError

SHOWN_MAX = 240
"""Characters of the escaped value an error shows; the rest is cut with "..."."""
LINE_SEPARATORS = frozenset("\u2028\u2029")


def forbidden(text: str) -> tuple[int, str] | None:
    """The index and the character of the first refused character in `text`, or None."""
    for index, char in enumerate(text):
        if char in LINE_SEPARATORS or unicodedata.category(char) in ("Cc", "Cs"):
            return index, char
    return None


def shown(text: str) -> str:
    """`text` escaped as Python's `repr` does (`'/srv/ws\\nx'`), at most about `SHOWN_MAX`
    characters."""
    escaped = repr(text)
    return escaped if len(escaped) <= SHOWN_MAX else escaped[: SHOWN_MAX - 3] + "..."


def shown_path(value: str | os.PathLike[str]) -> str:
    """A path for a message of one line: itself when it holds nothing `forbidden` refuses, else
    escaped (`shown`)."""
    text = os.fspath(value)
    return text if forbidden(text) is None else shown(text)


def check_text(where: str, text: str) -> None:
    """Refuse `text` when it holds a control character or a line separator; `where` names it
    for the user: an option (`--workspace`), an argument (`PLAN`), a variable
    (`$STATE_DIRECTORY`). Raises `ConfigError`, one line:
    `--workspace '/srv/ws\\nExecStartPre=/x': holds a control character (U+000A at index
    7); a path may not`."""
    found = forbidden(text)
    if found is None:
        return
    index, char = found
    if unicodedata.category(char) == "Cs":
        what = f"a byte that is not UTF-8 (0x{ord(char) - 0xDC00:02X} at index {index})"
    else:
        kind = "a line separator" if char in LINE_SEPARATORS else "a control character"
        what = f"{kind} (U+{ord(char):04X} at index {index})"
    raise ConfigError(f"{where} {shown(text)}: holds {what}; a path may not")


def check_path(where: str, value: str | os.PathLike[str] | None) -> None:
    """`check_text` on the path `value` as it will be used: made absolute against the working
    directory when it is relative (the working directory's own name counts too). None: nothing
    given, nothing to check. Raises `ConfigError`."""
    if value is None:
        return
    text = os.fspath(value)
    if not os.path.isabs(text):
        with contextlib.suppress(OSError):  # no working directory (removed): used as given
            text = os.path.join(os.getcwd(), text)
    check_text(where, text)


def check_paths(values: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """`check_path` on each (where, value) in order; raises `ConfigError` for the first
    refused one."""
    for where, value in values.items():
        check_path(where, value)
