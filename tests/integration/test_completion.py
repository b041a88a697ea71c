"""Shell completion as bash runs it: the script `--show-completion` prints, sourced into a real
bash, completes commands and options."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(sys.executable).parent / "orchestra-sup"
"""The console script completion is installed for (pip's entry point beside this interpreter)."""


def complete(*words: str) -> list[str]:
    """What bash offers for the command line `words` (the last one being completed)."""
    program = (
        "source <(orchestra-sup --show-completion)\n"
        f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}\n"
        "_orchestra_sup_completion orchestra-sup\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = dict(os.environ, PATH=f"{SCRIPT.parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.skipif(not SCRIPT.exists(), reason=f"no console script at {SCRIPT} (not installed)")
def test_bash_completes_commands_and_options() -> None:
    """`ctl to` completes to `top`, `ctl top --int` to `--interval`, `bench ` to every bench."""
    assert complete("orchestra-sup", "ctl", "to") == ["top"]
    assert complete("orchestra-sup", "ctl", "top", "--int") == ["--interval"]
    benches = complete("orchestra-sup", "bench", "''")
    assert {"relay", "isolation", "scale", "all", "chaos", "persist", "restart"} <= set(benches)
