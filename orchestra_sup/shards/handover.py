"""A shard's lanes handed over between generations during a rollover (ARCHITECTURE.md §9,
ADR 0009).

Generation g+1 of a shard starts beside g (the surge) and opens the same LMDB environment. g is
sent `Drain`: it admits nothing more, and each lane either finishes on g (a shell lane whose
command runs to its end, any lane that ends by itself: "finished"), or is parked at its next quiet
point and handed over (`LaneResume` with a `LaneSnapshot`, to its own name, which the roster now
resolves to g+1: "moved"), or, still not quiet after the drain timeout, is stopped (its command's
group gets SIGTERM, then SIGKILL after `DRAIN_KILL_S`, at most `lane_grace_s`) and handed over to
re-run its step with a partial-work warning ("partial"). Quiet points: a lane still waiting for
its sandbox; a program lane suspended in `recv`, `checkpoint` or `ask_human` (`shards.program`).
A shell lane whose command runs is never quiet: it finishes on g, or is stopped at the timeout.
A hand-over g+1 refuses ends the lane `interrupted` on g, so the coordinator re-runs its task
("lost"), never silently. `Drained` lists every lane with how it went and how long it took,
once no lane is left and the outbox has been sent (what is not acknowledged within
`DELIVER_ON_STOP_S` stays in the durable outbox).

Requests for a lane in motion are neither lost nor applied twice (the idempotency keys travel in
the snapshot). On g, a message or cancel for a lane being handed over is held and forwarded to
g+1 once it has the lane; one for a lane already handed over is forwarded at once (the reply is
g+1's). The coordinator addresses the roster's generation, g+1, before the lanes get there: until
g+1 has *settled* (the roster shows it with no draining predecessor), a request for a lane it
does not have is held (at most `HELD_MAX`, then `busy`) and served when the lane arrives; once
settled, what is still held is answered `not_found`.

Settling is also when g+1 closes as lost the transcripts of lanes no generation runs any more and
adopts the rows its predecessor left in the outbox: never before, since the predecessor's live
lanes are unfinished and its outbox is still its own. A shard that simply (re)starts settles on
its first roster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec

from orchestra_sup.errors import CallTimeout, ErrorCode, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.runtime.node import Node
from orchestra_sup.shards.lane import Lane, LaneState, Request
from orchestra_sup.shards.outbox import DELIVER_ON_STOP_S, Outbox
from orchestra_sup.shards.program import MAILBOX_SIZE
from orchestra_sup.shards.transcript import Transcript

log = logging.getLogger(__name__)

HELD_MAX = MAILBOX_SIZE
"""Requests held for lanes on their way here (or for one lane being handed over) at most."""
HANDOVER_S = 2.0
"""How long a drain keeps offering a parked lane to the next generation (`LaneResume` is
idempotent by lane id, so an unanswered offer is made again)."""
REOFFER_S = 0.05
"""Pause before offering a lane again after an offer went unanswered."""
ANSWER_MARGIN_S = 0.05
"""How long before its request's deadline a drain has its `Drained` ready, to get it there."""
DRAIN_KILL_S = 1.0
"""Seconds a command stopped at the drain timeout has between SIGTERM and SIGKILL (at most
`lane_grace_s`): the supervisor waits for `Drained` only a few seconds past the timeout."""
FORWARD_TIMEOUT_S = 55.0
"""How long a request forwarded to the next generation waits when it carries no deadline."""


