"""Log lines (`orchestra_sup.logformat`): logfmt quoting, one line per event, the JSON shape, and
the journald priority prefix only when stderr is the journal's stream."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra_sup import logformat
from orchestra_sup.errors import ConfigError
from orchestra_sup.logformat import LogFormat, configure, logfmt_value, priority

UNESCAPE = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"'}


def parse_logfmt(line: str) -> dict[str, str]:
    """A strict logfmt reader: `key=value` pairs separated by one space, values bare or quoted
    with the escapes `logfmt_value` writes. Fails on anything else."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(line):
        eq = line.index("=", i)
        key, i = line[i:eq], eq + 1
        if line[i : i + 1] == '"':
            i += 1
            out = []
            while line[i] != '"':
                if line[i] == "\\":
                    if line[i + 1] == "u":
                        out.append(chr(int(line[i + 2 : i + 6], 16)))
                        i += 6
                    else:
                        out.append(UNESCAPE[line[i + 1]])
                        i += 2
                else:
                    out.append(line[i])
                    i += 1
            value, i = "".join(out), i + 1
        else:
            end = line.find(" ", i)
            end = len(line) if end < 0 else end
            value, i = line[i:end], end
        assert key not in fields, f"{key} twice in {line!r}"
        fields[key] = value
        if i < len(line):
            assert line[i] == " ", line
            i += 1
    return fields


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    for handler in root.handlers[:]:
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("plain", "plain"),
        ("orchestra_sup.shards.role", "orchestra_sup.shards.role"),
        ("C:\\dir", "C:\\dir"),
        ("é", "é"),
        ("", '""'),
        ("two words", '"two words"'),
        ("k=v", '"k=v"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a\\b c", '"a\\\\b c"'),
        ("one\ntwo", '"one\\ntwo"'),
        ("cr\rtab\t", '"cr\\rtab\\t"'),
        ("\x1b[31mred", '"\\u001b[31mred"'),
        ("nbsp\xa0", '"nbsp\xa0"'),
        ("line\u2028sep", '"line\\u2028sep"'),
        (None, "?"),
        (3, "3"),
    ],
)
def test_logfmt_quotes_only_what_needs_it(value: object, written: str) -> None:
    """A value is bare unless empty or holding a space, '=', '"' or a control character; inside
    quotes backslash, quote, newline, CR and tab are escaped, other controls as \\u00XX."""
    assert logfmt_value(value) == written


@given(st.text())
def test_any_text_survives_logfmt_on_one_line(text: str) -> None:
    """Whatever a message holds, its value is one line that reads back as the same text."""
    written = logfmt_value(text)
    assert "\n" not in written and "\r" not in written
    assert parse_logfmt(f"msg={written}") == {"msg": text}


@pytest.mark.parametrize(
    ("level", "prio"),
    [
        (logging.DEBUG, 7),
        (5, 7),
        (logging.INFO, 6),
        (25, 6),
        (logging.WARNING, 4),
        (logging.ERROR, 3),
        (45, 3),
        (logging.CRITICAL, 2),
        (60, 2),
    ],
)
def test_level_to_syslog_priority(level: int, prio: int) -> None:
    """sd-daemon(3)'s prefixes: critical 2, error 3, warning 4, info 6, debug 7; a level between
    two takes the lower one's."""
    assert priority(level) == prio


def test_parse_format_names_the_option() -> None:
    """text and json are formats; anything else is a ConfigError naming --log-format."""
    assert logformat.parse_format("text") is LogFormat.TEXT
    assert logformat.parse_format("json") is LogFormat.JSON
    with pytest.raises(ConfigError, match="--log-format 'xml': give text or json"):
        logformat.parse_format("xml")


def log_events(fmt: LogFormat, path: Path, generation: int | None = 3) -> list[str]:
    """Configure logging to `path` as shard-1, log two events (one multi-line, one with a
    traceback), and return the file's lines."""
    with path.open("w") as out:
        configure("shard-1", generation, fmt, stream=out)
        log = logging.getLogger("orchestra_sup.test")
        log.warning("first line\nsecond line")
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            log.exception("it failed")
    return path.read_text().split("\n")[:-1]  # the file ends with a newline


