"""A host's membership: its registration in etcd under a lease it keeps alive, and the moment
by which it must have stopped its own lanes when it cannot (ARCHITECTURE.md §12, invariant 15;
ADR 0021).

etcd ends a lease `ttl_s` seconds after the last keep-alive its leader took, and deletes the
keys attached to it; the root watches them go and places the host's lanes elsewhere. The host
cannot know when the leader took its last keep-alive, only that it was after the host sent it.
So it counts from the send time of the last keep-alive etcd answered: etcd's side of the lease
ends no earlier than `sent + ttl_s`. The host calls `on_lost` (which stops its lanes) at
`sent + ttl_s - margin_s`, at the latest, and at once when etcd answers that the lease is gone.
`margin_s` (default: one keep-alive interval) is the time left for the stop itself, so no lane
runs in two places for longer than that.

After a loss the host revokes the lost lease where etcd answers, and joins again: a new lease,
the registration put again under it, in a transaction that expects the lease the key had when
the host read it, so an older registration request that etcd applies late (a member frozen with
it queued) cannot move the key back to a lease no one renews. A key under a lease this process
never took is not taken: another agent of the same name holds it, or this host's last run,
until its lease ends. The new lease counts from a keep-alive sent once the key is under it.
Each keep-alive gives each endpoint at most one keep-alive interval, so a
frozen member costs one interval, not the client's whole timeout.

Times are on CLOCK_BOOTTIME (seconds, float), which goes on while the machine is suspended:
etcd's clock does, and a host that slept through its lease must not think it still holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from orchestra_sup.cluster.etcd import Etcd, EtcdAuthRefused, EtcdRefused, EtcdUnavailable
from orchestra_sup.cluster.settings import KEEPALIVE_S, TTL_S
from orchestra_sup.system.linux import boottime

log = logging.getLogger(__name__)

WAIT_LOG_S = 10.0
"""At most one "registered under another lease" line this often."""


class HostLease:
    """Keeps `key` = `value` registered in `etcd` under a lease of `ttl_s` seconds, renewed
    every `every_s` seconds (module docstring). `on_lost()` is called, on the loop, each time
    the lease is lost or can no longer be known to be held; `on_joined(lease_id)` each time a
    new lease holds the registration; `on_renewed(stop_by)` at the join and at each renewal,
    with the new `stop_by`; `on_refused(reason)` when etcd refuses who asks at the first join
    (`EtcdAuthRefused`: a user or a role that cannot be this host's, which only its operator
    can mend; after a join, it is tried again). `margin_s` defaults to `every_s`.

    Raises `ValueError` when `ttl_s - margin_s` leaves no time for a keep-alive to be answered
    (it must exceed `every_s`)."""

    def __init__(
        self,
        etcd: Etcd,
        key: bytes,
        value: bytes,
        *,
        on_lost: Callable[[], None],
        on_joined: Callable[[int], None] = lambda lease: None,
        on_renewed: Callable[[float], None] = lambda stop_by: None,
        on_refused: Callable[[str], None] = lambda reason: None,
        ttl_s: int = TTL_S,
        every_s: float = KEEPALIVE_S,
        margin_s: float | None = None,
        clock: Callable[[], float] = boottime,
    ) -> None:
        self.margin_s = every_s if margin_s is None else margin_s
        if ttl_s - self.margin_s <= every_s:
            raise ValueError(
                f"a lease of {ttl_s} s less a margin of {self.margin_s:g} s leaves no room for a "
                f"keep-alive every {every_s:g} s"
            )
        self.etcd = etcd
        self.key = key
        self.value = value
        self.on_lost = on_lost
        self.on_joined = on_joined
        self.on_renewed = on_renewed
        self.on_refused = on_refused
        self.ttl_s = ttl_s
        self.every_s = every_s
        self.clock = clock
        self.lease: int | None = None
        """The lease held now, or None (not joined yet, or lost)."""
        self.renewed_at: float | None = None
        """When the last keep-alive etcd answered was sent (`clock`)."""
        self._mine: set[int] = set()
        """Every lease this process took: only a key under one of them is its own to move."""
        self._waited_logged = -WAIT_LOG_S
        self._join_logged = -WAIT_LOG_S
        self._joined_once = False

    @property
    def stop_by(self) -> float | None:
        """When the host must have stopped its lanes unless a keep-alive is answered first
        (`clock` seconds), or None while no lease is held."""
        if self.renewed_at is None:
            return None
        return self.renewed_at + self.ttl_s - self.margin_s

    async def run(self) -> None:
        """Join, keep the lease alive, and after a loss join again; until cancelled, when the
        lease is revoked (etcd deletes the registration at once, not `ttl_s` later)."""
        try:
            while True:
                await self._join()
                await self._keep()
                lost, self.lease, self.renewed_at = self.lease, None, None
                self.on_lost()
                with contextlib.suppress(EtcdUnavailable, EtcdRefused):  # its key goes at once
                    await self.etcd.revoke(lost)
        finally:
            lease, self.lease = self.lease, None
            if lease is not None:
                with contextlib.suppress(EtcdUnavailable, EtcdRefused):
                    await asyncio.shield(self.etcd.revoke(lease))

    async def _join(self) -> None:
        """A new lease, and the registration under it (module docstring); tried every
        `every_s` until it holds."""
        while True:
            lease = None
            joined = False
            try:
                now = await self.etcd.get(self.key)
                held = now.lease if now is not None else 0
                if held and held not in self._mine:
                    self._held_elsewhere(held)
                else:
                    lease = await self.etcd.grant(self.ttl_s)
                    self._mine.add(lease)
                    joined = await self.etcd.put_if_lease(
                        self.key, self.value, lease=lease, expected_lease=held
                    )
                    # Counted from a keep-alive sent now, not from before the grant: a join
                    # slow enough (etcd regaining its quorum) would otherwise be past its
                    # `stop_by` before its first keep-alive.
                    sent = self.clock()
                    joined = joined and await self.etcd.keepalive(lease, timeout_s=self.every_s) > 0
            except (EtcdUnavailable, EtcdRefused) as exc:
                if isinstance(exc, EtcdAuthRefused) and not self._joined_once:
                    self.on_refused(str(exc))
                now = self.clock()
                if now - self._join_logged >= WAIT_LOG_S:  # at most a line this often
                    self._join_logged = now
                    log.warning("cannot join the cluster yet: %s", exc)
                joined = False
            if not joined:
                if lease is not None:  # not ours to keep: let it end now, not a TTL later
                    with contextlib.suppress(EtcdUnavailable, EtcdRefused):
                        await self.etcd.revoke(lease)
                await asyncio.sleep(self.every_s)
                continue
            assert lease is not None
            self.lease, self.renewed_at = lease, sent
            log.info("joined under lease %x (%d s)", lease, self.ttl_s)
            self._joined_once = True
            self.on_joined(lease)
            self._renewed()
            return

    def _held_elsewhere(self, held: int) -> None:
        """The key is registered under a lease this process never took: another agent of the
        same name, or this host's previous run, whose lease ends within its TTL. Not taken:
        two agents of one name would each believe their shards are the host's."""
        now = self.clock()
        if now - self._waited_logged >= WAIT_LOG_S:
            self._waited_logged = now
            log.warning(
                "%s is registered under lease %x, which is not this agent's: another agent of "
                "this name, or this host's last run until its lease ends; waiting",
                self.key.decode(errors="replace"),
                held,
            )

    async def _keep(self) -> None:
        """Renew the lease every `every_s` until it is lost: etcd says it is gone, or
        `stop_by` comes with no answered keep-alive."""
        assert self.lease is not None
        while True:
            await asyncio.sleep(self._left(self.every_s))
            if self._past():
                log.error("lease %x not renewed in time: its lanes stop", self.lease)
                return
            sent = self.clock()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancellation that
                # comes as the keep-alive is answered, and the agent's lease then never ends
                async with asyncio.timeout(self._left()):
                    ttl = await self.etcd.keepalive(self.lease, timeout_s=self.every_s)
            except (EtcdUnavailable, EtcdRefused, TimeoutError) as exc:
                log.warning("lease %x keep-alive failed: %s", self.lease, exc or "timed out")
                continue
            if ttl <= 0:
                log.error("lease %x is gone at etcd: its lanes stop", self.lease)
                return
            self.renewed_at = sent
            self._renewed()

    def _renewed(self) -> None:
        assert self.stop_by is not None
        self.on_renewed(self.stop_by)

    def _left(self, cap: float | None = None) -> float:
        """Seconds until `stop_by` (>= 0), at most `cap`."""
        assert self.stop_by is not None
        left = max(0.0, self.stop_by - self.clock())
        return left if cap is None else min(cap, left)

    def _past(self) -> bool:
        assert self.stop_by is not None
        return self.clock() >= self.stop_by
