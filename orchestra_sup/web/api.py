"""The HTTP API, version 1: what `ctl` does, as JSON with the shapes of `ctl --json`
(`protocol.shapes`), and the event log as server-sent events (issue 23).

It is an aiohttp application on the supervisor's own event loop (aiohttp is already the etcd
client's HTTP stack here, and it serves from the loop the supervisor has, with no second
server thread to hand requests across). A request is the same ctl frame `orchestra-sup ctl`
sends, answered by the same service (`Desk.ask`), so the two cannot drift apart.

Who may do what: every request carries `Authorization: Bearer <token>` (`keys init
--http-token`, `protocol.tokens`). Without a valid one the answer is 401 and nothing about the
tree. A `read` token may GET; `operate` may also POST (submit, cancel, answer, message). An
answer is recorded as `token:<name>`, which the server stamps (ARCHITECTURE.md invariant 18).

Paths (`make_app` lists them): `GET /v1/status`, `/v1/tree`, `/v1/plans`, `/v1/plans/{id}`,
`/v1/lanes`, `/v1/lanes/{lane}/logs`, `/v1/events` (SSE: `Last-Event-ID`, or `?since=`,
resumes after that seq; `?plan=` filters); `POST /v1/plans` (the plan file's TOML, or its JSON
with `Content-Type: application/json`), `/v1/plans/{id}/message`, `/v1/lanes/{lane}/approve`,
`/reject`, `/redirect`, `/accept-partial` (a JSON body `{"text": ...}`, optional but for
redirect and message), `/v1/lanes/{lane}/cancel`, `/v1/children/{name}/restart`,
`/v1/reload`, `/v1/tools/{tool}` (a JSON object of string parameters, as `ctl call`).
`/v1/events?status=S` also pushes the status every S seconds (`Api.events`): what the console
needs. The console's page and its files (`web.static`: `GET /`, `/console/{file}`) need no token.

Errors are `{"error": {"code", "message"}}`, the code the tree's (`ErrorCode`) or the server's
(`unauthorized`, `forbidden`, `bad_request`, `too_large`), with the HTTP status `STATUS` maps
it to, as ctl maps codes onto exit statuses (usage errors 4xx, the tree's state 5xx).

Limits: a body of at most `BODY_MAX` bytes (413 beyond); a request (but an event stream) of
at most `Limits.request_s` seconds, body included (504 beyond), its part in the tree at most
`ASK_TTL_S`; an event stream's write at most `Limits.write_s` (a client that stops reading is
let go); every answer carries `SECURITY_HEADERS`. Connections are bounded by the server
(`supervisor.httpserve`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from aiohttp import web

from orchestra_sup.coordinator.plan import plan_from_mapping
from orchestra_sup.errors import ErrorCode, OrchestraError, PlanError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes
from orchestra_sup.protocol.endpoint import TokenIdentity
from orchestra_sup.protocol.shapes import LogRowView
from orchestra_sup.protocol.tokens import TokenTable
from orchestra_sup.web import openapi, static
from orchestra_sup.web.routes import (
    ROUTES,
    Accepted,
    Caller,
    Cancelled,
    Logs,
    Restarted,
    RolloverAsk,
    Sent,
    ToolValue,
)

log = logging.getLogger("orchestra_sup.supervisor")

BODY_MAX = 1 << 20
"""Bytes a request body may hold (a plan file is far smaller)."""
ASK_TTL_S = 30.0
"""Seconds a request's part in the tree (a child's answer) may take."""
EVENTS_POLL_S = 0.5
"""Seconds an event stream that has sent every committed event waits before asking again."""
EVENTS_PAGE = 200
"""Events an event stream asks for and writes at once, then yields the loop."""
TAIL_MAX = 10_000
"""The most events `/v1/events?tail=` starts back from the newest."""
STATUS_EVERY_S = (1.0, 60.0)
"""The least and most seconds `/v1/events?status=` may ask between two status messages."""
KEEPALIVE_S = 15.0
"""Seconds of silence after which an event stream sends a comment line (proxies keep it)."""
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
}
STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.PATH_ESCAPE: 400,
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.VERSION_SKEW: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.FENCED: 409,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.BUSY: 503,
    ErrorCode.PEER_DOWN: 503,
    ErrorCode.SHARD_FULL: 503,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.STATE_DEGRADED: 507,
}
"""HTTP status by the tree's error code; any other code is 500."""
VERDICTS = {
    "approve": "approve",
    "reject": "reject",
    "redirect": "redirect",
    "accept-partial": "accept_partial",
}
"""Path verb -> the answer's verdict (`CtlRespond.verdict`)."""