class Handover:
    """One shard generation's side of its rollovers: as g, `drain` hands its lanes to g+1; as
    g+1, it holds requests for lanes on their way until they `arrived` or it `settle`s. On
    either side `route` says where a message or cancel for a lane goes. See the module docstring.

    `lanes` is the shard's live lanes by id, shared with it: a lane handed over leaves it here.
    `serve` dispatches a request as the shard's receive loop does (held requests go through it,
    in their order); `end` ends a lane with a status and an error and delivers its result (a
    refused hand-over ends the lane `interrupted`); `info` describes a live lane for a
    `LaneList`. Everything runs on the node's event loop.
    """

    def __init__(
        self,
        node: Node,
        lanes: dict[str, Lane],
        transcript: Transcript,
        outbox: Outbox,
        *,
        serve: Callable[[Endpoint, bytes | None, f.Envelope], None],
        end: Callable[[Lane, f.ResultStatus, str | None], Awaitable[None]],
        info: Callable[[Lane], f.LaneInfo],
        lost: Callable[[str], Awaitable[None]],
    ) -> None:
        self._node = node
        self._lost = lost
        self._lanes = lanes
        self._transcript = transcript
        self._outbox = outbox
        self._serve = serve
        self._end = end
        self._info = info
        self.settled = False
        """This is the only generation of its name (see the module docstring)."""
        self._drain: asyncio.Future[f.Body] | None = None  # Drained, once drained
        self._awaiting: dict[str, list[Request]] = {}
        """Requests for lanes this shard does not have, held until it settles."""
        self._moved: set[str] = set()  # lanes handed over to the next generation

    @property
    def draining(self) -> bool:
        """`Drain` came: this generation admits no lane any more."""
        return self._drain is not None

    # --- the new generation ----------------------------------------------------------------------

    def settle(self) -> None:
        """This generation is the only one of its name now (the roster shows no draining
        predecessor): requests held for lanes that never came are answered (`not_found`), and
        off the loop, a gone generation's unfinished transcripts are closed as lost and the
        rows it left in the outbox are adopted and sent."""
        self.settled = True
        held, self._awaiting = self._awaiting, {}
        for requests in held.values():
            for ep, peer, env in requests:
                self._serve(ep, peer, env)
        self._node.spawn(self._close_lost())
        self._node.spawn(self._outbox.adopt())

    async def _close_lost(self) -> None:
        """Close a gone generation's unfinished lanes as lost, and tell `lost` of each (their
        sandboxes' maker: nothing runs in them any more, and their tasks go on, if at all, in
        lanes of their own)."""
        for lane in await self._transcript.close_lost():
            await self._lost(lane)

    def arrived(self, lane_id: str) -> None:
        """Lane `lane_id` is live here now (resumed): serve the requests held for it, in order."""
        for ep, peer, env in self._awaiting.pop(lane_id, []):
            self._serve(ep, peer, env)

    def route(self, ep: Endpoint, peer: bytes | None, env: f.Envelope, lane_id: str) -> Lane | None:
        """The live lane a message or cancel is for, or None when the request was dealt with
        here: held (the lane is being handed over, or may be on its way here), forwarded (it
        was handed over) or refused (`not_found`; `busy` past `HELD_MAX` held requests)."""
        lane = self._lanes.get(lane_id)
        if lane is not None and lane.held is None:
            return lane
        if lane is None and lane_id in self._moved:
            self._node.answer(ep, peer, env, self._forward(env))
            return None
        if lane is not None:
            held = lane.held
            full = len(held) >= HELD_MAX
        elif not self.settled:
            held = self._awaiting.setdefault(lane_id, [])
            full = sum(map(len, self._awaiting.values())) >= HELD_MAX
        else:
            message = f"no live lane {lane_id!r} on this shard"
            ep.reply(env, peer, f.Error(code=ErrorCode.NOT_FOUND, message=message))
            return None
        if full:
            message = f"lane {lane_id} is moving between generations; try again shortly"
            ep.reply(env, peer, f.Error(code=ErrorCode.BUSY, message=message))
        else:
            held.append((ep, peer, env))
        return None

    async def _forward(self, env: f.Envelope) -> f.Body:
        """`env`'s request, answered by this shard's next generation (it has the lane now)."""
        node = self._node
        return await node.call(node.name, env.body, timeout_s=env.ttl_s or FORWARD_TIMEOUT_S)

    async def lanes_and_results(self) -> f.Body:
        """`ListLanes(results=True)`: the live lanes, and the lanes whose result waits in the
        outbox, after adopting what a retired predecessor left there."""
        await self._outbox.adopt()
        lanes = [self._info(lane) for lane in self._lanes.values()]
        return f.LaneList(lanes=lanes, results=self._outbox.lanes())

    # --- the old generation ----------------------------------------------------------------------

    def drain(self, ep: Endpoint, peer: bytes | None, env: f.Envelope, req: f.Drain) -> None:
        """Serve `Drain`: the drain starts on the first one (its answer is due at the request's
        deadline, `env.ttl_s`, or else after `req.timeout_s`); every `Drain` is answered with
        its `Drained`, off the receive loop."""
        if self._drain is None:
            answer_by = time.monotonic() + (env.ttl_s or req.timeout_s) - ANSWER_MARGIN_S
            self._drain = asyncio.ensure_future(self._drain_lanes(req, answer_by))
        self._node.answer(ep, peer, env, _shielded(self._drain))

    async def _drain_lanes(self, req: f.Drain, answer_by: float) -> f.Body:
        """`Drain`: hand every lane over (see the module docstring) and say how each went, by
        `answer_by` (monotonic seconds: the request's deadline): lanes get `req.timeout_s` to
        reach a quiet point, a stopped command `DRAIN_KILL_S` more, a hand-over `HANDOVER_S`,
        the outbox `DELIVER_ON_STOP_S`, each cut short at `answer_by`. Runs once; a repeated
        `Drain` is answered with the same `Drained`."""
        log.info(
            "%s: draining %d lanes to generation %d (timeout %g s)",
            self._node.name,
            len(self._lanes),
            req.successor_gen,
            req.timeout_s,
        )
        deadline = time.monotonic() + req.timeout_s
        moves = await asyncio.gather(
            *(self._drain_lane(lane, deadline, answer_by) for lane in list(self._lanes.values()))
        )
        self._outbox.flush()
        await self._outbox.wait_sent(min(DELIVER_ON_STOP_S, answer_by - time.monotonic()))
        return f.Drained(lanes=list(moves))

    async def _drain_lane(self, lane: Lane, deadline: float, answer_by: float) -> f.LaneMove:
        """Bring `lane` to an end here or to the next generation (`Drain`)."""
        assert lane.task is not None
        began = time.monotonic()
        task = lane.task
        if not lane.parked_now():
            waits: list[asyncio.Future[Any]] = [task]
            if lane.quiet is not None:
                waits.append(lane.quiet.request())
            await asyncio.wait(
                waits, timeout=max(0.0, deadline - began), return_when=asyncio.FIRST_COMPLETED
            )
        partial = not (task.done() or lane.parked_now())
        if partial and lane.finishing:  # its step is done: it ends here (commit, result)
            await asyncio.wait([task])
        if task.done():
            return f.LaneMove(lane=lane.id, how="finished", elapsed_s=_since(began))
        lane.moving = True
        if partial and lane.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(lane.pgid, signal.SIGTERM)
            await asyncio.wait([task], timeout=min(DRAIN_KILL_S, self._node.args.lane_grace_s))
        task.cancel()  # SIGKILLs a command still running; a parked program ends at once
        await asyncio.gather(task, return_exceptions=True)
        return await self._hand_over(lane, partial, began, answer_by)

    async def _hand_over(
        self, lane: Lane, partial: bool, began: float, answer_by: float
    ) -> f.LaneMove:
        """Snapshot the stopped `lane` and offer it to the next generation until it takes it
        (`moved`/`partial`), refuses it (`lost`: the lane ends here `interrupted`, so the
        coordinator re-runs it) or `HANDOVER_S` passes unanswered (`lost`: whether the next
        generation has it is what the coordinator then asks it)."""
        lane.enter(LaneState.MOVING)
        lane.held = []
        next_seq, landed = self._transcript.detach(lane.id)
        start = lane.start
        if lane.questions is not None and lane.questions.answers != start.answers:
            # the answers it received travel with it: a re-run asking again gets them at once
            start = msgspec.structs.replace(start, answers=lane.questions.answers)
        snapshot = f.LaneSnapshot(
            start=start,
            sandbox=lane.sandbox,
            checkpoint=lane.quiet.checkpoint if lane.quiet is not None else None,
            mailbox=lane.mailbox.unread() if lane.mailbox is not None else [],
            message_keys=list(lane.message_keys or ()),
            next_seq=next_seq,
            partial=partial,
            elapsed_s=time.monotonic() - lane.began,
            spent=lane.meter.spent(),
            asked=lane.questions.asked_at_checkpoint if lane.questions is not None else 0,
            notes=lane.notes,
            rev=lane.rev,
        )
        with contextlib.suppress(TimeoutError):  # a slow disk delays the rows, nothing more
            async with asyncio.timeout(HANDOVER_S / 2):
                await landed  # the next generation's rows follow ours in LMDB, without a gap
        how: Literal["moved", "partial", "lost"] = "partial" if partial else "moved"
        detail = ""
        give_up = min(time.monotonic() + HANDOVER_S, answer_by - DELIVER_ON_STOP_S)
        while True:
            try:
                await self._node.call(
                    self._node.name, f.LaneResume(snapshot=snapshot), timeout_s=HANDOVER_S / 4
                )
                break
            except (CallTimeout, PeerDown) as exc:  # the outcome is unknown: offer it again
                if time.monotonic() >= give_up:
                    how, detail = "lost", str(exc)
                    break
                await asyncio.sleep(REOFFER_S)
            except RemoteError as exc:  # refused: the lane is not there, so it ends here
                how, detail = "lost", f"refused by the next generation: {exc}"
                self._transcript.resume(lane.id, next_seq, time.time() - snapshot.elapsed_s)
                lane.moving = False
                await self._end(lane, f.ResultStatus.INTERRUPTED, f"interrupted: it was {detail}")
                break
        if lane.moving:  # there (or, unanswered, maybe there: the next generation says)
            self._moved.add(lane.id)
            self._lanes.pop(lane.id, None)
            self._node.retitle()
        held, lane.held = lane.held, None
        for ep, peer, env in held:
            self._serve(ep, peer, env)
        if how == "lost":
            log.warning("lane %s: not handed over: %s", lane.id, detail)
        return f.LaneMove(lane=lane.id, how=how, elapsed_s=_since(began), detail=detail)


def _since(began: float) -> float:
    return round(time.monotonic() - began, 3)


async def _shielded(drain: asyncio.Future[f.Body]) -> f.Body:
    """The drain's answer; a caller giving up (its reply task cancelled) leaves it running."""
    return await asyncio.shield(drain)
