"""How to write, for a person to paste, the ctl command that reaches the tree this one did.

A hint such as "answer with: orchestra-sup ctl --run-dir /tmp/t approve LANE" is only worth
printing if it works when pasted: it names the program as this process was started (a
`.venv/bin/orchestra-sup` not on `PATH`, `python -m orchestra_sup`) and repeats the options
that chose the tree (`--run-dir`, or `--connect` with its keys), each quoted for the shell.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

PROGRAM = "orchestra-sup"


def program() -> str:
    """The command that runs this program: `orchestra-sup` when that is what `PATH` finds,
    else the path this process was started by (made absolute: the hint may be pasted in another
    directory), or `PYTHON -m orchestra_sup`."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "__main__.py" or not argv0:
        return f"{shlex.quote(sys.executable)} -m orchestra_sup"
    found = shutil.which(PROGRAM)
    try:
        if found is not None and os.path.samefile(found, argv0):
            return PROGRAM
    except OSError:  # argv0 names no file (a wrapper that set it): say it as it was
        pass
    return shlex.quote(os.path.abspath(argv0) if os.sep in argv0 else argv0)


def ctl_command(
    run_dir: Path | None, connect: str | None, keys_dir: Path | None, key: str | None
) -> str:
    """`program() ctl` and the options that chose the tree: `--connect URL --keys DIR` (and
    `--key NAME` when given) for a remote tree, else `--run-dir DIR` when one was given (made
    absolute: the hint may be pasted elsewhere), else nothing (the default run directory)."""
    words = [program(), "ctl"]
    if connect is not None:
        words += ["--connect", shlex.quote(connect)]
        if keys_dir is not None:
            words += ["--keys", shlex.quote(str(keys_dir.absolute()))]
        if key is not None:
            words += ["--key", shlex.quote(key)]
    elif run_dir is not None:
        words += ["--run-dir", shlex.quote(str(run_dir.absolute()))]
    return " ".join(words)