PUBLIC = frozenset({"/v1/openapi.json"})
"""Paths served without a token: they say nothing about the tree."""
ROLLOVER_WAIT_MAX_S = 10.0
"""Seconds a rollover poll may be held (`?wait=`), well inside `Limits.request_s`."""
ROLLOVER_BODY = '{"target": "shards", "release": "", "drain_timeout_s": null}'

_WHO = web.RequestKey("who", TokenIdentity)
STREAMS = web.AppKey("streams", set[asyncio.Task[Any]])
"""The tasks serving event streams now (`end_streams`)."""
_encode = msgspec.json.Encoder().encode


def _json(answer: msgspec.Struct, status: int = 200) -> web.Response:
    """`answer` (a type of `web.routes`) as the JSON body."""
    return web.Response(body=_encode(answer), status=status, content_type="application/json")


@dataclass(frozen=True, slots=True)
class Limits:
    """Seconds a request may take, its body and answer included (`request_s`), and one write
    of an event stream may wait for the client to read (`write_s`): `[http] request_s` and
    `idle_s` (`protocol.httplisten`)."""

    request_s: float = 60.0
    write_s: float = 15.0


class Desk(Protocol):
    """What the API asks of the supervisor: a ctl request answered as from `caller`
    (`supervisor.ctl.CtlService.ask`)."""

    async def ask(self, caller: TokenIdentity, body: f.Body, ttl_s: float) -> f.Body: ...


def make_app(
    desk: Desk, tokens: TokenTable, limits: Limits | None = None, releases: tuple[str, ...] = ()
) -> web.Application:
    """The API's application over `desk`, admitting the bearers of `tokens`, within `limits`
    (None: `Limits()`); its paths are `web.routes.ROUTES`. A rollover may name the
    supervisor's own interpreter or one of `releases` (`[http] releases`)."""
    limits = limits or Limits()
    streams: set[asyncio.Task[Any]] = set()
    page = static.Console()
    bounded = _bounded(limits.request_s, streams)
    app = web.Application(
        client_max_size=BODY_MAX,
        middlewares=[_headers, _errors, bounded, _authorized(tokens, page)],
    )
    app[STREAMS] = streams
    api = Api(desk, limits, releases)
    app.add_routes(
        [web.route(route.method, route.path, getattr(api, route.handler)) for route in ROUTES]
    )
    app.add_routes(static.routes(page))
    return app


def end_streams(app: web.Application) -> None:
    """End every event stream of `app` now: a stream never ends by itself, and a server
    stopping would otherwise wait out its shutdown timeout for each (the clients resume with
    `Last-Event-ID`)."""
    for task in app[STREAMS]:
        task.cancel()


