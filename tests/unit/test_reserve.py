"""`[state] min_free` and the state disk's reserve (`system.reserve`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra_sup.config import settings_from_mapping
from orchestra_sup.errors import ConfigError, StateError
from orchestra_sup.system.reserve import DiskReserve, MinFree, parse_min_free


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("5%", MinFree(bytes=0, percent=5.0)),
        (" 0.5 % ", MinFree(bytes=0, percent=0.5)),
        (1 << 30, MinFree(bytes=1 << 30, percent=0.0)),
        (0, MinFree(bytes=0, percent=0.0)),
    ],
)
def test_min_free_is_bytes_or_a_share(value: object, parsed: MinFree) -> None:
    assert parse_min_free(value) == parsed


@pytest.mark.parametrize("value", [-1, "100%", "5", "1GiB", True, 2.5, "%", 2**61])
def test_a_bad_min_free_is_refused_in_one_line(value: object) -> None:
    with pytest.raises(ConfigError, match=r"\[state\] min_free"):
        parse_min_free(value)


def test_the_state_section_defaults_to_five_percent_and_names_unknown_keys() -> None:
    assert settings_from_mapping({}).min_free == MinFree(percent=5.0)
    assert settings_from_mapping({"state": {"min_free": 10}}).min_free.of(1 << 40) == 10
    with pytest.raises(ConfigError, match=r"unknown key \[state\] min_fre.*min_free"):
        settings_from_mapping({"state": {"min_fre": 10}})


def test_the_reserve_refuses_below_and_accepts_above(tmp_path: Path) -> None:
    """A reserve larger than the disk is short and says why; none never is; both are read
    afresh each time (nothing latches)."""
    total = DiskReserve(tmp_path, MinFree(bytes=0, percent=0.0)).space().total
    short = DiskReserve(tmp_path, MinFree(bytes=total + 1, percent=0.0))
    assert short.space().short
    with pytest.raises(StateError, match=r"state disk nearly full: .* free of .*min_free"):
        short.check()
    short.min_free = MinFree(bytes=0, percent=0.0)
    short.check()
    assert not short.space().short


def test_a_state_directory_that_cannot_be_read_is_short(tmp_path: Path) -> None:
    assert DiskReserve(tmp_path / "gone", MinFree(bytes=0, percent=0.0)).space().short
