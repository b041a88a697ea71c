"""The typed channels are checked by a type checker: a frame a receiver's union holds and its
handler has no case for is an error (`assert_never` on what is left), as is a tool the
registry's unions hold and a dispatch forgets (docs/adr/0017).

mypy runs on the modules that hold the receivers' handlers, the toolkit and the channel; it
follows their imports silently (what they import is not held to it here: the whole package is
not yet typed clean, ADR 0017 says what is left).
"""

from __future__ import annotations

from pathlib import Path

from mypy import api

PACKAGE = Path(__file__).resolve().parents[2] / "orchestra_sup"
CHECKED = [
    "coordinator/role.py",
    "coordinator/toolkit.py",
    "custodian/role.py",
    "shards/role.py",
    "supervisor/ctl.py",
    "protocol/channel.py",
    "transitions.py",
]


def _mypy(paths: list[Path], cache: Path) -> tuple[str, int]:
    out, err, status = api.run(
        [
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--no-error-summary",
            "--cache-dir",
            str(cache),
            *map(str, paths),
        ]
    )
    return out + err, status


def test_the_handlers_type_check(tmp_path: Path) -> None:
    said, status = _mypy([PACKAGE / name for name in CHECKED], tmp_path / "cache")
    assert status == 0, said


def test_a_handler_that_drops_a_case_is_a_type_error(tmp_path: Path) -> None:
    """The check itself bites: the custodian's handler with its `SandboxCommit` case removed."""
    source = (PACKAGE / "custodian/role.py").read_text()
    case = "            case f.SandboxCommit():\n"
    start = source.index(case)
    end = source.index("            case ", start + len(case))
    broken = tmp_path / "orchestra_sup" / "custodian" / "role.py"
    broken.parent.mkdir(parents=True)
    broken.write_text(source[:start] + source[end:])
    said, status = _mypy([broken], tmp_path / "cache")
    assert status == 1
    assert 'Argument 1 to "assert_never" has incompatible type "SandboxCommit"' in said