class Refused(OrchestraError):
    """A request refused: answered `{"error": {"code", "message"}}` with HTTP `status`
    (`_errors`). Never leaves this module."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _refusal(status: int, code: str, message: str, **headers: str) -> web.Response:
    body = {"error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers={**SECURITY_HEADERS, **headers})


class Api:
    """The handlers; each sends one ctl frame to `desk` and shapes its answer."""

    def __init__(self, desk: Desk, limits: Limits, releases: tuple[str, ...]) -> None:
        self.desk = desk
        self.limits = limits
        self.releases = releases
        self._openapi = _encode(openapi.document())

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")

    async def whoami(self, request: web.Request) -> web.Response:
        who = request[_WHO]
        return _json(Caller(name=who.name, role=who.role))

    async def _ask(self, request: web.Request, body: f.Body, answer: type[Any]) -> Any:
        reply = await self.desk.ask(request[_WHO], body, ASK_TTL_S)
        if isinstance(reply, f.Error):
            raise Refused(STATUS.get(reply.code, 500), str(reply.code), reply.message)
        if not isinstance(reply, answer):
            message = f"the tree answered {type(reply).__name__}, not {answer.__name__}"
            raise Refused(500, "unexpected", message)
        return reply

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(
            shapes.status_json(await self._ask(request, f.CtlStatus(), f.StatusReply))
        )

    async def tree(self, request: web.Request) -> web.Response:
        return web.json_response(
            shapes.tree_json(await self._ask(request, f.CtlStatus(), f.StatusReply))
        )

    async def plans(self, request: web.Request) -> web.Response:
        reply = await self._ask(request, f.CtlPlans(), f.PlanList)
        return web.json_response({"plans": msgspec.to_builtins(reply.plans)})

    async def plan(self, request: web.Request) -> web.Response:
        reply = await self._ask(request, f.CtlPlan(id=request.match_info["id"]), f.PlanReport)
        return web.json_response(shapes.plan_json(reply))

    async def lanes(self, request: web.Request) -> web.Response:
        return web.json_response(
            shapes.lanes_json(await self._ask(request, f.CtlLanes(), f.LaneList))
        )

    async def submit(self, request: web.Request) -> web.Response:
        _operates(request)
        # parsed and checked off the loop: a 1 MiB plan of 20,000 tasks takes about 0.5 s
        spec = await asyncio.to_thread(_plan, await _body(request), request.content_type)
        reply = await self._ask(request, f.CtlSubmit(plan=spec), f.PlanAccepted)
        return _json(Accepted(id=reply.id), 201)

    async def message(self, request: web.Request) -> web.Response:
        _operates(request)
        plan_id, text = request.match_info["id"], _text(await _body(request))
        if not text:
            raise Refused(400, "bad_request", 'a message needs a body {"text": "..."}')
        await self._ask(request, f.CtlMessage(plan=plan_id, text=text), f.Ack)
        return _json(Sent(plan=plan_id, sent=True))

    async def restart(self, request: web.Request) -> web.Response:
        _operates(request)
        name = request.match_info["name"]
        await self._ask(request, f.CtlRestart(name=name), f.Ack)
        return _json(Restarted(restarted=name))

    async def reload(self, request: web.Request) -> web.Response:
        _operates(request)
        reply = await self._ask(request, f.CtlReload(), f.ReloadReport)
        out = msgspec.to_builtins(reply)
        out.pop("t", None)
        return web.json_response(out, status=409 if reply.refused else 200)

    async def call(self, request: web.Request) -> web.Response:
        """A relayed tool (`ctl call TOOL KEY=VALUE ...`): the body a JSON object of string
        parameters; answered `{"value": ...}`."""
        _operates(request)
        raw = await _body(request)
        try:
            params = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            params = None
        if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()
        ):
            raise Refused(
                400, "bad_request", 'the body must be a JSON object of strings: {"path": "README"}'
            )
        body = f.CtlCall(tool=request.match_info["tool"], params=params)
        reply = await self._ask(request, body, f.ToolResult)
        return _json(ToolValue(value=reply.value))

    async def logs(self, request: web.Request) -> web.Response:
        """A lane's transcript rows after `?after=SEQ` (default: from the first), at most
        `?limit=N` (default 1000), as `ctl logs --json` prints each, and whether the lane is
        `done`."""
        lane = request.match_info["lane"]
        after = _seq(request.query.get("after", "0")) if "after" in request.query else -1
        limit = min(_seq(request.query.get("limit", "1000")) or 1, 10_000)
        reply = await self._ask(
            request, f.CtlLogs(lane=lane, after_seq=after, limit=limit), f.LogChunk
        )
        if not reply.found:
            raise Refused(404, "not_found", f"no lane {lane!r} on any shard")
        rows = [
            LogRowView(seq=row.seq, ts=row.ts, stream=row.stream, data=row.data, lane=lane)
            for row in reply.rows
        ]
        return _json(Logs(lane=lane, rows=rows, done=reply.done))

    async def cancel(self, request: web.Request) -> web.Response:
        _operates(request)
        await self._ask(request, f.CtlCancel(lane=request.match_info["lane"]), f.Ack)
        return _json(Cancelled(lane=request.match_info["lane"], cancelled=True))

    async def rollover(self, request: web.Request) -> web.Response:
        """A rollover begun (`ctl rollover`): answered 202 with its first report, at once;
        `GET /v1/rollovers/{id}` follows it. The release must be the supervisor's own ("")
        or one of `[http] releases`: a token must not choose a program to run."""
        _operates(request)
        try:
            ask = msgspec.json.decode(await _body(request), type=RolloverAsk)
        except msgspec.DecodeError as exc:  # ValidationError is one
            raise Refused(400, "bad_request", f"the body must be {ROLLOVER_BODY}: {exc}") from None
        if ask.release and ask.release not in self.releases:
            raise Refused(
                403,
                "forbidden",
                f"release {ask.release!r} is not in [http] releases; over HTTP a rollover may "
                'name the supervisor\'s own interpreter ("") or one listed there',
            )
        body = f.CtlRollover(
            name=ask.target, release=ask.release, drain_timeout_s=ask.drain_timeout_s
        )
        reply = await self._ask(request, body, f.RolloverReport)
        headers = {"Location": f"/v1/rollovers/{reply.id}"}
        return web.json_response(shapes.rollover_json(reply), status=202, headers=headers)

    async def rollover_status(self, request: web.Request) -> web.Response:
        """A rollover's report with its events after `?after=SEQ` (default: every one),
        held up to `?wait=S` seconds (0..10, default 0) for a new one (a long poll)."""
        after = _seq(request.query["after"]) if "after" in request.query else -1
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= ROLLOVER_WAIT_MAX_S:
            raise Refused(400, "bad_request", f"wait: 0..{ROLLOVER_WAIT_MAX_S:g} seconds")
        body = f.CtlRolloverStatus(id=request.match_info["id"], after_seq=after, wait_s=wait)
        return web.json_response(
            shapes.rollover_json(await self._ask(request, body, f.RolloverReport))
        )

    async def respond(self, request: web.Request) -> web.Response:
        """An answer to a lane's question; the verdict is the path's last part (its routes
        are `VERDICTS`' keys only)."""
        _operates(request)
        verb = request.path.rsplit("/", 1)[1]
        text = _text(await _body(request))
        body = f.CtlRespond(lane=request.match_info["lane"], verdict=VERDICTS[verb], text=text)
        return web.json_response(
            shapes.recorded_json(await self._ask(request, body, f.HitlRecorded))
        )

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The event log from a seq on, as `text/event-stream`: each event `id: <seq>`,
        `event: <kind>`, `data: <ctl events --json's object>`; resumed after `Last-Event-ID`
        (or `?since=`), for as long as the client reads; without either, `?tail=N` starts
        at the newest N (at most `TAIL_MAX`) rather than the oldest kept. With `?status=S`
        (seconds, within `STATUS_EVERY_S`), also `event: status` with `/v1/status`'s object
        as `data:` and no `id:` (so resuming is the same), once when the stream opens and
        every S seconds on."""
        resume = request.headers.get("Last-Event-ID") or request.query.get("since")
        since = _seq(resume or "0")
        plan = request.query.get("plan", "")
        every = _every(request.query["status"]) if "status" in request.query else None
        if "tail" in request.query and resume is None:  # a new page: the newest, not 30 days
            newest = await self._ask(request, f.CtlEvents(since=0, limit=1), f.EventsPage)
            since = max(0, newest.last - min(_seq(request.query["tail"]), TAIL_MAX))
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **SECURITY_HEADERS}
        )
        await stream.prepare(request)
        clock = asyncio.get_running_loop().time
        quiet, status_at = 0.0, clock()
        while True:
            chunk = b""
            try:
                if every is not None and clock() >= status_at:
                    reply = await self._ask(request, f.CtlStatus(), f.StatusReply)
                    chunk = b"event: status\ndata: %s\n\n" % _encode(shapes.status_json(reply))
                    status_at = clock() + every
                ask = f.CtlEvents(since=since, plan=plan, limit=EVENTS_PAGE)
                page = await self._ask(request, ask, f.EventsPage)
            except Refused:  # the headers are sent: the stream ends, the client resumes
                return stream
            chunk += b"".join(
                b"id: %d\nevent: %s\ndata: %s\n\n" % (e.seq, e.kind.encode(), _encode(e))
                for e in page.events
            )
            if chunk and not await self._send(stream, chunk):
                return stream
            await asyncio.sleep(0)  # a replay of a long log lets the loop serve between pages
            since = max(since, page.next)
            if chunk:
                quiet = 0.0
            if page.next >= page.last:
                await asyncio.sleep(EVENTS_POLL_S)
                quiet += EVENTS_POLL_S
                if quiet >= KEEPALIVE_S:
                    if not await self._send(stream, b": keep-alive\n\n"):
                        return stream
                    quiet = 0.0

    async def _send(self, stream: web.StreamResponse, chunk: bytes) -> bool:
        """Write `chunk` to an event stream; False when the client went (an EventSource's
        normal end) or did not read it within `write_s` (the stream is then let go)."""
        try:
            async with asyncio.timeout(self.limits.write_s):
                await stream.write(chunk)
        except (ConnectionResetError, TimeoutError):
            return False
        return True


async def _body(request: web.Request) -> str:
    """The request's body as UTF-8 text (400 when it is not)."""
    try:
        return (await request.read()).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, "bad_request", "the body is not UTF-8 text") from None


