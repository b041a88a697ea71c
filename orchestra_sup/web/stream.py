"""`GET /v1/events`: the event log as server-sent events, for as long as the client reads.

Each event is `id: <seq>`, `event: <kind>`, `data: <ctl events --json's object>`; the stream
resumes after `Last-Event-ID` (or `?since=`), and without either `?tail=N` starts at the
newest N events rather than the oldest kept; `?plan=` filters. With `?status=S` (seconds,
within `STATUS_EVERY_S`) it also carries `event: status` with `/v1/status`'s object as `data:`
and no `id:` (so resuming is the same), once when the stream opens and every S seconds on:
what a console needs, so it does not poll.

A caught-up stream asks for the log's next page every `EVENTS_POLL_S`. Many consoles ask the
same things at about the same time (the status; the page after the seq they all reached), so
the asking is shared (`Feed`): one ask of the tree and one encoding for every stream that
wants the same thing within `FRESH_S`, not one each. A console's cost on the loop is then its
writes, not the tree's work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes
from orchestra_sup.web.replies import SECURITY_HEADERS, Refused, encode, seconds, seq

EVENTS_POLL_S = 0.5
"""Seconds an event stream that has sent every committed event waits before asking again."""
EVENTS_PAGE = 200
"""Events an event stream asks for and writes at once, then yields the loop."""
TAIL_MAX = 10_000
"""The most events `?tail=` starts back from the newest."""
STATUS_EVERY_S = (1.0, 60.0)
"""The least and most seconds `?status=` may ask between two status messages."""
KEEPALIVE_S = 15.0
"""Seconds of silence after which an event stream sends a comment line (proxies keep it)."""
FRESH_S = 0.25
"""Seconds an answer the `Feed` got stays the answer for every stream asking the same."""

Ask = Callable[[f.Body, type[Any]], Awaitable[Any]]
"""A ctl frame asked of the tree, answered with the given type or `Refused`."""


class Feed:
    """What the event streams ask of the tree, asked once for all that want the same thing
    within `FRESH_S` (an answer being asked is awaited by every stream that wants it)."""

    def __init__(self) -> None:
        self._held: dict[tuple[Any, ...], tuple[float, asyncio.Future[Any]]] = {}

    async def once(self, key: tuple[Any, ...], make: Callable[[], Awaitable[Any]]) -> Any:
        now = asyncio.get_running_loop().time()
        held = self._held.get(key)
        if held is None or (held[1].done() and now - held[0] > FRESH_S):
            self._held = {
                k: (at, got)
                for k, (at, got) in self._held.items()
                if not got.done() or now - at <= FRESH_S
            }
            held = (now, asyncio.ensure_future(make()))
            self._held[key] = held
        return await asyncio.shield(held[1])  # one stream going away cancels nobody's ask

    async def status(self, ask: Ask) -> bytes:
        """The status message, encoded."""

        async def make() -> bytes:
            reply = await ask(f.CtlStatus(), f.StatusReply)
            return b"event: status\ndata: %s\n\n" % encode(shapes.status_json(reply))

        return await self.once(("status",), make)  # type: ignore[no-any-return]

    async def page(self, ask: Ask, since: int, plan: str) -> tuple[f.EventsPage, bytes]:
        """The log's page after `since` (of `plan`, "": all), and its events encoded."""

        async def make() -> tuple[f.EventsPage, bytes]:
            page = await ask(f.CtlEvents(since=since, plan=plan, limit=EVENTS_PAGE), f.EventsPage)
            chunk = b"".join(
                b"id: %d\nevent: %s\ndata: %s\n\n" % (e.seq, e.kind.encode(), encode(e))
                for e in page.events
            )
            return page, chunk

        return await self.once(("page", since, plan), make)  # type: ignore[no-any-return]


async def serve(request: web.Request, ask: Ask, feed: Feed, write_s: float) -> web.StreamResponse:
    """The stream `request` asks for, through `feed`; a write the client does not take within
    `write_s` seconds ends it. Raises `Refused` (400) for a bad query, before anything is
    sent."""
    resume = request.headers.get("Last-Event-ID") or request.query.get("since")
    since = seq(resume or "0")
    plan = request.query.get("plan", "")
    every = (
        seconds(request.query["status"], *STATUS_EVERY_S, "status")
        if "status" in request.query
        else None
    )
    if "tail" in request.query and resume is None:  # a new page: the newest, not 30 days
        newest = await ask(f.CtlEvents(since=0, limit=1), f.EventsPage)
        since = max(0, newest.last - min(seq(request.query["tail"]), TAIL_MAX))
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", **SECURITY_HEADERS})
    await stream.prepare(request)
    clock = asyncio.get_running_loop().time
    quiet, status_at = 0.0, clock()
    while True:
        chunk = b""
        try:
            if every is not None and clock() >= status_at:
                chunk = await feed.status(ask)
                status_at = clock() + every
            page, events = await feed.page(ask, since, plan)
        except Refused:  # the headers are sent: the stream ends, the client resumes
            return stream
        chunk += events
        if chunk and not await _send(stream, chunk, write_s):
            return stream
        await asyncio.sleep(0)  # a replay of a long log lets the loop serve between pages
        since = max(since, page.next)
        if chunk:
            quiet = 0.0
        if page.next >= page.last:
            await asyncio.sleep(EVENTS_POLL_S)
            quiet += EVENTS_POLL_S
            if quiet >= KEEPALIVE_S:
                if not await _send(stream, b": keep-alive\n\n", write_s):
                    return stream
                quiet = 0.0


async def _send(stream: web.StreamResponse, chunk: bytes, write_s: float) -> bool:
    """Write `chunk`; False when the client went (an EventSource's normal end) or did not
    take it within `write_s` (the stream is then let go)."""
    try:
        async with asyncio.timeout(write_s):
            await stream.write(chunk)
    except (ConnectionResetError, TimeoutError):
        return False
    return True
