"""The HTTP API (`web.api`, issue 23) against a real tree over real HTTP: tokens and roles,
the JSON shapes of `ctl --json`, an answer recorded as `token:NAME`, the event stream resumed
with `Last-Event-ID`, and bad requests refused without harm to the tree."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.protocol import frames as f
from orchestra_sup.web.routes import ROUTES
from tests.integration.harness import Tree, wait_until
from tests.integration.test_cli import assert_one_line_error
from tests.integration.test_hitl_ctl import APPROVE_PLAN
from tests.integration.test_hitl_ctl import ctl as ctl_cli

pytestmark = pytest.mark.integration


def token(state: Path, name: str, role: str = "operate") -> str:
    argv = [sys.executable, "-m", "orchestra_sup", "keys", "init", "--state-dir", str(state)]
    made = subprocess.run(
        [*argv, "--http-token", name, "--role", role, "--json"], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["token"])


class Http:
    """Requests to one tree's API with one token (None: none)."""

    def __init__(self, url: str, bearer: str | None) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.bearer = bearer

    def call(
        self, method: str, path: str, body: bytes | None = None, **headers: str
    ) -> tuple[int, Any, dict[str, str]]:
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if self.bearer is not None:
            request.add_header("Authorization", f"Bearer {self.bearer}")
        for name, value in headers.items():
            request.add_header(name.replace("_", "-"), value)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, json.loads(reply.read()), dict(reply.headers)
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read()), dict(refused.headers)


