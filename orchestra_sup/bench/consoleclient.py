"""The consoles of `bench console`, in a process of their own: `python -m
orchestra_sup.bench.consoleclient`, started by `bench.console`, never by hand.

Its stdin's first line is a JSON object: `url` (the API's, `.../v1/`), `token` (a bearer
token), `consoles` (how many) and `since` (the event log's seq to stream after). Each console is
what the console page does, over a connection pool of its own (`aiohttp.ClientSession`, of
`CONNECTIONS`, as each browser has): GET `/v1/status`, `/v1/tree`, `/v1/plans` and `/v1/lanes`
once, then hold `/v1/events` open from `since` on (`Last-Event-ID`), reading every event; on
every `plan.*` or `task.*` event it GETs that plan again (`/v1/plans/{id}`), at most one such
GET pending per plan: events read before it is sent are covered by it, and those read while it
is in flight make one more once it is answered. A stream that ends is opened again after the
last seq read (`RETRY_S` later), as an `EventSource` does. The stream asks `?status=2` first;
answered 400 (a server that does not take it) it asks without, from then on.

Once every console has its stream open, one line `{"ready": true}` goes to stdout, and the
window starts. The next line on stdin (or its end) stops the consoles, and one line goes to
stdout, the `Report` as JSON: what came within the window (events, each one's delivery lag:
its `at` to when it was read, both Unix time) and over the whole life (requests, seqs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
import msgspec

OPENING = ("status", "tree", "plans", "lanes")
"""What a console GETs once, before it streams (`/v1/<name>`)."""
STATUS_PARAM = "status=2"
"""The query a stream asks first; a server that answers it 400 is asked without."""
GET_TIMEOUT_S = 30.0
"""Seconds a GET may take before it counts as failed."""
CONNECTIONS = 6
"""Connections a console opens to the server at most, as a browser does to one host."""
REFETCHED = ("plan.", "task.")
"""Event kinds (prefixes) on which a console GETs the event's plan again."""
RETRY_S = 0.5
"""Seconds a console waits before it opens a stream again that ended or was refused."""


class Report(msgspec.Struct, kw_only=True):
    """What the consoles did. Within the window (from `ready` to the stop): `window_s`
    (seconds), `events` (log events read, every console's), `lags_ms` (each one's delivery
    lag, ms), `requests_in_window`. Over the whole run: `requests` ("<what> <HTTP status>" ->
    count; what: `status`, `tree`, `plans`, `lanes`, `plan`, `events`; status `error` for no
    answer), `first_seq` and `last_seq` per console (0 before any), `gaps` and `repeats` (an
    event whose seq was not the one after the last read; a repeat is one at or before it),
    `reconnects` (streams opened again), `other` (SSE messages that were not log events),
    `status_param` (whether the server took `?status=2`)."""

    window_s: float
    events: int
    lags_ms: list[float]
    requests_in_window: int
    requests: dict[str, int]
    first_seq: list[int]
    last_seq: list[int]
    gaps: int
    repeats: int
    reconnects: int
    other: int
    status_param: bool


class Window:
    """What every console shares: whether the window is open, and what it counts."""

    def __init__(self) -> None:
        self.open = False
        self.events = 0
        self.requests = 0
        self.lags_ms: list[float] = []
        self.status_param = True