def test_text_lines_carry_proc_gen_and_escape_tracebacks(
    root_logger: logging.Logger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One logfmt line per event, fields in order; a multi-line message and a traceback stay on
    their event's line; no timestamp."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    lines = log_events(LogFormat.TEXT, tmp_path / "log")
    assert len(lines) == 2
    first, second = (parse_logfmt(line) for line in lines)
    assert first == {
        "proc": "shard-1",
        "gen": "3",
        "level": "warning",
        "logger": "orchestra_sup.test",
        "msg": "first line\nsecond line",
    }
    assert list(second) == ["proc", "gen", "level", "logger", "msg", "exc"]
    assert second["level"] == "error" and second["msg"] == "it failed"
    assert second["exc"].startswith("Traceback (most recent call last):\n")
    assert second["exc"].endswith("ValueError: bad\nvalue")


def test_json_lines_are_objects_with_a_utc_timestamp(
    root_logger: logging.Logger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One JSON object per line: ts (RFC 3339, UTC), proc, gen (a number), level, logger, msg,
    and exc for a traceback."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    before = datetime.now(UTC)
    lines = log_events(LogFormat.JSON, tmp_path / "log")
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert list(first) == ["ts", "proc", "gen", "level", "logger", "msg"]
    assert first["proc"] == "shard-1" and first["gen"] == 3 and first["level"] == "warning"
    assert first["msg"] == "first line\nsecond line"
    stamp = datetime.fromisoformat(first["ts"])
    assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0
    assert before.replace(microsecond=0) <= stamp <= datetime.now(UTC)
    assert second["exc"].endswith("ValueError: bad\nvalue")


def test_unknown_generation(
    root_logger: logging.Logger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation not known yet is `gen=?` in text and null in JSON, never left out."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert parse_logfmt(log_events(LogFormat.TEXT, tmp_path / "t", None)[0])["gen"] == "?"
    assert json.loads(log_events(LogFormat.JSON, tmp_path / "j", None)[0])["gen"] is None


@pytest.mark.parametrize("fmt", list(LogFormat))
def test_priority_prefix_only_when_stderr_is_the_journal_stream(
    fmt: LogFormat,
    root_logger: logging.Logger,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With JOURNAL_STREAM naming the stream's own device:inode every line starts with its
    priority, and what follows is the line unprefixed; with another inode, a malformed value or
    none, no line does."""
    path = tmp_path / "log"
    path.touch()
    st = os.stat(path)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    prefixed = log_events(fmt, path)
    assert [line[:3] for line in prefixed] == ["<4>", "<3>"]
    monkeypatch.delenv("JOURNAL_STREAM")
    plain = log_events(fmt, path)
    parse = json.loads if fmt is LogFormat.JSON else parse_logfmt
    for with_prefix, without in zip(prefixed, plain, strict=True):
        a, b = parse(with_prefix[3:]), parse(without)
        a.pop("ts", None), b.pop("ts", None)
        assert a == b
    for other in (
        f"{st.st_dev}:{st.st_ino + 1}",
        f"{st.st_dev + 1}:{st.st_ino}",
        "x:y",
        "12",
        "\u00b2:\u00b3",
    ):
        monkeypatch.setenv("JOURNAL_STREAM", other)
        assert not any(line.startswith("<") for line in log_events(fmt, path)), other


def test_a_stream_without_a_descriptor_gets_no_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream with no file descriptor (StringIO) is never the journal's."""
    monkeypatch.setenv("JOURNAL_STREAM", "1:1")
    assert logformat.journal_stream(io.StringIO()) is False


def test_a_line_is_bounded_and_breaks_on_no_unicode_line_separator() -> None:
    """A huge message is cut to `MSG_MAX` characters, saying how long it was; in JSON, U+2028
    and U+2029 (valid raw JSON, but line breaks to `str.splitlines` and many readers) are
    escaped, so every event stays one line whatever reads it."""
    from orchestra_sup.logformat import MSG_MAX, JsonFormatter, TextFormatter

    huge = logging.LogRecord("t", logging.INFO, __file__, 1, "x" * 1_000_000, None, None)
    for formatter in (
        TextFormatter("shard-0", 1, journal=False),
        JsonFormatter("shard-0", 1, journal=False),
    ):
        line = formatter.format(huge)
        assert len(line) < MSG_MAX + 200 and "(1000000 characters)" in line
    odd = logging.LogRecord("t", logging.INFO, __file__, 1, "a\u2028b\u2029c", None, None)
    line = JsonFormatter("shard-0", 1, journal=False).format(odd)
    assert len(line.splitlines()) == 1
    assert json.loads(line)["msg"] == "a\u2028b\u2029c"