def _operates(request: web.Request) -> None:
    who = request[_WHO]
    if who.role != "operate":
        raise Refused(403, "forbidden", f"token {who.name!r} may read, not {request.method}")


def _plan(text: str, content_type: str) -> f.PlanSpec:
    """The plan a POST body holds: JSON with `application/json`, else TOML."""
    try:
        data = json.loads(text) if content_type == "application/json" else tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        raise Refused(400, "bad_request", f"the plan is not valid JSON or TOML: {exc}") from None
    if not isinstance(data, dict):
        raise Refused(400, "bad_request", "the plan must be a table (an object)")
    try:
        return plan_from_mapping(data, source="the request's plan")
    except PlanError as exc:
        raise Refused(400, "bad_request", str(exc)) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # a number no check expected
        raise Refused(400, "bad_request", f"the plan has a value out of range: {exc}") from None


def _text(body: str) -> str:
    """An answer's `text` from its optional JSON body `{"text": ...}`."""
    if not body.strip():
        return ""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise Refused(400, "bad_request", 'the body must be JSON: {"text": "..."}') from None
    text = value.get("text", "") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise Refused(400, "bad_request", 'the body must be JSON: {"text": "..."}')
    return text


def _every(raw: str) -> float:
    """`?status=`'s seconds between two status messages (400 unless within `STATUS_EVERY_S`)."""
    try:
        every = float(raw) if len(raw) <= 20 else math.nan
    except ValueError:
        every = math.nan
    low, high = STATUS_EVERY_S
    if not low <= every <= high:  # NaN is within no bounds
        message = f"?status= takes seconds from {low:g} to {high:g}, not {raw[:40]!r}"
        raise Refused(400, "bad_request", message)
    return every


