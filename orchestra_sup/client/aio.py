"""The Python SDK's asyncio client, `orchestra_sup.AsyncClient`: `Client`'s methods, awaited.

Each call runs the blocking `Client` in a worker thread (`asyncio.to_thread`), on a connection
of its own opened for it and closed after it, as one `ctl` command opens one. Threads rather
than `zmq.asyncio`, because:

- the requests, their checks and their errors are then `Client`'s own: one path to test and to
  keep in step with ctl, not a second implementation of `client.ctl.CtlClient`'s request;
- calls may run at once (`asyncio.gather` over several `wait`s) without a ZeroMQ socket shared
  between threads, which ZeroMQ does not allow, and without a reply dispatcher;
- the plan check of `submit` reads and parses a file: off the event loop too.

The price is a connection set up per call (a ZeroMQ context and socket); this SDK drives a
tree, it is not a data path. A call that is cancelled stops waiting at once; its thread ends
its one exchange (at most `timeout_s`, a `wait` poll at most `sdk.WAIT_POLL_S` seconds more)
and its answer is dropped: `wait` is a loop of single polls here, so cancelling it sends no
further poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from orchestra_sup.client.sdk import Client, ClientOptions, Plan, PlanWait

P = ParamSpec("P")
T = TypeVar("T")


class AsyncClient(ClientOptions):
    """An asyncio client of one tree: the arguments (`ClientOptions`), methods, answers and
    errors of `Client` (see `client.sdk`), each method awaited. `close` (or leaving `async
    with`) refuses further calls with `ValueError`; calls in flight finish.
    """

    async def close(self) -> None:
        """Refuse further calls; calling it again does nothing."""
        self.closed = True

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _run(
        self, method: Callable[Concatenate[Client, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`method` of a `Client` made for this one call, in a worker thread."""
        if self.closed:
            raise ValueError("the client is closed")

        def once() -> T:
            with Client(
                self.run_dir,
                connect=self.connect,
                keys=self.keys,
                timeout_s=self.timeout_s,
                call_timeout_s=self.call_timeout_s,
            ) as client:
                return method(client, *args, **kwargs)

        return await asyncio.to_thread(once)

    async def submit(self, plan: Plan) -> str:
        """As `Client.submit`: the plan's id."""
        return await self._run(Client.submit, plan)

    async def plan(self, plan_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """As `Client.plan`: the plan's report."""
        return await self._run(Client.plan, plan_id, wait_s=wait_s)

    async def plans(self) -> list[dict[str, Any]]:
        """As `Client.plans`: every plan, newest first."""
        return await self._run(Client.plans)

    async def wait(self, plan_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """As `Client.wait`: the final report; `CallTimeout` past `timeout_s` seconds."""
        polls = PlanWait(plan_id, timeout_s)
        while True:
            report = await self.plan(plan_id, wait_s=polls.next_poll_s())
            if report["done"]:
                return report

    async def message(self, plan_id: str, text: str) -> None:
        """As `Client.message`."""
        await self._run(Client.message, plan_id, text)

    async def pending(self) -> list[dict[str, Any]]:
        """As `Client.pending`: every task that waits for a human."""
        return await self._run(Client.pending)

    async def approve(
        self,
        lane: str,
        *,
        text: str = "",
        grant: str | Mapping[str, float] | None = None,
        retries: int = 0,
    ) -> dict[str, Any]:
        """As `Client.approve`: what was recorded."""
        return await self._run(Client.approve, lane, text=text, grant=grant, retries=retries)

    async def reject(self, lane: str, text: str) -> dict[str, Any]:
        """As `Client.reject`."""
        return await self._run(Client.reject, lane, text)

    async def redirect(self, lane: str, text: str) -> dict[str, Any]:
        """As `Client.redirect`."""
        return await self._run(Client.redirect, lane, text)

    async def accept_partial(self, lane: str) -> dict[str, Any]:
        """As `Client.accept_partial`."""
        return await self._run(Client.accept_partial, lane)

    async def call(self, tool: str, /, **params: object) -> Any:
        """As `Client.call`: the tool's value."""
        return await self._run(Client.call, tool, **params)

    async def cancel(self, lane: str) -> None:
        """As `Client.cancel`."""
        await self._run(Client.cancel, lane)
