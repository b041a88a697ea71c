"""The hosts of a tree as the root sees them: the registrations under a prefix in etcd, read
once and then watched from the revision after that read, so no join or leave is missed or seen
twice (ADR 0021).

A host's registration lives under its lease (`cluster.lease`). When the lease ends, by expiry
or revocation, etcd deletes the key and the watch delivers a DELETE: the host has left, and its
lanes are the root's to place again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from orchestra_sup.cluster.etcd import Etcd, EtcdRefused, EtcdUnavailable, KeyValue

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""Seconds between two reads of the hosts while etcd does not answer."""


class Membership:
    """The registrations under `prefix` (`hosts`: name, the key less the prefix, -> its
    `KeyValue`; a key that names no host is ignored, with a warning). `on_join(name, kv)` is
    called when a host registers, `on_leave(name)` when its registration goes; a registration
    put again under a new lease is a leave, then a join. `retry_s`: seconds between two reads
    while etcd does not answer (default `RETRY_S`)."""

    def __init__(
        self,
        etcd: Etcd,
        prefix: bytes,
        *,
        on_join: Callable[[str, KeyValue], None] = lambda name, kv: None,
        on_leave: Callable[[str], None] = lambda name: None,
        retry_s: float = RETRY_S,
    ) -> None:
        self.retry_s = retry_s
        self.etcd = etcd
        self.prefix = prefix
        self.on_join = on_join
        self.on_leave = on_leave
        self.hosts: dict[str, KeyValue] = {}
        self.answering: bool | None = None
        """Whether etcd, with a quorum, answered the last read or kept the watch (every request
        requires a leader: `etcd.Etcd`); None before the first answer or failure."""

    async def run(self) -> None:
        """Read the registrations, then follow their changes, until cancelled. A watch etcd
        cannot go on with (its revision compacted away, a response too long) is replaced by a
        fresh read at once; a cluster that does not answer, every `retry_s` seconds. What
        changed meanwhile is told as joins and leaves, once each."""
        while True:
            try:
                await self._follow()
            except EtcdRefused as exc:
                log.warning("the hosts are read afresh: %s", exc)
            except EtcdUnavailable as exc:
                self.answering = False
                log.warning("the hosts cannot be read now: %s", exc)
                await asyncio.sleep(self.retry_s)

    async def _follow(self) -> None:
        revision, kvs = await self.etcd.get_prefix(self.prefix)
        self.answering = True
        seen = {name: kv for kv in kvs if (name := self._name(kv.key)) is not None}
        for name in [n for n in self.hosts if n not in seen]:
            self._leave(name)
        for name, kv in seen.items():
            self._join(name, kv)
        async for event in self.etcd.watch_prefix(self.prefix, revision + 1):
            name = self._name(event.kv.key)
            if name is None:
                continue
            if event.kind == "DELETE":
                self._leave(name)
            else:
                self._join(name, event.kv)

    def _join(self, name: str, kv: KeyValue) -> None:
        known = self.hosts.get(name)
        if known is not None and known.lease == kv.lease:
            self.hosts[name] = kv  # the same membership, its registration updated
            return
        if known is not None:
            # Registered again under a new lease: the host lost the old one and stopped its
            # lanes (`cluster.lease`), whether or not etcd has ended that lease yet.
            self._leave(name)
        self.hosts[name] = kv
        log.info("host %s joined (lease %x)", name, kv.lease)
        self.on_join(name, kv)

    def _leave(self, name: str) -> None:
        if self.hosts.pop(name, None) is not None:
            log.warning("host %s left: its lease ended", name)
            self.on_leave(name)

    def _name(self, key: bytes) -> str | None:
        """The host name `key` registers, or None for a key that is no host's: not UTF-8 (two
        such keys must not read as one name), or empty."""
        try:
            name = key[len(self.prefix) :].decode("utf-8")
        except UnicodeDecodeError:
            name = ""
        if not name:
            log.warning("%r under the hosts' prefix is no host's registration: ignored", key)
            return None
        return name