@pytest.fixture
def api(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> tuple[Tree, str, str]:
    """A tree serving the API on a free loopback port, and an operate and a read token."""
    state = tmp_path / "state"
    ops, viewer = token(state, "ops"), token(state, "viewer", "read")
    tree = tree_factory(workspace=repo, shards=1, extra_args=["--http", "127.0.0.1:0"])
    assert tree.state_dir == state
    return tree, ops, viewer


def test_no_token_no_tree(api: tuple[Tree, str, str]) -> None:
    """Without a valid bearer token: 401, a JSON error, nothing about the tree."""
    tree, ops, _ = api
    url = tree.status().http_url
    assert url.startswith("http://127.0.0.1:")
    for bearer in (None, "osup_ops_" + "x" * 43, ops[:-1]):
        status, body, headers = Http(url, bearer).call("GET", "/v1/status")
        assert status == 401 and body["error"]["code"] == "unauthorized", body
        assert headers["WWW-Authenticate"] == "Bearer"
        assert "children" not in json.dumps(body)
        assert headers["X-Content-Type-Options"] == "nosniff"


def test_the_read_role_sees_and_changes_nothing(api: tuple[Tree, str, str], tmp_path: Path) -> None:
    tree, _, viewer = api
    http = Http(tree.status().http_url, viewer)
    status, body, headers = http.call("GET", "/v1/status")
    assert status == 200 and headers["X-Frame-Options"] == "DENY"
    shown = json.loads(ctl_cli(tree, "status", "--json").stdout)
    assert body.keys() == shown.keys() and body["supervisor"].keys() == shown["supervisor"].keys()
    assert [c["name"] for c in body["children"]] == [c["name"] for c in shown["children"]]
    status, body, _ = http.call("GET", "/v1/tree")
    assert status == 200 and body["name"] == "root"
    assert http.call("GET", "/v1/whoami")[:2] == (200, {"name": "viewer", "role": "read"})
    assert Http(tree.status().http_url, None).call("GET", "/v1/whoami")[0] == 401
    status, body, _ = http.call(
        "POST", "/v1/plans", b'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n'
    )
    assert status == 403 and body["error"]["code"] == "forbidden"
    before = [(c.pid, c.generation) for c in tree.status().children]
    for route in ROUTES:  # every route that changes the tree, with any parameters
        if route.operate:
            path = re.sub(r"{(\w+)}", "shard-0", route.path)
            status, body, _ = http.call(route.method, path, b"{}")
            assert status == 403 and body["error"]["code"] == "forbidden", (path, body)
    assert [(c.pid, c.generation) for c in tree.status().children] == before
    status, body, _ = http.call("GET", "/v1/plans")
    assert status == 200 and body == {"plans": []}


def test_an_operator_submits_answers_and_follows_events(
    api: tuple[Tree, str, str], tmp_path: Path
) -> None:
    """Submit (TOML and JSON), a plan's report in `ctl plan --json`'s shape, an approval over
    HTTP recorded as `token:ops`, and the event stream resumed from `Last-Event-ID`."""
    tree, ops, _ = api
    http = Http(tree.status().http_url, ops)
    status, body, _ = http.call("POST", "/v1/plans", APPROVE_PLAN.encode())
    assert status == 201, body
    plan_id = body["id"]

    def waiting() -> dict[str, Any] | None:
        lanes = http.call("GET", "/v1/lanes")[1]["lanes"]
        return next((x for x in lanes if x["plan"] == plan_id), None)

    entry = wait_until(waiting, 20, "the task to wait for approval")
    assert isinstance(entry, dict) and entry["state"] == "awaiting_approval"
    lane = entry["lane"]
    status, body, _ = http.call("POST", f"/v1/lanes/{lane}/approve", b'{"text": "ship it"}')
    assert status == 200 and body["plan"] == plan_id, body
    report = tree.wait_plan(plan_id, 30)
    assert report.ok
    (answer,) = report.tasks[0].answers
    assert (answer.responder, answer.uid, answer.text) == ("token:ops", -1, "ship it")
    status, body, _ = http.call("GET", f"/v1/plans/{plan_id}")
    assert status == 200 and body == json.loads(ctl_cli(tree, "plan", plan_id, "--json").stdout)

    spec = {"name": "j", "task": [{"id": "a", "run": "echo json"}]}
    status, body, _ = http.call(
        "POST", "/v1/plans", json.dumps(spec).encode(), Content_Type="application/json"
    )
    assert status == 201, body
    assert tree.wait_plan(body["id"], 30).ok

    log = [json.loads(x) for x in ctl_cli(tree, "events", "--json").stdout.splitlines()]
    answered = next(e for e in log if e["kind"] == "hitl.answered")
    assert answered["who"] == "token:ops (uid -1)"
    asked = next(e for e in log if e["kind"] == "task.awaiting_approval")
    assert asked["lane"] == lane  # a client answers it from the event alone
    resume = log[len(log) // 2]["seq"]
    got = sse(http, resume, count=5)
    assert [e["seq"] for e in got] == list(range(resume + 1, resume + 6))
    assert got == log[len(log) // 2 + 1 : len(log) // 2 + 6]


def sse(http: Http, last_id: int, count: int) -> list[dict[str, Any]]:
    """The first `count` events of `GET /v1/events` sent `Last-Event-ID: last_id`."""
    request = urllib.request.Request(http.url + "/v1/events")
    request.add_header("Authorization", f"Bearer {http.bearer}")
    request.add_header("Last-Event-ID", str(last_id))
    events: list[dict[str, Any]] = []
    with urllib.request.urlopen(request, timeout=30) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        seq = None
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["seq"] == seq
                events.append(event)
                if len(events) == count:
                    break
    return events


def messages(http: Http, path: str, **headers: str) -> Iterator[tuple[float, dict[str, str]]]:
    """Each server-sent message of `GET path` as it arrives: (monotonic seconds, its fields,
    "id", "event" and "data", as sent)."""
    request = urllib.request.Request(http.url + path)
    request.add_header("Authorization", f"Bearer {http.bearer}")
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    with urllib.request.urlopen(request, timeout=30) as stream:
        fields: dict[str, str] = {}
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line:
                name, _, value = line.partition(": ")
                assert name not in fields, (name, fields)
                fields[name] = value
            elif fields:
                yield time.monotonic(), fields
                fields = {}


def test_the_event_stream_carries_the_status_too(api: tuple[Tree, str, str]) -> None:
    """`?status=S`: the `/v1/status` object as `event: status` with no `id:` when the stream
    opens and every S seconds on, between events whose ids go on from `Last-Event-ID` with no
    gap; S out of 1..60 or not a number is a 400."""
    tree, ops, _ = api
    http = Http(tree.status().http_url, ops)
    for bad in ("0.5", "61", "nan", "inf", "-1", "two", "", "1" * 30):
        status, body, _ = http.call("GET", f"/v1/events?status={bad}")
        assert status == 400 and body["error"]["code"] == "bad_request", (bad, body)
    plan_id = http.call("POST", "/v1/plans", b'name = "s"\n[[task]]\nid = "a"\nrun = "true"\n')
    assert tree.wait_plan(plan_id[1]["id"], 30).ok
    log = [json.loads(x) for x in ctl_cli(tree, "events", "--json").stdout.splitlines()]
    resume = log[2]["seq"]
    shown = json.loads(ctl_cli(tree, "status", "--json").stdout)
    got: list[tuple[float, dict[str, str]]] = []
    seen = False  # the newest event of `log` came
    for when, fields in messages(http, "/v1/events?status=1", Last_Event_ID=str(resume)):
        got.append((when, fields))
        seen = seen or fields.get("id") == str(log[-1]["seq"])
        if seen and sum(m["event"] == "status" for _, m in got) >= 3:
            break
    statuses = [(when, m) for when, m in got if m["event"] == "status"]
    events = [m for _, m in got if m["event"] != "status"]
    assert got[0][1]["event"] == "status"
    assert all(m.keys() == {"event", "data"} for _, m in statuses)
    for _, m in statuses:
        body = json.loads(m["data"])
        assert body.keys() == shown.keys() and body["supervisor"]["pid"] == tree.proc.pid
        assert [c["name"] for c in body["children"]] == [c["name"] for c in shown["children"]]
    assert [int(m["id"]) for m in events] == list(range(resume + 1, resume + 1 + len(events)))
    assert [json.loads(m["data"]) for m in events][: len(log) - 3] == log[3:]
    apart = [b[0] - a[0] for a, b in itertools.pairwise(statuses)]
    assert all(gap >= 0.9 for gap in apart), apart


def test_a_new_stream_can_start_at_the_newest_events(api: tuple[Tree, str, str]) -> None:
    """`?tail=N` with neither `since` nor `Last-Event-ID` starts at the newest N events, not
    at the oldest kept (a page opened on a tree of 30 days of log); with `Last-Event-ID` the
    stream resumes there, tail or not."""
    tree, ops, _ = api
    http = Http(tree.status().http_url, ops)
    plan_id = http.call("POST", "/v1/plans", b'name = "t"\n[[task]]\nid = "a"\nrun = "true"\n')
    assert tree.wait_plan(plan_id[1]["id"], 30).ok
    log = [json.loads(x) for x in ctl_cli(tree, "events", "--json").stdout.splitlines()]
    assert len(log) > 5
    first = next(messages(http, "/v1/events?tail=3"))[1]
    assert int(first["id"]) == log[-3]["seq"]
    resumed = next(messages(http, "/v1/events?tail=3", Last_Event_ID=str(log[0]["seq"])))[1]
    assert int(resumed["id"]) == log[1]["seq"]
    assert http.call("GET", "/v1/events?tail=x")[0] == 400


def test_the_console_is_served_without_a_token(api: tuple[Tree, str, str]) -> None:
    """The console's page and files hold nothing about the tree: no token needed, the same
    security headers, each with its media type; any other file is a 404 and `/v1` still needs
    the token."""
    tree, _, _ = api
    root = Http(tree.status().http_url, None).url
    for path, media in (
        ("/", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
        ("/console/icon.svg", "image/svg+xml"),
    ):
        with urllib.request.urlopen(root + path, timeout=30) as reply:
            assert reply.status == 200 and reply.headers["Content-Type"].startswith(media)
            assert reply.headers["Content-Security-Policy"].startswith("default-src 'self'")
            assert reply.headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/console/index.html", "/console/..%2Fapi.py", "/console/nope.js"):
        assert Http(root, None).call("GET", path)[0] == 404, path
    assert Http(root, None).call("GET", "/v1/status")[0] == 401


def test_bad_requests_are_refused_and_the_tree_goes_on(api: tuple[Tree, str, str]) -> None:
    tree, ops, _ = api
    http = Http(tree.status().http_url, ops)
    for body, code in (
        (b"\xff\xfe not a plan", 400),
        (b'name = "p"\n[[task]]\nid = "a"\nrun = 3\n', 400),
        (b"[1, 2]", 400),
        (b"x" * (2 << 20), 413),
    ):
        status, reply, _ = http.call("POST", "/v1/plans", body)
        assert status == code and "code" in reply["error"], (status, reply)
    status, reply, _ = http.call("POST", "/v1/lanes/nolane/approve", b"{nope")
    assert status == 400
    for body, named in ((b'{"txt": "typo"}', "txt"), (b'{"retries": -1}', "retries")):
        status, reply, _ = http.call("POST", "/v1/lanes/nolane/reject", body)
        assert status == 400 and named in reply["error"]["message"], reply
    status, reply, _ = http.call("POST", "/v1/plans", b'{"name": "j", "task": [{"id": 3}]}')
    assert status == 400 and "JSON" not in reply["error"]["message"], reply  # read as JSON
    status, reply, _ = http.call("POST", "/v1/lanes/nolane/approve")
    assert status == 404 and reply["error"]["code"] == "not_found"
    status, reply, _ = http.call("POST", "/v1/lanes/nolane/explode")
    assert status == 404
    status, reply, _ = http.call("GET", "/v1/nowhere")
    assert status == 404 and reply["error"]["code"] == "not_found"
    for last_id in ("-3", "9" * 5000):
        status, reply, _ = http.call("GET", "/v1/events", Last_Event_ID=last_id)
        assert status == 400, reply
    nested = b"[" * 100_000
    for path in ("/v1/plans", "/v1/tools/stat", "/v1/lanes/x/approve"):
        status, reply, _ = http.call("POST", path, nested, Content_Type="application/json")
        assert status == 400, (path, reply)
    huge = b'name = "p"\n[[task]]\nid = "a"\nrun = "true"\ntimeout_s = 1' + b"0" * 400 + b"\n"
    assert http.call("POST", "/v1/plans", huge)[0] == 400
    assert http.call("GET", "/v1/status")[0] == 200
    status = tree.status()
    assert isinstance(status, f.StatusReply) and status.internal_errors == 0


def test_a_non_loopback_address_is_refused_at_start(tree: Tree, tmp_path: Path) -> None:
    """Serving beyond this machine without a certificate and key: one line, exit 2."""
    argv = [sys.executable, "-m", "orchestra_sup", "start", "--state-dir", str(tmp_path / "s")]
    argv += ["--run-dir", str(tmp_path / "r"), "--http", "0.0.0.0:8080"]
    started = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert_one_line_error(started, 2, "--http", "loopback", "TLS")


def test_the_rest_of_ctl_over_http(api: tuple[Tree, str, str]) -> None:
    """A lane's transcript, a relayed tool, a restart, a reload and a message, each as its ctl
    command answers it; a read token may read the transcript and nothing else here."""
    tree, ops, viewer = api
    http, reader = Http(tree.status().http_url, ops), Http(tree.status().http_url, viewer)
    plan = b'name = "say"\n[[task]]\nid = "a"\nrun = "echo hi-http"\n'
    plan_id = http.call("POST", "/v1/plans", plan)[1]["id"]
    report = tree.wait_plan(plan_id, 30)
    lane = report.tasks[0].lane
    status, body, _ = reader.call("GET", f"/v1/lanes/{lane}/logs")
    assert status == 200 and body["done"] is True, body
    assert "hi-http\n" in [r["data"] for r in body["rows"] if r["stream"] == "stdout"]
    assert http.call("GET", "/v1/lanes/nolane/logs")[0] == 404

    status, body, _ = http.call("POST", "/v1/tools/stat", b'{"path": "README"}')
    assert status == 200 and body["value"]["type"] == "file", body
    assert http.call("POST", "/v1/tools/stat", b'{"path": 3}')[0] == 400
    assert reader.call("POST", "/v1/tools/stat", b'{"path": "README"}')[0] == 403

    before = tree.child("shard-0").generation
    status, body, _ = http.call("POST", "/v1/children/shard-0/restart")
    assert status == 200 and body == {"restarted": "shard-0"}
    assert tree.child("shard-0").generation == before + 1
    assert http.call("POST", "/v1/children/nochild/restart")[0] == 404

    status, body, _ = http.call("POST", "/v1/reload")
    assert status == 200 and body["config"] == "", body  # started without --config
    status, body, _ = http.call("POST", f"/v1/plans/{plan_id}/message", b'{"text": "hello"}')
    assert status in (400, 404), body  # a plan that is no session takes no message
    assert http.call("POST", f"/v1/plans/{plan_id}/message")[0] == 400


def test_an_approval_over_http_grants_retries_as_ctl_does(api: tuple[Tree, str, str]) -> None:
    """A task that failed with no retry left is approved over HTTP with `{"retries": 1}` (as
    `ctl approve --retries 1`), and runs once more; without retries the approval is refused."""
    tree, ops, _ = api
    http = Http(tree.status().http_url, ops)
    plan = b'name = "f"\n[[task]]\nid = "flaky"\nrun = "exit 3"\non_failure = "pause"\n'
    plan_id = http.call("POST", "/v1/plans", plan)[1]["id"]

    def paused(attempts: int) -> str | None:
        lanes = http.call("GET", "/v1/lanes")[1]["lanes"]
        waiting = [x for x in lanes if x["plan"] == plan_id and x["state"] == "awaiting_approval"]
        if (
            waiting
            and http.call("GET", f"/v1/plans/{plan_id}")[1]["tasks"][0]["attempts"] == attempts
        ):
            return str(waiting[0]["lane"])
        return None

    lane = wait_until(lambda: paused(1), 30, "the failed attempt to pause")
    status, body, _ = http.call("POST", f"/v1/lanes/{lane}/approve", b"{}")
    assert status == 400 and "retries" in body["error"]["message"], body
    status, body, _ = http.call("POST", f"/v1/lanes/{lane}/approve", b'{"retries": 1}')
    assert status == 200, body
    lane = wait_until(lambda: paused(2), 30, "the granted attempt to fail and pause again")
    assert http.call("POST", f"/v1/lanes/{lane}/accept-partial", b"{}")[0] == 200
    report = tree.wait_plan(plan_id, 30)
    assert report.tasks[0].attempts == 2
    assert [a.responder for a in report.tasks[0].answers] == ["token:ops", "token:ops"]
