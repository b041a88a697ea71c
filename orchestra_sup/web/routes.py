"""The HTTP API's routes as data, and the types of the answers that are the API's own: what
the server serves (`web.api.make_app`) and what its OpenAPI document says (`web.openapi`)
are both read from `ROUTES`, so a path cannot be served undocumented or documented unserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from orchestra_sup.protocol import shapes
from orchestra_sup.protocol.frames.values import Budget


class Accepted(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A plan accepted: its id (`GET /v1/plans/{id}` follows it)."""

    id: str


class Sent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A message delivered to a plan's session."""

    plan: str
    sent: bool


class Restarted(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A child restarted (its new generation is in `GET /v1/tree`)."""

    restarted: str


class Cancelled(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lane: str
    cancelled: bool


class ToolValue(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a relayed tool answered (`ctl call`)."""

    value: Any


class Logs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A lane's transcript rows after `?after=`, and whether the lane is `done`."""

    lane: str
    rows: list[shapes.LogRowView]
    done: bool


class Caller(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The token a request carried: its `name` (answers are recorded `token:NAME`) and
    `role` ("read" or "operate")."""

    name: str
    role: str


class ErrorDetail(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`code`: the tree's `ErrorCode` ("not_found", "busy", "state_degraded", ...) or the
    server's ("unauthorized", "forbidden", "bad_request", "too_large", "timeout",
    "internal"); `message`: one line for people."""

    code: str
    message: str


class ErrorBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every refusal, with the HTTP status its code maps to (`web.replies.STATUS`)."""

    error: ErrorDetail


class Text(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A message's text."""

    text: str


class AnswerBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An answer to a lane's question, as `ctl approve` and its kin take it: `text` (needed
    for reject and redirect), `grant` more budget with an approval of a task stopped at its
    budget, `retries` more attempts with an approval of a task that used its retries."""

    text: str = ""
    grant: Budget | None = None
    retries: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0


class RolloverAsk(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rollover (`ctl rollover`): `target` a child, "shards", "all", or a host ("host-a",
    "host-a/shard-0"); `release` an interpreter path, "" for the supervisor's own, else one
    of `[http] releases`; `drain_timeout_s` seconds (null: `[supervisor] drain_timeout_s`)."""

    target: str
    release: str = ""
    drain_timeout_s: float | None = None


VERDICTS = {
    "approve": "approve",
    "reject": "reject",
    "redirect": "redirect",
    "accept-partial": "accept_partial",
}
"""A lane's answer routes by their path's last part -> the answer's verdict
(`CtlRespond.verdict`)."""
PLAN_BODY = "plan"
"""A request body that is a plan file (TOML, or its JSON), checked by the server."""


@dataclass(frozen=True, slots=True)
class Route:
    """One path of the API. `handler`: the `web.api.Api` method serving it; `answer`: the
    type of its 2xx body (None: an event stream); `body`: the request body's type, or
    `PLAN_BODY`, or None. A route that is not a GET changes the tree: only an `operate` token
    may ask it (`operate`)."""

    method: str
    path: str
    handler: str
    summary: str
    answer: type[Any] | None
    status: int = 200
    body: type[Any] | str | None = None
    query: tuple[tuple[str, str], ...] = ()
    """(name, what it is) of each query parameter."""
    public: bool = False
    """Served without a token (it says nothing about the tree)."""
    refused: type[Any] | None = None
    """The type of a 409 answer that is not an `ErrorBody` (a reload refused)."""

    @property
    def operate(self) -> bool:
        return self.method != "GET"


ROUTES = (
    Route("GET", "/v1/status", "status", "The supervisor and every child", shapes.StatusView),
    Route("GET", "/v1/tree", "tree", "The supervision tree, nested", shapes.TreeNode),
    Route("GET", "/v1/whoami", "whoami", "The token this request carries", Caller),
    Route("GET", "/v1/plans", "plans", "Every plan kept", shapes.PlansView),
    Route("POST", "/v1/plans", "submit", "Submit a plan", Accepted, 201, PLAN_BODY),
    Route("GET", "/v1/plans/{id}", "plan", "A plan and its tasks", shapes.PlanView),
    Route(
        "POST",
        "/v1/plans/{id}/message",
        "message",
        "A message to a plan's coordinator session",
        Sent,
        body=Text,
    ),
    Route("GET", "/v1/lanes", "lanes", "Every live lane", shapes.LanesView),
    Route(
        "GET",
        "/v1/lanes/{lane}/logs",
        "logs",
        "A lane's transcript",
        Logs,
        query=(("after", "rows after this seq"), ("limit", "at most this many, 1..10000")),
    ),
    Route("POST", "/v1/lanes/{lane}/cancel", "cancel", "Cancel a lane", Cancelled),
    *(
        Route(
            "POST",
            f"/v1/lanes/{{lane}}/{verb}",
            "respond",
            f"Answer a lane's question: {verb}",
            shapes.RecordedView,
            body=AnswerBody,
        )
        for verb in VERDICTS
    ),
    Route(
        "POST",
        "/v1/children/{name}/restart",
        "restart",
        "Restart a child",
        Restarted,
    ),
    Route(
        "POST",
        "/v1/reload",
        "reload",
        "Re-read the config",
        shapes.ReloadView,
        refused=shapes.ReloadView,
    ),
    Route(
        "POST",
        "/v1/rollovers",
        "rollover",
        "Roll a child, the shards or the whole tree over to a release",
        shapes.RolloverView,
        202,
        RolloverAsk,
    ),
    Route(
        "GET",
        "/v1/rollovers/{id}",
        "rollover_status",
        "A rollover's progress",
        shapes.RolloverView,
        query=(("after", "events after this seq"), ("wait", "hold up to this many s, 0..10")),
    ),
    Route(
        "POST",
        "/v1/tools/{tool}",
        "call",
        "Call a relayed tool (ctl call)",
        ToolValue,
        body=dict[str, str],
    ),
    Route(
        "GET",
        "/v1/events",
        "events",
        "The event log as server-sent events (Last-Event-ID resumes)",
        None,
        query=(
            ("since", "events after this seq"),
            ("plan", "only this plan's"),
            ("tail", "without since or Last-Event-ID: from the newest this many, 0..10000"),
            ("status", "also the status (event: status, no id) every this many s, 1..60"),
        ),
    ),
    Route("GET", "/v1/openapi.json", "openapi", "This document", None, public=True),
)
