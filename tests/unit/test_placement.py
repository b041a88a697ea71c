"""Placement as a table: affinity, eligibility, score, tie-break (coordinator/placement.py)."""

from __future__ import annotations

import pytest

from orchestra_sup.coordinator.placement import (
    AffinityTicket,
    Need,
    ShardView,
    place,
    unplaceable,
)


def _shard(
    name: str,
    *,
    load: int = 0,
    capacity: int = 4,
    up: bool = True,
    gen: int = 1,
    caps: tuple[str, ...] = (),
    tenants: tuple[str, ...] = (),
) -> ShardView:
    return ShardView(
        name=name,
        generation=gen,
        up=up,
        capacity=capacity,
        load=load,
        capabilities=frozenset(caps),
        tenants=frozenset(tenants),
    )


PLACE_TABLE = [
    ("least loaded wins", [_shard("s0", load=3), _shard("s1", load=1), _shard("s2", load=2)], "s1"),
    ("least loaded beats name", [_shard("a", load=2), _shard("b", load=0)], "b"),
    (
        "tie broken by name",
        [_shard("s2", load=1), _shard("s1", load=1), _shard("s3", load=1)],
        "s1",
    ),
    ("full shard is not eligible", [_shard("s0", load=4), _shard("s1", load=3)], "s1"),
    ("over-full shard is not eligible", [_shard("s0", load=5), _shard("s1", load=3)], "s1"),
    ("down shard is not eligible", [_shard("s0", up=False), _shard("s1", load=3)], "s1"),
    (
        "stopping shard is not eligible",
        [
            ShardView(name="s0", generation=1, up=True, capacity=4, stopping=True),
            _shard("s1", load=3),
        ],
        "s1",
    ),
    ("zero capacity is not eligible", [_shard("s0", capacity=0), _shard("s1", load=2)], "s1"),
    ("single free shard", [_shard("only", load=3)], "only"),
    ("all full", [_shard("s0", load=4), _shard("s1", load=4)], None),
    ("all down", [_shard("s0", up=False), _shard("s1", up=False)], None),
    ("full or down", [_shard("s0", load=4), _shard("s1", up=False)], None),
    ("no shards", [], None),
]


@pytest.mark.parametrize(
    ("shards", "expected"),
    [row[1:] for row in PLACE_TABLE],
    ids=[row[0] for row in PLACE_TABLE],
)
def test_place(shards: list[ShardView], expected: str | None) -> None:
    """place() picks the least loaded up shard with a free slot, ties by name, else None."""
    chosen = place(shards)
    assert (chosen.name if chosen else None) == expected
    if chosen is not None:
        assert any(chosen is s for s in shards)


def test_place_is_independent_of_input_order() -> None:
    """The same shards in any order give the same answer."""
    shards = [_shard("s2", load=1), _shard("s0", load=1), _shard("s1", load=1, up=False)]
    assert {place(list(p)).name for p in (shards, shards[::-1], shards[1:] + shards[:1])} == {"s0"}


GPU = Need(requires=frozenset({"gpu"}))
ELIGIBILITY_TABLE = [
    (
        "a capability only one shard offers",
        [_shard("s0"), _shard("s1", load=3, caps=("gpu",))],
        GPU,
        "s1",
    ),
    (
        "every capability required",
        [_shard("s0", caps=("gpu",)), _shard("s1", caps=("gpu", "py"))],
        Need(requires=frozenset({"gpu", "py"})),
        "s1",
    ),
    (
        "a shard with more than asked is eligible",
        [_shard("s0", load=1, caps=("gpu", "py"))],
        GPU,
        "s0",
    ),
    ("the capable shard is full", [_shard("s0"), _shard("s1", load=4, caps=("gpu",))], GPU, None),
    ("the capable shard is down", [_shard("s0"), _shard("s1", up=False, caps=("gpu",))], GPU, None),
    (
        "a dedicated shard serves its tenant",
        [_shard("s0", load=2), _shard("s1", load=3, tenants=("acme",))],
        Need(tenant="acme"),
        "s0",
    ),
    (
        "only the dedicated shard is free",
        [_shard("s0", load=4), _shard("s1", load=3, tenants=("acme",))],
        Need(tenant="acme"),
        "s1",
    ),
    (
        "a dedicated shard refuses other tenants",
        [_shard("s0", load=4), _shard("s1", tenants=("acme",))],
        Need(tenant="umbrella"),
        None,
    ),
    (
        "a dedicated shard refuses a plan with no tenant",
        [_shard("s1", tenants=("acme",))],
        Need(),
        None,
    ),
    (
        "tenant and capability together",
        [
            _shard("s0", caps=("gpu",), tenants=("umbrella",)),
            _shard("s1", load=2, caps=("gpu",), tenants=("acme",)),
        ],
        Need(requires=frozenset({"gpu"}), tenant="acme"),
        "s1",
    ),
]


