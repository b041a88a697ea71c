"""Reading the tree's event log (`state.events`) from a client: every event after a sequence
number, once, and with `follow` as they come, across the tree's own restarts.

`ctl events` and the SDK's `Client.events` are this one loop. It asks the supervisor for a
page after the last `seq` it has (`CtlEvents`), yields what it gets, and asks again from the
page's `next`: since the log's sequence numbers are its own and never reused, resuming from
the last `seq` seen misses nothing and repeats nothing, whether the reader resumes in this loop
(a supervisor re-exec, a coordinator SIGKILL) or in a new process (`--since`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import (
    ConfigError,
    ErrorCode,
    ProtocolError,
    RemoteError,
    TreeUnreachable,
)
from orchestra_sup.protocol import frames as f

POLL_S = 0.25
"""Seconds a follower waits before asking again once it has every committed event."""
OUTAGE_S = 60.0
"""Seconds a follower keeps asking a tree that does not answer (a supervisor re-executing, a
tree restarted by systemd) before it gives up with `TreeUnreachable`."""


def read_events(
    connect: Callable[[], CtlClient],
    *,
    since: int = 0,
    plan: str = "",
    follow: bool = False,
    timeout_s: float = 10.0,
    outage_s: float = OUTAGE_S,
    poll_s: float = POLL_S,
    on_gap: Callable[[int, int], None] | None = None,
) -> Iterator[f.Event]:
    """The events after `since` (a seq; 0: from the oldest kept), oldest first, only plan
    `plan`'s when given; without `follow`, up to the newest committed when asked, else for
    ever. `connect()` makes a client (again after one fails); each exchange waits at most
    `timeout_s` seconds. `on_gap(first, last)` is told of events after `since` that went
    before they were read (`[retention] events_s` trimmed them: seqs `first`..`last`).

    Raises `ConfigError` for a `since` outside 0..`frames.MAX_SEQ` (nothing is sent);
    `TreeUnreachable` when the tree does not answer (following: for `outage_s` seconds in a
    row); `RemoteError` as the tree refuses (`peer_down`, the log not open, is waited out
    like silence when following);
    `ProtocolError` for an answer that is not a page."""
    if not 0 <= since <= f.MAX_SEQ:
        raise ConfigError(f"since={since}: give a sequence number from 0 to 2**63-1")
    client: CtlClient | None = None
    silent_since: float | None = None
    try:
        while True:
            try:
                if client is None:
                    client = connect()
                page = client.request(f.CtlEvents(since=since, plan=plan), timeout_s=timeout_s)
            except (TreeUnreachable, RemoteError) as exc:
                if isinstance(exc, RemoteError) and exc.code is not ErrorCode.PEER_DOWN:
                    raise
                if client is not None:
                    client.close()
                    client = None
                now = time.monotonic()
                silent_since = now if silent_since is None else silent_since
                if not follow or now - silent_since >= outage_s:
                    raise
                time.sleep(poll_s)
                continue
            silent_since = None
            if not isinstance(page, f.EventsPage):
                raise ProtocolError(
                    ErrorCode.UNEXPECTED, f"the tree answered {type(page).__name__}, not a page"
                )
            if since and page.first > since + 1 and on_gap is not None:
                on_gap(since + 1, page.first - 1)
            yield from page.events
            caught_up = page.next >= page.last
            since = max(since, page.next)
            if caught_up and not follow:
                return
            if caught_up:
                time.sleep(poll_s)
    finally:
        if client is not None:
            client.close()
