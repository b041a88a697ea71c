"""A command run as a person runs it at a terminal of a given size: under a real pseudo-terminal
(`TIOCSWINSZ` set, `COLUMNS` and `LINES` to match, as a shell exports them), with what it drew
read back and its escape sequences removed."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

DEADLINE_S = 60.0
"""How long a command may take to finish drawing before the test fails as hung."""
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def at_terminal(
    *args: str, columns: int, rows: int = 50, env: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """Run `orchestra-sup ARGS` on a pty of `columns` x `rows`; its exit status and the lines
    it printed (stdout and stderr, as a terminal shows both), escape sequences removed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    environ = {**os.environ, **(env or {}), "TERM": "xterm-256color"}
    environ.update(COLUMNS=str(columns), LINES=str(rows))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestra_sup", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=environ,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + DEADLINE_S
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"orchestra-sup {' '.join(args)} did not finish: {seen[-2000:]!r}"
            if not select.select([master], [], [], left)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty has closed it
                break
            if not chunk:
                break
            seen += chunk
        code = proc.wait(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = ESCAPES.sub("", seen.decode(errors="replace")).replace("\r\n", "\n")
    return code, text.splitlines()


def row_of(lines: list[str], first: str) -> list[str]:
    """The cells of the table row whose first cell is `first` (or starts with it, cut): cells
    two or more spaces apart, or between box lines (a bordered table, as once printed)."""
    rows = [re.split(r"\s*[│┃]\s*|\s{2,}", ln.strip(" │┃")) for ln in lines]
    cells = next((r for r in rows if r[0] == first), None)
    cells = cells or next((r for r in rows if r[0] and first.startswith(r[0].rstrip("…"))), None)
    assert cells is not None, f"no row for {first!r} in:\n" + "\n".join(lines)
    return cells
