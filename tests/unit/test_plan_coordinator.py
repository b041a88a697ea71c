"""A plan's `coordinator` and `[args]` keys (coordinator/plan.py): who decides, and what it gets."""

from __future__ import annotations

import msgspec
import pytest

from orchestra_sup.coordinator.plan import parse_plan, validate_plan
from orchestra_sup.errors import PlanError


def test_default_is_the_dag() -> None:
    spec = parse_plan('name = "p"\n[[task]]\nid = "a"\nrun = "true"\n')
    assert spec.coordinator == "dag" and spec.args == {}


def test_a_program_plan_has_args_and_no_tasks() -> None:
    spec = parse_plan('name = "p"\ncoordinator = "bisect"\n[args]\ngood = "v1"\nparallel = 3\n')
    assert spec.coordinator == "bisect"
    assert spec.args == {"good": "v1", "parallel": 3}
    assert spec.tasks == []


def test_module_class_is_taken() -> None:
    spec = parse_plan('name = "p"\ncoordinator = "mine.programs:Loop"\n')
    assert spec.coordinator == "mine.programs:Loop" and spec.args == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('coordinator = "bisec"', "did you mean 'bisect'"),
        ('coordinator = "no colon"', "'module:Class'"),
        ("coordinator = 3", "'module:Class', got 3 (integer)"),
        ('coordinator = "fanout"\nargs = 3', "'args' must be a table"),
        ("[args]\nx = 1", "the dag coordinator takes none"),
        ('coordinator = "fanout"\n[[task]]\nid = "a"\nrun = "x"', "no [[task]] tables"),
    ],
)
def test_bad_coordinator_keys_are_refused_in_one_line(text: str, words: str) -> None:
    with pytest.raises(PlanError) as err:
        parse_plan(f'name = "p"\n{text}\n')
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_program_plan_survives_the_wire_check() -> None:
    """The coordinator checks a submitted PlanSpec again (`validate_plan`): a session's spec,
    encoded and decoded as the wire does, passes unchanged."""
    spec = parse_plan('name = "p"\ncoordinator = "fanout"\n[args]\nruns = ["a", "b"]\n')
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=type(spec))
    assert validate_plan(wire) == spec
