"""How every process of the tree writes its log: one line per event on stderr.

Each line carries the process (`proc`: supervisor, coordinator, custodian, shard-N) and its
generation (`gen`), the level, the logger and the message. Two formats (`start --log-format`):

- `text` (default), logfmt: `proc=shard-1 gen=3 level=info logger=orchestra_sup.shards.role
  msg="shard-1: lanes run with isolation none"`. A value is quoted when it is empty or holds a
  space, `=`, `"` or a control character; inside quotes `\\`, `"`, newline, carriage return and
  tab are escaped as in logfmt (`\\n` ...), other control characters as `\\u00XX`. No timestamp:
  journald (or whatever reads stderr) stamps each line as it arrives.
- `json`: one JSON object per line with the same fields, plus `ts`, when the event happened
  (RFC 3339, UTC, microseconds). A machine that reads stderr from a file or a pipe has no other
  time for an event, and a collector's arrival time is not the event's; under journald the
  field is redundant, at the cost of a few bytes.

A traceback is the `exc` field (and `logging`'s `stack_info` the `stack` field) of the event's
one line: newlines are escaped, never written. When systemd connected stderr to the journal
(`$JOURNAL_STREAM` is stderr's `device:inode`, sd_journal_stream_fd(3), systemd.exec(5)), each
line starts with its syslog priority, `<N>`, which journald strips and records as the entry's
PRIORITY (sd-daemon(3)): `<2>` critical, `<3>` error, `<4>` warning, `<6>` info, `<7>` debug.
Checking the device and inode, not just that the variable is set, keeps a process whose stderr
was redirected (to a file, a pipe) while it inherited the variable from free of prefixes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TextIO

from orchestra_sup.errors import ConfigError


class LogFormat(StrEnum):
    """The format of the log lines (`start --log-format`); see the module docstring."""

    TEXT = "text"
    JSON = "json"


SUPERVISOR = "supervisor"
"""The `proc` of the root supervisor's lines (a child's is its name: `ChildArgs.name`)."""


def parse_format(text: str) -> LogFormat:
    """`text` as a `LogFormat`. Raises `ConfigError` (naming the option) for anything else."""
    try:
        return LogFormat(text)
    except ValueError:
        choices = " or ".join(each.value for each in LogFormat)
        raise ConfigError(f"--log-format {text!r}: give {choices}") from None


def priority(levelno: int) -> int:
    """The syslog priority of a `logging` level (sd-daemon(3)'s `SD_*` prefixes): CRITICAL and
    above 2, ERROR 3, WARNING 4, INFO 6, anything below INFO 7 (debug). A custom level between
    two takes the lower one's priority; nothing maps to 5 (notice), which `logging` lacks."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def journal_stream(stream: TextIO) -> bool:
    """True when `$JOURNAL_STREAM` (`device:inode`, decimal) names the file `stream` writes to.
    False when the variable is unset or malformed, or `stream` has no descriptor (a test's
    `StringIO`) or one that cannot be stat'ed."""
    dev, sep, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (sep and dev.isascii() and dev.isdigit() and ino.isascii() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


_NEEDS_QUOTES = re.compile(r'[\s="\x00-\x1f\x7f-\x9f]')
"""A character that would end an unquoted logfmt value or break its line (`\\s` covers the
Unicode line and paragraph separators)."""

_ESCAPES: dict[int, str] = {
    **{code: f"\\u{code:04x}" for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)},
    ord("\\"): "\\\\",
    ord('"'): '\\"',
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def logfmt_value(value: object) -> str:
    """`value` as a logfmt value: as it is when it needs no quotes, else quoted and escaped (see
    the module docstring). None is `?` (unknown), written bare."""
    text = "?" if value is None else str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + text.translate(_ESCAPES) + '"'


MSG_MAX = 8192
"""Characters of a message (and of a traceback) a line keeps; the rest is cut, saying how long
it was. journald splits lines over its LineMax (48 KiB by default), which would break a JSON
object in two; a 1 MB plan name must not make a 1 MB line."""


def _cut(text: str) -> str:
    return text if len(text) <= MSG_MAX else f"{text[:MSG_MAX]}... ({len(text)} characters)"


class EventFormatter(logging.Formatter):
    """One log record as one line (no newline in it): the fields of `fields`, rendered by a
    subclass, behind `<N>` when `journal`. `proc` and `generation` are this process's (None:
    not known yet, the re-executed supervisor before it has read its hand-off)."""

    def __init__(self, proc: str, generation: int | None, *, journal: bool):
        super().__init__()
        self.proc = proc
        self.generation = generation
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        line = self.render(self.fields(record), record)
        return f"<{priority(record.levelno)}>{line}" if self.journal else line

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """proc, gen, level (lower case), logger, msg, and exc (the traceback) or stack when
        the record has one, in that order."""
        fields: dict[str, Any] = {
            "proc": self.proc,
            "gen": self.generation,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _cut(record.getMessage()),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            fields["exc"] = _cut(record.exc_text)
        if record.stack_info:
            fields["stack"] = _cut(self.formatStack(record.stack_info))
        return fields

    def render(self, fields: dict[str, Any], record: logging.LogRecord) -> str:
        raise NotImplementedError


class TextFormatter(EventFormatter):
    """`key=value` pairs, logfmt-quoted (`logfmt_value`), no timestamp."""

    def render(self, fields: dict[str, Any], record: logging.LogRecord) -> str:
        return " ".join(f"{key}={logfmt_value(value)}" for key, value in fields.items())


class JsonFormatter(EventFormatter):
    """A JSON object: `ts` (RFC 3339, UTC), then the fields; non-ASCII text as it is, but for
    U+2028 and U+2029, escaped."""

    def render(self, fields: dict[str, Any], record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds")
        line = json.dumps({"ts": ts, **fields}, ensure_ascii=False, separators=(",", ":"))
        # valid JSON raw, but line breaks to anything that splits on Unicode line boundaries
        return line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


FORMATTERS: dict[LogFormat, type[EventFormatter]] = {
    LogFormat.TEXT: TextFormatter,
    LogFormat.JSON: JsonFormatter,
}


def configure(
    proc: str,
    generation: int | None,
    fmt: LogFormat = LogFormat.TEXT,
    *,
    level: int = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """Send this process's log records at `level` and above to `stream` (default: stderr), one
    line each in format `fmt`, tagged `proc` and `generation`. Replaces whatever handlers the
    root logger had (a forked child must not keep its template's, a re-executed supervisor
    reconfigures once it knows its generation). The journal prefix is decided here, once:
    `$JOURNAL_STREAM` against `stream` (`journal_stream`)."""
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(FORMATTERS[fmt](proc, generation, journal=journal_stream(out)))
    logging.basicConfig(level=level, handlers=[handler], force=True)
