"""Lane programs: loading by name against the allow-list, and the shell verdict table."""

from __future__ import annotations

import pytest

from orchestra_sup.bench.scale import PARKED, Parked
from orchestra_sup.shards.program import Outcome, ProgramError, Shell, judge, load_program
from orchestra_sup.shards.shell import ShellOutcome


def test_shell_needs_no_permission() -> None:
    assert isinstance(load_program("shell", frozenset()), Shell)


def test_an_allowed_program_is_loaded_fresh_each_time() -> None:
    first = load_program(PARKED, frozenset({PARKED}))
    assert isinstance(first, Parked)
    assert load_program(PARKED, frozenset({PARKED})) is not first


@pytest.mark.parametrize(
    ("name", "allowed", "why"),
    [
        (PARKED, frozenset(), "is not in [lanes] programs"),
        ("os.system", frozenset({"os.system"}), "is not 'shell' or 'module:Class'"),
        ("no_such_module:X", frozenset({"no_such_module:X"}), "cannot be loaded"),
        ("os:NoSuchThing", frozenset({"os:NoSuchThing"}), "cannot be loaded"),
        ("os:getcwd", frozenset({"os:getcwd"}), "is not a class with a run method"),
        ("builtins:int", frozenset({"builtins:int"}), "is not a class with a run method"),
    ],
)
def test_programs_that_may_not_or_cannot_run_are_refused(
    name: str, allowed: frozenset[str], why: str
) -> None:
    with pytest.raises(ProgramError, match="program") as info:
        load_program(name, allowed)
    assert why in str(info.value)


def outcome(**kw: object) -> ShellOutcome:
    base = {
        "exit_code": None,
        "signal": None,
        "timed_out": False,
        "cancelled": False,
        "duration_s": 0.1,
        "output_tail": "",
        "output_bytes": 0,
    }
    return ShellOutcome(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shell", "verdict"),
    [
        (outcome(exit_code=0), Outcome(status="succeeded", exit_code=0)),
        (
            outcome(exit_code=3),
            Outcome(status="failed", exit_code=3, error="exited with status 3"),
        ),
        (outcome(signal=9), Outcome(status="failed", error="killed by signal 9")),
        (
            outcome(signal=9, timed_out=True),
            Outcome(status="failed", error="timed out after 2 s; its process group was killed"),
        ),
    ],
)
def test_judge(shell: ShellOutcome, verdict: Outcome) -> None:
    assert judge(shell, 2.0) == verdict
