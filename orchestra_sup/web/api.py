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

Paths: `web.routes.ROUTES`, which the OpenAPI document (`web.openapi`) is made from too; the
event stream is `web.stream`'s; the console's page and files (`web.static`: `GET /`,
`/console/{file}`) and the document need no token. A plan is POSTed as its file's TOML, or
its JSON (`Content-Type: application/json`, or a body that begins with "{").

Errors are `{"error": {"code", "message"}}`, the code the tree's (`ErrorCode`) or the server's
(`unauthorized`, `forbidden`, `bad_request`, `too_large`, `timeout`, `internal`), with the
HTTP status `web.replies.STATUS` maps it to.

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
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from aiohttp import web

from orchestra_sup.coordinator.plan import plan_from_mapping
from orchestra_sup.errors import PlanError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes
from orchestra_sup.protocol.endpoint import TokenIdentity
from orchestra_sup.protocol.tokens import TokenTable
from orchestra_sup.web import openapi, static, stream
from orchestra_sup.web.replies import (
    SECURITY_HEADERS,
    Refused,
    encode,
    json_reply,
    refusal,
    seconds,
    seq,
)
from orchestra_sup.web.routes import (
    ROUTES,
    VERDICTS,
    Accepted,
    AnswerBody,
    Caller,
    Cancelled,
    Logs,
    Restarted,
    RolloverAsk,
    Sent,
    Text,
    ToolValue,
)

log = logging.getLogger("orchestra_sup.supervisor")

BODY_MAX = 1 << 20
"""Bytes a request body may hold (a plan file is far smaller)."""
ASK_TTL_S = 30.0
"""Seconds a request's part in the tree (a child's answer) may take."""

PUBLIC = frozenset(route.path for route in ROUTES if route.public)
"""Paths served without a token: they say nothing about the tree."""
ROLLOVER_WAIT_MAX_S = 10.0
"""Seconds a rollover poll may be held (`?wait=`), well inside `Limits.request_s`."""
ANSWER_BODY = '{"text": "...", "grant": {"wall_s": 600}, "retries": 1}, each optional'
ROLLOVER_BODY = '{"target": "shards", "release": "", "drain_timeout_s": null}'

_WHO = web.RequestKey("who", TokenIdentity)
STREAMS = web.AppKey("streams", set[asyncio.Task[Any]])
"""The tasks serving event streams now (`end_streams`)."""


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


class Api:
    """The handlers; each sends one ctl frame to `desk` and shapes its answer."""

    def __init__(self, desk: Desk, limits: Limits, releases: tuple[str, ...]) -> None:
        self.desk = desk
        self.limits = limits
        self.releases = releases
        self._openapi = encode(openapi.document())
        self.feed = stream.Feed()

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")

    async def whoami(self, request: web.Request) -> web.Response:
        who = request[_WHO]
        return json_reply(Caller(name=who.name, role=who.role))

    async def _ask(self, request: web.Request, body: f.Body, answer: type[Any]) -> Any:
        reply = await self.desk.ask(request[_WHO], body, ASK_TTL_S)
        if isinstance(reply, f.Error):
            raise Refused.of(reply)
        if not isinstance(reply, answer):
            message = f"the tree answered {type(reply).__name__}, not {answer.__name__}"
            raise Refused(500, "unexpected", message)
        return reply

    async def status(self, request: web.Request) -> web.Response:
        return json_reply(
            shapes.status_json(await self._ask(request, f.CtlStatus(), f.StatusReply))
        )

    async def tree(self, request: web.Request) -> web.Response:
        return json_reply(shapes.tree_json(await self._ask(request, f.CtlStatus(), f.StatusReply)))

    async def plans(self, request: web.Request) -> web.Response:
        reply = await self._ask(request, f.CtlPlans(), f.PlanList)
        return json_reply({"plans": msgspec.to_builtins(reply.plans)})

    async def plan(self, request: web.Request) -> web.Response:
        reply = await self._ask(request, f.CtlPlan(id=request.match_info["id"]), f.PlanReport)
        return json_reply(shapes.plan_json(reply))

    async def lanes(self, request: web.Request) -> web.Response:
        return json_reply(shapes.lanes_json(await self._ask(request, f.CtlLanes(), f.LaneList)))

    async def submit(self, request: web.Request) -> web.Response:
        # parsed and checked off the loop: a 1 MiB plan of 20,000 tasks takes about 0.5 s
        spec = await asyncio.to_thread(_plan, await _body(request), request.content_type)
        reply = await self._ask(request, f.CtlSubmit(plan=spec), f.PlanAccepted)
        return json_reply(Accepted(id=reply.id), 201)

    async def message(self, request: web.Request) -> web.Response:
        plan_id = request.match_info["id"]
        text = _decoded(await _body(request), Text, '{"text": "..."}').text
        if not text:
            raise Refused(400, "bad_request", 'a message needs a body {"text": "..."}')
        await self._ask(request, f.CtlMessage(plan=plan_id, text=text), f.Ack)
        return json_reply(Sent(plan=plan_id, sent=True))

    async def restart(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._ask(request, f.CtlRestart(name=name), f.Ack)
        return json_reply(Restarted(restarted=name))

    async def reload(self, request: web.Request) -> web.Response:
        reply = await self._ask(request, f.CtlReload(), f.ReloadReport)
        return json_reply(shapes.reload_json(reply), 409 if reply.refused else 200)

    async def call(self, request: web.Request) -> web.Response:
        """A relayed tool (`ctl call TOOL KEY=VALUE ...`): the body a JSON object of string
        parameters; answered `{"value": ...}`."""
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
        return json_reply(ToolValue(value=reply.value))

    async def logs(self, request: web.Request) -> web.Response:
        """A lane's transcript rows after `?after=SEQ` (default: from the first), at most
        `?limit=N` (default 1000), as `ctl logs --json` prints each, and whether the lane is
        `done`."""
        lane = request.match_info["lane"]
        after = seq(request.query.get("after", "0")) if "after" in request.query else -1
        limit = min(seq(request.query.get("limit", "1000")) or 1, 10_000)
        reply = await self._ask(
            request, f.CtlLogs(lane=lane, after_seq=after, limit=limit), f.LogChunk
        )
        if not reply.found:
            raise Refused(404, "not_found", f"no lane {lane!r} on any shard")
        rows = [shapes.log_row_view(row, lane) for row in reply.rows]
        return json_reply(Logs(lane=lane, rows=rows, done=reply.done))

    async def cancel(self, request: web.Request) -> web.Response:
        await self._ask(request, f.CtlCancel(lane=request.match_info["lane"]), f.Ack)
        return json_reply(Cancelled(lane=request.match_info["lane"], cancelled=True))

    async def rollover(self, request: web.Request) -> web.Response:
        """A rollover begun (`ctl rollover`): answered 202 with its first report, at once;
        `GET /v1/rollovers/{id}` follows it. The release must be the supervisor's own ("")
        or one of `[http] releases`: a token must not choose a program to run."""
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
        location = f"/v1/rollovers/{reply.id}"
        return json_reply(shapes.rollover_json(reply), 202, Location=location)

    async def rollover_status(self, request: web.Request) -> web.Response:
        """A rollover's report with its events after `?after=SEQ` (default: every one),
        held up to `?wait=S` seconds (0..10, default 0) for a new one (a long poll)."""
        after = seq(request.query["after"]) if "after" in request.query else -1
        wait = seconds(request.query.get("wait", "0"), 0.0, ROLLOVER_WAIT_MAX_S, "wait")
        body = f.CtlRolloverStatus(id=request.match_info["id"], after_seq=after, wait_s=wait)
        return json_reply(shapes.rollover_json(await self._ask(request, body, f.RolloverReport)))

    async def respond(self, request: web.Request) -> web.Response:
        """An answer to a lane's question; the verdict is the path's last part (its routes
        are `VERDICTS`' keys only)."""
        verb = request.path.rsplit("/", 1)[1]
        answer = _decoded(await _body(request), AnswerBody, ANSWER_BODY)
        body = f.CtlRespond(
            lane=request.match_info["lane"],
            verdict=VERDICTS[verb],
            text=answer.text,
            grant=answer.grant,
            retries=answer.retries,
        )
        return json_reply(shapes.recorded_json(await self._ask(request, body, f.HitlRecorded)))

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The event log as server-sent events (`web.stream`)."""
        return await stream.serve(
            request,
            lambda body, answer: self._ask(request, body, answer),
            self.feed,
            self.limits.write_s,
        )


async def _body(request: web.Request) -> str:
    """The request's body as UTF-8 text (400 when it is not)."""
    try:
        return (await request.read()).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, "bad_request", "the body is not UTF-8 text") from None


