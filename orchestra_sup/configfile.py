"""Reading a config file, and showing its values in errors: bounded both ways, so a file
pasted by mistake (or by someone hostile) never blocks the reader, fills its memory, or becomes
a 100 MB log line."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from orchestra_sup.errors import ConfigError

SHOWN_MAX = 60
"""Characters of a value an error message shows; the rest is cut with "..."."""
MESSAGE_MAX = 400
"""Characters a config error keeps. A key or value pasted by mistake (or by someone hostile)
must not become a 100 MB log line, or a `ctl reload` answer over the frame limit."""
CONFIG_MAX_BYTES = 1 << 20
"""The largest config file read (1 MiB); a tree's config is a few KiB."""


def toml_value(value: Any, budget: int = SHOWN_MAX) -> str:
    """`value` as it would be written in the TOML file (true, not True), at most about
    `budget` characters: longer text is cut with "...", a long array after the elements that
    fit (without rendering the rest, however many there are)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        parts: list[str] = []
        used = 0
        for item in value:
            if used >= budget:
                parts.append("...")
                break
            part = toml_value(item, budget - used)
            parts.append(part)
            used += len(part) + 2
        return "[" + ", ".join(parts) + "]"
    if isinstance(value, str):
        text = '"' + value[: budget + 1].replace("\\", "\\\\").replace('"', '\\"') + '"'
    elif isinstance(value, dict):
        text = "{...}"
    else:
        text = repr(value)
    return text if len(text) <= budget else text[: budget - 3] + "..."


def bounded(message: str) -> str:
    """`message` cut to `MESSAGE_MAX` characters, saying how long it was."""
    if len(message) <= MESSAGE_MAX:
        return message
    return f"{message[:MESSAGE_MAX]}... ({len(message)} characters)"


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML table in the regular file `path`, read without blocking on a fifo or a device
    and without reading more than `CONFIG_MAX_BYTES`. Raises `ConfigError` (one line naming
    the file) when it cannot be opened, is not a regular file, is too large, is not UTF-8 or
    is not TOML."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"config {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"config {path}: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        try:
            raw = fh.read(CONFIG_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"config {path}: {exc.strerror}") from exc
    if len(raw) > CONFIG_MAX_BYTES:
        raise ConfigError(f"config {path}: larger than {CONFIG_MAX_BYTES // 1024} KiB")
    try:
        return tomllib.loads(raw.decode())
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path}: not UTF-8 ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"config {path}: nested too deeply") from None