def _seq(raw: str) -> int:
    if len(raw) > 19 or not raw.isascii() or not raw.isdigit() or int(raw) > f.MAX_SEQ:
        raise Refused(400, "bad_request", f"not a sequence number: {raw[:40]!r}")
    return int(raw)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if not response.prepared:
        response.headers.update(SECURITY_HEADERS)
    return response


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A `Refused` as its JSON error; aiohttp's own refusals (404 path, 405 method, 413 body)
    as JSON errors too; and a bug in a handler as a JSON 500 (logged), never a traceback."""
    try:
        return await handler(request)
    except Refused as refused:
        return _refusal(refused.status, refused.code, str(refused))
    except web.HTTPRequestEntityTooLarge:
        return _refusal(413, "too_large", f"the body is over {BODY_MAX} bytes")
    except web.HTTPNotFound:
        return _refusal(404, "not_found", f"no {request.path} in the API (see /v1/...)")
    except web.HTTPMethodNotAllowed:
        return _refusal(405, "bad_request", f"{request.method} is not allowed on {request.path}")
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("HTTP API: %s %s failed", request.method, request.path)
        return _refusal(500, "internal", "the server failed this request (see its log)")


def _bounded(
    request_s: float, streams: set[asyncio.Task[Any]]
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request but an event stream within `request_s` (504 beyond); an event
        stream's task in `streams` while it runs (`end_streams`)."""
        if request.path == "/v1/events":
            task = asyncio.current_task()
            assert task is not None
            streams.add(task)
            try:
                return await handler(request)
            finally:
                streams.discard(task)
        try:
            async with asyncio.timeout(request_s):
                return await handler(request)
        except TimeoutError:
            raise Refused(504, "timeout", f"the request took over {request_s:g} s") from None

    return bounded


def _authorized(
    tokens: TokenTable, page: static.Console
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC or static.public(request, page):
            return await handler(request)
        presented = request.headers.getall("Authorization", [])
        if len(presented) > 1:  # which one a proxy or the client meant is not ours to guess
            return _refusal(400, "bad_request", "more than one Authorization header")
        scheme, _, bearer = (presented[0] if presented else "").partition(" ")
        token = tokens.check(bearer.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            message = "a valid bearer token is needed (keys init --http-token)"
            return _refusal(401, "unauthorized", message, **{"WWW-Authenticate": "Bearer"})
        request[_WHO] = TokenIdentity(name=token.name, role=token.role)
        return await handler(request)

    return check
