"""The HTTP API's OpenAPI 3.1 document, served at `GET /v1/openapi.json`: generated from the
route table (`web.routes.ROUTES`) and the msgspec types the answers are built through
(`protocol.shapes`, `web.routes`), so it says what the server does (issue 23)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from orchestra_sup.protocol import shapes
from orchestra_sup.release import INSTALLED_VERSION
from orchestra_sup.web.routes import PLAN_BODY, ROUTES, ErrorBody, Route

REF = "#/components/schemas/{name}"
QUERY = {
    "since": "integer",
    "after": "integer",
    "limit": "integer",
    "tail": "integer",
    "plan": "string",
    "wait": "number",
    "status": "number",
}
"""The JSON type of each query parameter a route takes (`Route.query`)."""
ERRORS = {
    "400": "A malformed request (bad_request)",
    "401": "No valid bearer token (unauthorized); nothing about the tree",
    "403": "A read token asked to change something (forbidden)",
    "404": "No such path, plan, lane or child (not_found)",
    "405": "A method the path does not take (bad_request)",
    "409": "A conflict with the tree's state (conflict, version_skew, fenced)",
    "413": "A body over 1 MiB (too_large)",
    "503": "The tree is busy or a child is down (busy, peer_down, shard_full)",
    "504": "The request or the tree's answer took too long (timeout)",
    "507": "The state disk is below its reserve (state_degraded)",
}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of `ROUTES`, as plain values."""
    answers = [r.answer for r in ROUTES if r.answer is not None]
    bodies = [r.body for r in ROUTES if r.body is not None and r.body != PLAN_BODY]
    schemas, components = msgspec.json.schema_components(
        [*answers, *bodies, ErrorBody, shapes.EventView], ref_template=REF
    )
    named = dict(zip([*answers, *bodies], schemas, strict=False))
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, named)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "orchestra-sup",
            "version": INSTALLED_VERSION,
            "description": "The supervision tree over HTTP: what `orchestra-sup ctl` does, as "
            "JSON with the shapes of `ctl --json`. Every request but for this document "
            "carries `Authorization: Bearer <token>` (`orchestra-sup keys init --http-token "
            "NAME`).",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(route: Route, named: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorBody")}}}}
    responses: dict[str, Any] = {}
    if route.answer is not None:
        responses[str(route.status)] = {
            "description": route.summary,
            "content": {"application/json": {"schema": named[route.answer]}},
        }
    elif route.handler == "events":
        event = {"$ref": REF.format(name="Event")}
        status = {"$ref": REF.format(name="StatusView")}
        responses["200"] = {
            "description": "`text/event-stream`: each event `id: <seq>`, `event: <kind>`, "
            "`data: <Event as JSON>`; with ?status=, also `event: status` with no `id:` and "
            "`data: <StatusView as JSON>`; a comment line every 15 s of silence",
            "content": {"text/event-stream": {"schema": {"oneOf": [event, status]}}},
        }
    else:
        responses["200"] = {"description": route.summary, "content": {"application/json": {}}}
    for code, why in ERRORS.items():
        if (code == "403" and not route.operate) or (code == "401" and route.public):
            continue
        responses[code] = {"description": why, **error}
    responses["503"]["headers"] = {
        "Retry-After": {
            "description": "seconds, on a connection over the bound",
            "schema": {"type": "integer"},
        }
    }
    if route.refused is not None:
        responses["409"] = {
            "description": "Refused: nothing was applied",
            "content": {"application/json": {"schema": named[route.refused]}},
        }
    if route.status == 202:
        responses["202"]["headers"] = {
            "Location": {"description": "where to follow it", "schema": {"type": "string"}}
        }
    operation: dict[str, Any] = {
        "operationId": route.handler
        if route.handler != "respond"
        else route.path.rsplit("/", 1)[1].replace("-", "_"),
        "summary": route.summary,
        "description": "Needs an `operate` token."
        if route.operate
        else "No token needed."
        if route.public
        else "Any token.",
        "responses": responses,
    }
    if route.public:
        operation["security"] = []
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", route.path)
    ] + [
        {"name": name, "in": "query", "description": what, "schema": {"type": QUERY[name]}}
        for name, what in route.query
    ]
    if route.handler == "events":
        resume = "resume after this seq (as ?since=; what an EventSource sends)"
        parameters.append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "description": resume,
                "schema": {"type": "integer"},
            }
        )
    if parameters:
        operation["parameters"] = parameters
    if route.body == PLAN_BODY:
        plan = {"type": "object", "description": "The plan file's tables (README, Plans)"}
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/toml": {"schema": {"type": "string"}},
                "application/json": {"schema": plan},
            },
        }
    elif route.body is not None:
        operation["requestBody"] = {
            "required": route.handler == "rollover",
            "content": {"application/json": {"schema": named[route.body]}},
        }
    return operation
