"""Process titles (`orchestra_sup.system.proctitle`): their shape, a title written only when it
changes, and a process that runs untitled when setproctitle cannot be imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestra_sup.system import proctitle
from orchestra_sup.system.proctitle import ProcTitle, child_title, supervisor_title


def test_titles() -> None:
    """A shard shows its lanes against its capacity, the coordinator its plans not done, the
    custodian only its generation, the supervisor its running children."""
    assert child_title("shard-1", "shard", 3, 5, 8) == "orchestra-sup: shard-1 gen=3 lanes=5/8"
    assert child_title("coordinator", "coordinator", 2, 1, 8) == (
        "orchestra-sup: coordinator gen=2 plans=1"
    )
    assert child_title("custodian", "custodian", 1, 4, 8) == "orchestra-sup: custodian gen=1"
    assert supervisor_title(4, 5) == "orchestra-sup: supervisor children=4/5"


def test_a_title_is_written_only_when_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Showing the title already shown writes nothing (a heartbeat's worth of calls is free)."""
    written: list[str] = []
    monkeypatch.setattr(proctitle, "_setproctitle", written.append)
    title = ProcTitle()
    for text in ("a", "a", "b", "b", "a"):
        title.show(text)
    assert written == ["a", "b", "a"]


SHOW = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(message)s")
if sys.argv[1] == "blocked":
    sys.modules["setproctitle"] = None  # import setproctitle raises ImportError
from orchestra_sup.system.proctitle import ProcTitle
title = ProcTitle()
title.show("orchestra-sup: shard-0 gen=1 lanes=0/8")
title.show("orchestra-sup: shard-0 gen=1 lanes=1/8")
print(open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode())
"""


def test_the_title_is_the_command_line_ps_shows() -> None:
    """With setproctitle, the title replaces the process's command line."""
    done = subprocess.run(
        [sys.executable, "-c", SHOW, "real"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "orchestra-sup: shard-0 gen=1 lanes=1/8"


def test_without_setproctitle_the_process_runs_untitled() -> None:
    """setproctitle not importable: the command line stays, one debug line says so, no error."""
    done = subprocess.run(
        [sys.executable, "-c", SHOW, "blocked"], capture_output=True, text=True, check=True
    )
    assert done.stdout.split("\0")[-1].strip() == "blocked"
    said = [line for line in done.stderr.splitlines() if "setproctitle" in line]
    assert len(said) == 1 and said[0].startswith("DEBUG "), done.stderr