@pytest.mark.parametrize(
    ("shards", "need", "expected"),
    [row[1:] for row in ELIGIBILITY_TABLE],
    ids=[row[0] for row in ELIGIBILITY_TABLE],
)
def test_eligibility_is_a_hard_filter(
    shards: list[ShardView], need: Need, expected: str | None
) -> None:
    """Capabilities and tenant filter before the score: a less loaded shard that does not
    qualify is never chosen, and no qualifying shard with room means None (wait)."""
    chosen = place(shards, need)
    assert (chosen.name if chosen else None) == expected


def ticket(shard: str, gen: int, boot: str = "boot1") -> AffinityTicket:
    return AffinityTicket(shard=shard, generation=gen, boot=boot)


AFFINITY_TABLE = [
    ("a live ticket skips the score", ticket("s1", 2), "boot1", "s1"),
    (
        "a restarted shard (older generation) falls back to fresh placement",
        ticket("s1", 1),
        "boot1",
        "s0",
    ),
    (
        "a ticket from an earlier run of the tree falls back",
        ticket("s1", 2, "boot0"),
        "boot1",
        "s0",
    ),
    ("a ticket for a shard that is gone falls back", ticket("s9", 2), "boot1", "s0"),
]


@pytest.mark.parametrize(
    ("tkt", "boot", "expected"),
    [row[1:] for row in AFFINITY_TABLE],
    ids=[row[0] for row in AFFINITY_TABLE],
)
def test_affinity_ticket(tkt: AffinityTicket, boot: str, expected: str) -> None:
    """A ticket sends the lane back to its shard while that generation lives, even when another
    shard is less loaded; otherwise placement is fresh."""
    shards = [_shard("s0", load=0), _shard("s1", load=3, gen=2)]
    chosen = place(shards, Need(), tkt, boot)
    assert chosen is not None and chosen.name == expected


@pytest.mark.parametrize(
    ("shard", "need"),
    [
        (_shard("s1", load=4, gen=2), Need()),
        (_shard("s1", up=False, gen=2), Need()),
        (_shard("s1", gen=2, tenants=("acme",)), Need(tenant="umbrella")),
        (_shard("s1", gen=2), GPU),
    ],
    ids=["full", "down", "tenant refused", "capability missing"],
)
def test_a_live_ticket_never_overrides_room_or_eligibility(shard: ShardView, need: Need) -> None:
    """A ticket skips scoring only: a full, down or ineligible shard is not chosen by it."""
    other = _shard("s0", caps=("gpu",))
    chosen = place([other, shard], need, ticket("s1", 2), "boot1")
    assert chosen is other


def test_ticket_text_round_trips_and_bad_text_is_refused() -> None:
    t = ticket("shard-1", 3, "a1b2c3")
    assert str(t) == "shard-1.3@a1b2c3"
    assert AffinityTicket.parse(str(t)) == t
    for bad in (
        "",
        "shard-1",
        "shard-1.x@b",
        "shard-1.3",
        ".3@b",
        "shard-1.3@",
        "shard-1.\u00b2@b",
        "shard-1." + "9" * 5000 + "@b",
    ):
        with pytest.raises(ValueError, match="affinity ticket"):
            AffinityTicket.parse(bad)


def test_unplaceable_names_what_is_missing_and_what_is_offered() -> None:
    """A need no shard of the tree could ever meet (up or down, full or not) is explained in one
    line; a need some shard meets, even a down or full one, is not unplaceable (it waits)."""
    shards = [_shard("s0", caps=("py",)), _shard("s1", up=False, caps=("gpu",), tenants=("acme",))]
    assert unplaceable(shards, Need(requires=frozenset({"gpu"}), tenant="acme")) is None
    assert unplaceable(shards, Need(requires=frozenset({"py"}))) is None
    why = unplaceable(shards, Need(requires=frozenset({"tpu"}), tenant="acme"))
    assert why == (
        "no shard offers capabilities tpu to tenant acme "
        "(s0: py, any tenant; s1: gpu, tenants acme)"
    )
    assert unplaceable([], GPU) is None  # no roster yet: nothing to judge by


def test_a_ticket_to_a_hosts_shard_carries_the_hosts_boot() -> None:
    """A host's agent started again counts its shards' generations from 1 again, under a new
    boot of its own: a ticket minted before names the old boot and falls back, whatever the
    tree's boot (issue 21, ADR 0006)."""
    remote = ShardView(
        name="host-a/shard-0", generation=1, up=True, capacity=4, load=2, boot="hostboot2"
    )
    local = _shard("s0", load=0)
    old = AffinityTicket(shard="host-a/shard-0", generation=1, boot="hostboot1")
    assert place([local, remote], Need(), old, "treeboot") is local
    live = AffinityTicket(shard="host-a/shard-0", generation=1, boot="hostboot2")
    assert place([local, remote], Need(), live, "treeboot") is remote
    assert AffinityTicket.parse(str(live)) == live
