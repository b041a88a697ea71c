"""Tests for restart intensity and backoff (`supervisor.intensity`) over a fake clock, and for the
child state machine's transition table (`supervisor.spec.ALLOWED`)."""

from __future__ import annotations

import time

import pytest

from orchestra_sup.supervisor.intensity import Backoff, RestartIntensity
from orchestra_sup.supervisor.spec import ALLOWED, ChildState


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- RestartIntensity ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_restarts", [1, 3, 5])
def test_max_restarts_allowed_then_one_more_refused(max_restarts: int) -> None:
    """max_restarts restarts within the window are allowed; the next one returns False."""
    clock = FakeClock()
    intensity = RestartIntensity(max_restarts, 30.0, clock=clock)
    for _ in range(max_restarts):
        assert intensity.record() is True
        clock.advance(1.0)
    assert intensity.record() is False


def test_zero_max_restarts_refuses_the_first() -> None:
    """With max_restarts = 0 the very first restart already escalates."""
    intensity = RestartIntensity(0, 30.0, clock=FakeClock())
    assert intensity.record() is False


def test_restarts_at_the_same_instant_count() -> None:
    """Restarts recorded at the same clock reading all count towards the limit."""
    intensity = RestartIntensity(2, 5.0, clock=FakeClock())
    assert [intensity.record() for _ in range(3)] == [True, True, False]


def test_old_restarts_slide_out_of_the_window() -> None:
    """A restart older than max_seconds no longer counts."""
    clock = FakeClock()
    intensity = RestartIntensity(2, 10.0, clock=clock)
    assert intensity.record() is True  # t=0
    clock.advance(6.0)
    assert intensity.record() is True  # t=6
    clock.advance(4.5)
    assert intensity.record() is True  # t=10.5: t=0 slid out, the window holds 6 and 10.5
    clock.advance(1.0)
    assert intensity.record() is False  # t=11.5: 6, 10.5 and 11.5 are all within 10 s


def test_steady_trickle_never_escalates() -> None:
    """Restarts spaced so that at most max_restarts fall in any window are always allowed."""
    clock = FakeClock()
    intensity = RestartIntensity(2, 10.0, clock=clock)
    for _ in range(50):
        assert intensity.record() is True
        clock.advance(5.5)


def test_window_edge_is_inclusive() -> None:
    """A restart exactly max_seconds old still counts (OTP: within the period is =< Period)."""
    clock = FakeClock()
    intensity = RestartIntensity(1, 10.0, clock=clock)
    assert intensity.record() is True
    clock.advance(10.0)
    assert intensity.record() is False
    clock.advance(10.001)
    assert intensity.record() is True


def test_burst_after_a_quiet_period_is_judged_alone() -> None:
    """After a long quiet spell the window is empty again and a new burst gets the full budget."""
    clock = FakeClock()
    intensity = RestartIntensity(3, 5.0, clock=clock)
    assert [intensity.record() for _ in range(4)] == [True, True, True, False]
    clock.advance(60.0)
    assert [intensity.record() for _ in range(4)] == [True, True, True, False]


def test_default_clock_is_monotonic() -> None:
    """Without an injected clock the window runs on time.monotonic."""
    assert RestartIntensity(1, 1.0).clock is time.monotonic


# --- Backoff -------------------------------------------------------------------------------------


def test_backoff_sequence() -> None:
    """First restart has no delay, then initial_s, doubling, capped at max_s."""
    backoff = Backoff(initial_s=0.1, max_s=1.0, reset_after_s=60.0)
    delays = [backoff.next_delay(uptime_s=0.5) for _ in range(8)]
    assert delays == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_backoff_cap_smaller_than_a_doubling() -> None:
    """The cap applies even when it is not a power-of-two multiple of initial_s."""
    backoff = Backoff(initial_s=1.0, max_s=3.0, reset_after_s=60.0)
    assert [backoff.next_delay(0.0) for _ in range(5)] == [0.0, 1.0, 2.0, 3.0, 3.0]


def test_backoff_resets_after_long_enough_uptime() -> None:
    """A run of at least reset_after_s seconds resets the backoff: no delay, then initial_s."""
    backoff = Backoff(initial_s=0.5, max_s=8.0, reset_after_s=10.0)
    assert [backoff.next_delay(1.0) for _ in range(4)] == [0.0, 0.5, 1.0, 2.0]
    assert backoff.next_delay(10.0) == 0.0
    assert backoff.next_delay(1.0) == 0.5
    assert backoff.next_delay(25.0) == 0.0


def test_backoff_not_reset_just_below_threshold() -> None:
    """An uptime just short of reset_after_s keeps doubling."""
    backoff = Backoff(initial_s=0.5, max_s=8.0, reset_after_s=10.0)
    assert [backoff.next_delay(9.999) for _ in range(4)] == [0.0, 0.5, 1.0, 2.0]


def test_backoff_with_zero_initial_never_waits() -> None:
    """initial_s = 0 means restarts are never delayed."""
    backoff = Backoff(initial_s=0.0, max_s=5.0, reset_after_s=10.0)
    assert [backoff.next_delay(0.0) for _ in range(5)] == [0.0] * 5


# --- child state machine -------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(ChildState), ids=str)
def test_every_child_state_has_transitions(state: ChildState) -> None:
    """Every ChildState has an ALLOWED entry, and only leads to ChildStates."""
    assert state in ALLOWED
    assert ALLOWED[state], f"{state} is a dead end"
    assert all(isinstance(target, ChildState) for target in ALLOWED[state])


def test_allowed_has_no_extra_keys() -> None:
    """ALLOWED's keys are exactly the ChildState members."""
    assert set(ALLOWED) == set(ChildState)


def test_no_self_transitions() -> None:
    """No state transitions to itself."""
    for state, targets in ALLOWED.items():
        assert state not in targets


def test_every_state_is_reachable_from_stopped() -> None:
    """Every state can be reached from stopped (the initial state), and stopped from every state."""
    reach = {ChildState.STOPPED}
    todo = [ChildState.STOPPED]
    while todo:
        for target in ALLOWED[todo.pop()]:
            if target not in reach:
                reach.add(target)
                todo.append(target)
    assert reach == set(ChildState)
    for state in ChildState:
        seen, todo = {state}, [state]
        while todo:
            for target in ALLOWED[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        assert ChildState.STOPPED in seen, state


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (ChildState.STARTING, ChildState.RUNNING),
        (ChildState.RUNNING, ChildState.EXITED),
        (ChildState.RUNNING, ChildState.STOPPING),
        (ChildState.STOPPING, ChildState.EXITED),
        (ChildState.EXITED, ChildState.BACKOFF),
        (ChildState.BACKOFF, ChildState.STARTING),
        (ChildState.EXITED, ChildState.STOPPED),
        (ChildState.RUNNING, ChildState.STARTING),  # a surge
    ],
)
def test_documented_transitions_are_allowed(source: ChildState, target: ChildState) -> None:
    """The lifecycle steps the spec documents are in the table."""
    assert target in ALLOWED[source]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (ChildState.STOPPED, ChildState.RUNNING),
        (ChildState.STOPPING, ChildState.STARTING),
        (ChildState.STOPPING, ChildState.RUNNING),
        (ChildState.BACKOFF, ChildState.RUNNING),
    ],
)
def test_shortcuts_are_refused(source: ChildState, target: ChildState) -> None:
    """A child cannot skip its handshake (running only via starting) or leave stopping alive."""
    assert target not in ALLOWED[source]