def _plan(text: str, content_type: str) -> f.PlanSpec:
    """The plan a POST body holds: JSON with `application/json` or when it begins with "{"
    (a TOML file cannot), else TOML."""
    as_json = content_type == "application/json" or text.lstrip().startswith("{")
    try:
        data = json.loads(text) if as_json else tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        kind = "JSON" if as_json else "TOML (or JSON, sent as application/json)"
        raise Refused(400, "bad_request", f"the plan is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise Refused(400, "bad_request", "the plan must be a table (an object)")
    try:
        return plan_from_mapping(data, source="the request's plan")
    except PlanError as exc:
        raise Refused(400, "bad_request", str(exc)) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # a number no check expected
        raise Refused(400, "bad_request", f"the plan has a value out of range: {exc}") from None


def _decoded(body: str, kind: type[Any], example: str) -> Any:
    """`body` as JSON of `kind` (a `web.routes` type; an empty body: `kind()`). Raises
    `Refused` (400) naming what is wrong: not JSON, an unknown field, a wrong type."""
    if not body.strip():
        try:
            return kind()
        except TypeError:  # a required field
            raise Refused(400, "bad_request", f"the body must be JSON: {example}") from None
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise Refused(400, "bad_request", f"{exc} (the body: {example})") from None
    except (msgspec.DecodeError, RecursionError):
        raise Refused(400, "bad_request", f"the body must be JSON: {example}") from None


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
        return refusal(refused.status, refused.code, str(refused))
    except web.HTTPRequestEntityTooLarge:
        return refusal(413, "too_large", f"the body is over {BODY_MAX} bytes")
    except web.HTTPNotFound:
        return refusal(404, "not_found", f"no {request.path} in the API (see /v1/...)")
    except web.HTTPMethodNotAllowed:
        return refusal(405, "bad_request", f"{request.method} is not allowed on {request.path}")
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("HTTP API: %s %s failed", request.method, request.path)
        return refusal(500, "internal", "the server failed this request (see its log)")


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
            return refusal(400, "bad_request", "more than one Authorization header")
        scheme, _, bearer = (presented[0] if presented else "").partition(" ")
        token = tokens.check(bearer.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            message = "a valid bearer token is needed (keys init --http-token)"
            return refusal(401, "unauthorized", message, **{"WWW-Authenticate": "Bearer"})
        if request.method != "GET" and not token.operates:  # `Route.operate`
            message = f"token {token.name!r} may read, not {request.method} (operate may)"
            return refusal(403, "forbidden", message)
        request[_WHO] = TokenIdentity(name=token.name, role=token.role)
        return await handler(request)

    return check
