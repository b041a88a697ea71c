"""`ctl approve --grant`: what a grant may say, and how each bad one is refused."""

from __future__ import annotations

import pytest

from orchestra_sup.client.grant import parse_grant
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        (
            "wall_s=60,cpu_s=10,output_bytes=1000000",
            f.Budget(wall_s=60.0, cpu_s=10.0, output_bytes=1_000_000),
        ),
        ("cpu_s=0.5", f.Budget(cpu_s=0.5)),
        (" wall_s = 1.5 , output_bytes=1 ", f.Budget(wall_s=1.5, output_bytes=1)),
    ],
)
def test_good_grants(text: str, budget: f.Budget) -> None:
    """Each known key once, positive values; spaces around items are fine; the rest is None."""
    got = parse_grant(text)
    assert got == budget
    assert isinstance(got.output_bytes, int | None)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("", ["''", "KEY=VALUE"]),
        ("wall_s", ["'wall_s'", "KEY=VALUE"]),
        ("=5", ["'=5'", "KEY=VALUE"]),
        ("wall_s=60,", ["KEY=VALUE"]),
        ("memory=5", ["unknown key 'memory'", "wall_s, cpu_s, output_bytes"]),
        ("wall_s=1,wall_s=2", ["wall_s given twice"]),
        ("wall_s=abc", ["wall_s='abc'", "a number"]),
        ("output_bytes=1.5", ["output_bytes='1.5'", "an integer"]),
        ("output_bytes=", ["output_bytes=''", "an integer"]),
        ("wall_s=0", ["wall_s=0", "positive"]),
        ("cpu_s=-1", ["cpu_s=-1", "positive"]),
        ("output_bytes=0", ["output_bytes=0", "positive"]),
        ("wall_s=inf", ["wall_s=inf", "finite"]),
        ("wall_s=nan", ["wall_s=nan", "finite"]),
    ],
)
def test_bad_grants_name_the_item(text: str, needles: list[str]) -> None:
    """A bad grant is a `ConfigError` (exit 2, one line) that says which item and why."""
    with pytest.raises(ConfigError) as info:
        parse_grant(text)
    message = str(info.value)
    assert message.startswith("--grant") and "\n" not in message
    for needle in needles:
        assert needle in message, message
