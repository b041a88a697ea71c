"""The HTTP API's OpenAPI document (`web.openapi`, issue 23) against a real tree: a valid
OpenAPI 3.1 document, served without a token, and every path in it answered by the server
with a body of exactly the type the document names (`web.routes.ROUTES`): the document
cannot say one thing while the server does another."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from openapi_spec_validator import validate

from orchestra_sup.protocol import shapes
from orchestra_sup.web.routes import ROUTES, ErrorBody, Route
from tests.integration.harness import Tree, wait_until
from tests.integration.test_hitl_ctl import APPROVE_PLAN
from tests.integration.test_http_api import Http, api, sse

pytestmark = pytest.mark.integration
__all__ = ["api"]  # the fixture, used by name


def checked(route: Route, status: int, body: Any) -> Any:
    """`body` converted to `route`'s answer type (unknown or missing fields fail)."""
    assert status == route.status, (route.path, status, body)
    assert route.answer is not None
    return msgspec.convert(body, route.answer)


def test_every_documented_path_answers_the_documented_type(api: tuple[Tree, str, str]) -> None:
    """The document is valid OpenAPI 3.1 and needs no token; each route answers its type;
    each refusal is an `ErrorBody`; a rollover over HTTP may not name a release that is not
    in [http] releases."""
    tree, ops, _ = api
    url = tree.status().http_url
    http, anonymous = Http(url, ops), Http(url, None)
    status, document, _ = anonymous.call("GET", "/v1/openapi.json")
    assert status == 200
    validate(document)
    assert document["paths"]["/v1/openapi.json"]["get"]["security"] == []  # served so
    refused = document["paths"]["/v1/reload"]["post"]["responses"]["409"]
    assert refused["content"]["application/json"]["schema"]["$ref"].endswith("/Reload")
    served = {(m.upper(), p) for p, ops_ in document["paths"].items() for m in ops_}
    assert served == {(r.method, r.path) for r in ROUTES}

    route = {(r.method, r.path): r for r in ROUTES}

    def call(method: str, path: str, pattern: str, body: bytes | None = None) -> Any:
        status, answer, _ = http.call(method, path, body)
        return checked(route[(method, pattern)], status, answer)

    call("GET", "/v1/status", "/v1/status")
    tree_view = call("GET", "/v1/tree", "/v1/tree")
    assert tree_view.children and tree_view.hosts == []
    assert call("GET", "/v1/whoami", "/v1/whoami").name == "ops"
    plan_id = call("POST", "/v1/plans", "/v1/plans", APPROVE_PLAN.encode()).id
    call("GET", "/v1/plans", "/v1/plans")

    def waiting() -> str | None:
        lanes = call("GET", "/v1/lanes", "/v1/lanes").lanes
        return next((x.lane for x in lanes if x.state == "awaiting_approval"), None)

    lane = wait_until(waiting, 20, "the task to wait for approval")
    answered = call("POST", f"/v1/lanes/{lane}/approve", "/v1/lanes/{lane}/approve", b"{}")
    assert answered.plan == plan_id
    tree.wait_plan(plan_id, 30)
    call("GET", f"/v1/lanes/{lane}/logs", "/v1/lanes/{lane}/logs")
    assert call("GET", f"/v1/plans/{plan_id}", "/v1/plans/{id}").ok
    second = call("POST", "/v1/plans", "/v1/plans", APPROVE_PLAN.encode()).id
    lane = wait_until(waiting, 20, "the second task to wait for approval")
    call("POST", f"/v1/lanes/{lane}/cancel", "/v1/lanes/{lane}/cancel")
    tree.wait_plan(second, 30)
    call("POST", "/v1/tools/stat", "/v1/tools/{tool}", b'{"path": "README"}')
    call("POST", "/v1/children/shard-0/restart", "/v1/children/{name}/restart")
    call("POST", "/v1/reload", "/v1/reload")

    status, refused, _ = http.call(
        "POST", "/v1/rollovers", b'{"target": "shard-0", "release": "/bin/sh"}'
    )
    assert status == 403 and "[http] releases" in msgspec.convert(refused, ErrorBody).error.message
    rollover = call("POST", "/v1/rollovers", "/v1/rollovers", b'{"target": "shard-0"}')
    assert rollover.target == "shard-0"

    def done() -> bool:
        status, report, _ = http.call("GET", f"/v1/rollovers/{rollover.id}?wait=2")
        return bool(checked(route[("GET", "/v1/rollovers/{id}")], status, report).done)

    wait_until(done, 60, "the rollover of shard-0 to end")

    for event in sse(http, 0, count=5):
        msgspec.convert(event, shapes.EventView)
    for method, path, body in (
        ("GET", "/v1/plans/nope", None),
        ("POST", "/v1/plans/nope/message", b'{"text": "x"}'),
        ("GET", "/v1/rollovers/nope", None),
        ("POST", "/v1/rollovers", b"[]"),
        ("GET", "/v1/rollovers/x?wait=11", None),
    ):
        status, refused, _ = http.call(method, path, body)
        assert status >= 400, (path, refused)
        msgspec.convert(refused, ErrorBody)
    status, refused, _ = anonymous.call("GET", "/v1/status")
    assert status == 401 and msgspec.convert(refused, ErrorBody).error.code == "unauthorized"


def test_the_document_is_the_one_the_server_serves(api: tuple[Tree, str, str], repo: Path) -> None:
    """The served document is `web.openapi.document()` of this code, as a file would hold it."""
    from orchestra_sup.web.openapi import document

    tree, _, _ = api
    status, served, _ = Http(tree.status().http_url, None).call("GET", "/v1/openapi.json")
    assert status == 200 and served == json.loads(json.dumps(document()))