class Console:
    """One console page over `session`, streaming after seq `since`."""

    def __init__(self, session: aiohttp.ClientSession, url: str, since: int, window: Window):
        self.session = session
        self.url = url
        self.window = window
        self.first = 0
        self.last = since
        self.gaps = self.repeats = self.reconnects = self.other = 0
        self.requests: Counter[str] = Counter()
        self.again: dict[str, bool] = {}  # plan -> another GET is due once the one in flight ends
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, ready: asyncio.Event) -> None:
        """The opening GETs, then the stream, for as long as it is not cancelled."""
        for name in OPENING:
            await self.get(name, name)
        await self.stream(ready)

    async def get(self, what: str, path: str) -> None:
        """GET `/v1/<path>` and read its body; counted by `what` and the answer's status."""
        try:
            async with self.session.get(self.url + path) as answer:
                await answer.read()
                status = str(answer.status)
        except (aiohttp.ClientError, TimeoutError):
            status = "error"
        self.requests[f"{what} {status}"] += 1
        if self.window.open:
            self.window.requests += 1

    async def stream(self, ready: asyncio.Event) -> None:
        """Hold `/v1/events` open after the last seq read; open it again when it ends."""
        no_timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        while True:
            query = f"?{STATUS_PARAM}" if self.window.status_param else ""
            headers = {"Last-Event-ID": str(self.last)}
            try:
                async with self.session.get(
                    f"{self.url}events{query}", headers=headers, timeout=no_timeout
                ) as answer:
                    self.requests[f"events {answer.status}"] += 1
                    if answer.status == 400 and query:
                        self.window.status_param = False
                        continue
                    if answer.status == 200:
                        ready.set()
                        await self.read(answer.content)
            except (aiohttp.ClientError, TimeoutError):
                self.requests["events error"] += 1
            self.reconnects += 1
            await asyncio.sleep(RETRY_S)

    async def read(self, content: aiohttp.StreamReader) -> None:
        """Read SSE messages until the stream ends: `data:` lines, dispatched at a blank one."""
        data: list[str] = []
        async for raw in content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                self.message(json.loads("\n".join(data)), time.time())
                data = []

    def message(self, event: Any, read_at: float) -> None:
        """One SSE message read at `read_at` (Unix time): a log event is checked for its seq,
        counted, and may make a plan's GET."""
        if not (isinstance(event, dict) and "seq" in event and "at" in event):
            self.other += 1
            return
        seq = int(event["seq"])
        if seq != self.last + 1:
            if seq <= self.last:
                self.repeats += 1
            else:
                self.gaps += 1
        self.first = self.first or seq
        self.last = max(self.last, seq)
        if self.window.open:
            self.window.events += 1
            self.window.lags_ms.append((read_at - float(event["at"])) * 1000.0)
        plan = event.get("plan", "")
        if plan and str(event.get("kind", "")).startswith(REFETCHED):
            self.refetch(plan)

    def refetch(self, plan: str) -> None:
        """GET plan `plan` now, or once more after the GET of it in flight."""
        if plan in self.again:
            self.again[plan] = True
            return
        self.again[plan] = False
        task = asyncio.get_running_loop().create_task(self._refetch(plan))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _refetch(self, plan: str) -> None:
        try:
            while True:
                self.again[plan] = False
                await self.get("plan", f"plans/{plan}")
                if not self.again[plan]:
                    return
        finally:
            del self.again[plan]


async def run(config: dict[str, Any]) -> Report:
    """The consoles `config` (the module docstring) asks for, until stdin says stop."""
    window = Window()
    timeout = aiohttp.ClientTimeout(total=GET_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {config['token']}"}
    sessions = [
        aiohttp.ClientSession(
            headers=headers,
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit_per_host=CONNECTIONS),
        )
        for _ in range(config["consoles"])
    ]
    consoles = [Console(s, config["url"], int(config["since"]), window) for s in sessions]
    readies = [asyncio.Event() for _ in consoles]
    running = [asyncio.create_task(c.run(r)) for c, r in zip(consoles, readies, strict=True)]
    try:
        await asyncio.gather(*(r.wait() for r in readies))
        window.open = True
        opened = time.monotonic()
        print(json.dumps({"ready": True}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        window.open = False
        window_s = time.monotonic() - opened
    finally:
        for task in running + [t for c in consoles for t in c.tasks]:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for session in sessions:
            await session.close()
    requests: Counter[str] = sum((c.requests for c in consoles), Counter())
    return Report(
        window_s=round(window_s, 3),
        events=window.events,
        lags_ms=[round(lag, 3) for lag in window.lags_ms],
        requests_in_window=window.requests,
        requests=dict(sorted(requests.items())),
        first_seq=[c.first for c in consoles],
        last_seq=[c.last for c in consoles],
        gaps=sum(c.gaps for c in consoles),
        repeats=sum(c.repeats for c in consoles),
        reconnects=sum(c.reconnects for c in consoles),
        other=sum(c.other for c in consoles),
        status_param=window.status_param,
    )


def main() -> None:
    """Read the config line, run the consoles, print the report line."""
    config = json.loads(sys.stdin.readline())
    report = asyncio.run(run(config))
    sys.stdout.write(msgspec.json.encode(report).decode() + "\n")


if __name__ == "__main__":
    main()
