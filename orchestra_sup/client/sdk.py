"""The Python SDK's blocking client, `orchestra_sup.Client`: a program drives a running tree as
`orchestra-sup ctl` drives it from a shell.

Each method sends the request its ctl command sends and returns what that command's `--json`
prints, as plain values (dicts, lists, strings). It raises the typed errors ctl turns into its
exit statuses (`cli/exits.py`), never a bare `Exception`:

- `ConfigError` (and its `PlanError`): bad input, found before anything is sent (ctl: exit 2).
- `TreeUnreachable`: no live tree owns the run directory, the tree did not answer within the
  client's `timeout_s`, or a remote tree refused the CURVE handshake (exit 3).
- `TreeBusy`: the tree takes no new ctl connection now (its supervisor is near its open-file
  limit); try again shortly (exit 1).
- `RemoteError`: the tree refused the request; its `code` (`ErrorCode`) says why. ctl exits 2
  for `bad_request`, `not_found`, `path_escape`, `version_skew` and `too_large`, 1 for others
  (`peer_down`: the coordinator is restarting; `timeout`, `busy`, `internal`...).
- `WaitTimeout` (a `CallTimeout`): `wait` gave up at its own deadline; the plan runs on (exit 1).
- `ProtocolError`: the tree answered with a frame of the wrong kind (exit 1).

`ValueError` is for a misuse ctl cannot make: a message over `frames.MESSAGE_MAX_BYTES`, or a
call on a closed client.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import msgspec

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.events import read_events
from orchestra_sup.client.grant import parse_grant
from orchestra_sup.coordinator.plan import load_plan, plan_from_mapping, validate_plan
from orchestra_sup.errors import (
    ConfigError,
    ErrorCode,
    PlanError,
    ProtocolError,
    RemoteError,
    TreeUnreachable,
    WaitTimeout,
)
from orchestra_sup.paths import default_run_dir
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes
from orchestra_sup.protocol.keys import ClientKeys
from orchestra_sup.protocol.tools import call_params

A = TypeVar("A", bound=f.Frame)

DEFAULT_TIMEOUT_S = 10.0
"""Seconds one exchange with the tree may take (ctl's `--timeout` default)."""
CALL_TIMEOUT_S = 60.0
"""Seconds a tool call may take (`ctl call`'s `--timeout` default)."""
WAIT_POLL_S = 5.0
"""Seconds the coordinator holds one long poll of `wait` (as `ctl plan --wait`)."""
MAX_RETRIES = 100
"""The most retries one approval adds (`ctl approve --retries`, 0 to 100)."""

Verdict = Literal["approve", "reject", "redirect", "accept_partial"]
"""A human's answer to a pause, as `frames.CtlRespond.verdict` carries it."""

Plan = str | os.PathLike[str] | Mapping[str, Any] | f.PlanSpec
"""What `submit` takes: a plan file's path, a dict shaped like a plan file's TOML, or a
`PlanSpec`."""


def plan_spec(plan: Plan) -> f.PlanSpec:
    """`plan` checked exactly as `ctl submit` checks a file (`coordinator.plan`): a path is read
    and parsed (`load_plan`), a mapping taken as the file's TOML would give it
    (`plan_from_mapping`; keys "name", "task" (a list of task tables), "tenant", "budget",
    "strategy", "replan"), a `PlanSpec` validated (`validate_plan`). Raises `PlanError`: the
    file is unreadable, the plan is invalid, or `plan` is none of these."""
    if isinstance(plan, f.PlanSpec):
        return validate_plan(plan)
    if isinstance(plan, Mapping):
        return plan_from_mapping(dict(plan), source="<plan dict>")
    if isinstance(plan, str | os.PathLike):
        return load_plan(Path(plan))
    raise PlanError(f"a plan is a file's path, a dict or a PlanSpec, not {type(plan).__name__}")


def wire_value(key: str, value: object) -> str:
    """One tool parameter as the wire carries it (`frames.CtlCall.params` are strings): a bool
    "true" or "false", an int or float as `str` gives it, a list or tuple of those
    comma-joined (`requires=["gpu", "x86"]` -> "gpu,x86"), a path-like as its path, bytes
    through `os.fsdecode` (a `path` that is not UTF-8 then goes as `path_b64`, as ctl sends
    it). Raises `ConfigError` for any other type, or a list item that holds a comma."""
    if not isinstance(value, list | tuple):
        return _scalar(key, value)
    items = [_scalar(key, item) for item in value]
    if any("," in item for item in items):
        raise ConfigError(f"parameter {key}: a list item holds a comma, the list separator")
    return ",".join(items)


def _scalar(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | os.PathLike):
        return os.fsdecode(value)
    raise ConfigError(
        f"parameter {key}: a {type(value).__name__} cannot be sent (give a str, int, float, "
        "bool, path, bytes, a list of them, or None to leave it out)"
    )


def wire_params(params: Mapping[str, object]) -> dict[str, str]:
    """`params` as `ctl call KEY=VALUE...` sends them (`protocol.tools.call_params`), each
    value through `wire_value`; a None value is left out. Raises `ConfigError` for a value
    `wire_value` refuses, a key that is empty or holds "=", or a value that is not UTF-8
    (only `path` may name any bytes)."""
    items = []
    for key, value in params.items():
        if not key or "=" in key:
            raise ConfigError(f"parameter name {key!r}: not empty, no '='")
        if value is not None:
            items.append(f"{key}={wire_value(key, value)}")
    try:
        return call_params(items)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def message_request(plan_id: str, text: str) -> f.CtlMessage:
    """The `CtlMessage` that sends `text` to plan `plan_id`'s session. Raises `ValueError` when
    `text` is over `frames.MESSAGE_MAX_BYTES` bytes of UTF-8 (nothing is sent)."""
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > f.MESSAGE_MAX_BYTES:
        raise ValueError(
            f"the message is {size} bytes of UTF-8, over the {f.MESSAGE_MAX_BYTES} a plan takes"
        )
    return f.CtlMessage(plan=plan_id, text=text)


def grant_budget(grant: str | Mapping[str, float] | None) -> f.Budget | None:
    """An approval's grant: `ctl approve --grant`'s text ("wall_s=60,cpu_s=10") or a mapping
    of the same keys (`client.grant.GRANT_KEYS`: seconds, seconds, bytes). Raises `ConfigError`
    as `parse_grant` does (an unknown key, a value not positive and finite)."""
    if grant is None:
        return None
    if isinstance(grant, Mapping):
        grant = ",".join(f"{key}={value}" for key, value in grant.items())
    return parse_grant(grant)


def checked_endpoint(connect: str | None, keys: ClientKeys | None) -> None:
    """What ctl checks of `--connect` and `--keys` before it connects. Raises `ConfigError`:
    `connect` is not `tcp://HOST:PORT`, it has no `keys`, or `keys` come without `connect`."""
    if connect is None:
        if keys is not None:
            raise ConfigError("keys are for connect; give both or neither")
        return
    if not connect.startswith("tcp://"):
        raise ConfigError(f"connect {connect}: give a tcp://HOST:PORT address")
    if keys is None:
        raise ConfigError(f"connect {connect}: a tcp:// endpoint needs keys")


def checked_seconds(name: str, value: float) -> float:
    """`value`, a timeout in seconds. Raises `ConfigError` when it is not positive and finite."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={value!r}: give a positive number of seconds")
    return float(value)


class PlanWait:
    """One wait for plan `plan_id`'s final report: the long polls it is made of, each held
    `WAIT_POLL_S` seconds at most, none past `timeout_s` seconds from now (None: no end)."""

    def __init__(self, plan_id: str, timeout_s: float | None):
        self.plan_id = plan_id
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def next_poll_s(self) -> float:
        """Seconds the next long poll may hold. Raises `WaitTimeout` (a `CallTimeout`) once the
        deadline passed."""
        if self.deadline is None:
            return WAIT_POLL_S
        left = self.deadline - time.monotonic()
        if left <= 0:
            assert self.timeout_s is not None
            raise WaitTimeout(self.plan_id, self.timeout_s)
        return min(WAIT_POLL_S, left)


class ClientOptions:
    """Where a client reaches its tree and how long it waits: the constructor of `Client` and
    `AsyncClient`. Nothing connects until a call does.

    `run_dir` (str or Path; default: as `ctl` finds it, `config.default_run_dir`: the
    environment's `ORCHESTRA_SUP_RUN_DIR`, `RUNTIME_DIRECTORY`, `XDG_RUNTIME_DIR`, else
    `/tmp/orchestra-sup-<uid>`) is the tree's run directory, reached on its `ctl.ipc`.
    `connect` (`tcp://HOST:PORT`) reaches a remote tree's CURVE ctl endpoint instead, as
    client `keys` (`protocol.keys.load_client_keys(DIR, NAME)`, as `ctl --keys DIR --key
    NAME`). `timeout_s` bounds each exchange (seconds, default 10), `call_timeout_s` a tool
    call (default 60), as ctl's `--timeout` does.

    Raises `ConfigError` (`checked_endpoint`, `checked_seconds`).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        connect: str | None = None,
        keys: ClientKeys | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ):
        checked_endpoint(connect, keys)
        self.timeout_s = checked_seconds("timeout_s", timeout_s)
        self.call_timeout_s = checked_seconds("call_timeout_s", call_timeout_s)
        self.run_dir = Path(run_dir if run_dir is not None else default_run_dir()).absolute()
        self.connect = connect
        self.keys = keys
        self.closed = False


class Client(ClientOptions):
    """A blocking client of one tree (arguments: `ClientOptions`); see the module docstring
    for what each error means.

    It connects (one ZeroMQ socket) at its first call and keeps the connection until `close`,
    or the end of a `with` block, but for a call that raises `TreeUnreachable`: the next one
    connects again, so a tree that stopped is reported as gone, not as silent. It is not for
    sharing between threads (make one per thread, or use `AsyncClient`).

    Every call raises `TreeUnreachable` when no live tree owns `run_dir` (or a remote tree does
    not answer), `TreeBusy` when the tree takes no new connection now, and `ValueError` once
    the client is closed.
    """

    _ctl: CtlClient | None = None

    def close(self) -> None:
        """Close the connection and refuse further calls; calling it again does nothing."""
        self.closed = True
        self._disconnect()

    def _disconnect(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _ask(self, body: f.Body, timeout_s: float | None = None) -> f.Body:
        """`body` sent, its answer returned. Raises `ValueError` on a closed client, else as
        `CtlClient` does: `ConfigError`, `TreeUnreachable`, `TreeBusy`, `RemoteError`."""
        if self.closed:
            raise ValueError("the client is closed")
        if self._ctl is None:
            self._ctl = CtlClient(self.run_dir, connect=self.connect, keys=self.keys)
        try:
            return self._ctl.request(body, timeout_s=timeout_s or self.timeout_s)
        except TreeUnreachable:
            self._disconnect()
            raise

    def _expect(self, answer: type[A], body: f.Body, timeout_s: float | None = None) -> A:
        """`_ask`, the answer checked to be an `answer`; raises `ProtocolError` when not."""
        reply = self._ask(body, timeout_s)
        if not isinstance(reply, answer):
            raise ProtocolError(
                ErrorCode.UNEXPECTED,
                f"the tree answered {type(body).__name__} with {type(reply).__name__}, "
                f"not {answer.__name__}",
            )
        return reply

    # --- plans -----------------------------------------------------------------------------------

    def submit(self, plan: Plan) -> str:
        """Submit `plan` (see `plan_spec`), checked here first as `ctl submit` checks a file;
        returns its id (12 hex digits). Raises `PlanError` for a bad plan (nothing is sent),
        `RemoteError` when the coordinator refuses it (`bad_request`: e.g. a need no shard
        meets; `state_degraded`: its disk is full; `peer_down`: it is restarting)."""
        return self._expect(f.PlanAccepted, f.CtlSubmit(plan=plan_spec(plan))).id

    def plan(self, plan_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """Plan `plan_id`'s report, as `ctl plan ID --json` prints it: {"plan", "id", "done",
        "ok", "tasks": [{"id", "status", "lane", "shard", "exit_code", "output_tail", "error",
        ...}], "spent", "budget"}. With `wait_s` > 0 (seconds) the coordinator holds the answer
        until the plan is done or that long has passed (a long poll). Raises `ConfigError` for
        a negative `wait_s`, `RemoteError(not_found)` for an unknown plan."""
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise ConfigError(f"wait_s={wait_s!r}: give 0 or more seconds")
        body = f.CtlPlan(id=plan_id, wait_s=wait_s)
        return shapes.plan_json(self._expect(f.PlanReport, body, self.timeout_s + wait_s))

    def plans(self) -> list[dict[str, Any]]:
        """Every plan the coordinator holds, newest first, as `ctl plans --json`'s "plans":
        [{"id", "plan", "submitted_at" (Unix seconds), "done", "ok", "tasks": {status: n}}]."""
        return msgspec.to_builtins(self._expect(f.PlanList, f.CtlPlans()).plans)

    def wait(self, plan_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Plan `plan_id`'s final report (as `plan`, "done" true), long-polling as `ctl plan
        --wait` does. `timeout_s` (seconds; None: no end, as ctl) bounds the whole wait.
        Raises `CallTimeout` when it passes (the plan runs on), `RemoteError(not_found)` for an
        unknown plan, `TreeUnreachable` when one poll gets no answer."""
        polls = PlanWait(plan_id, timeout_s)
        while True:
            report = self.plan(plan_id, wait_s=polls.next_poll_s())
            if report["done"]:
                return report

    def message(self, plan_id: str, text: str) -> None:
        """Send `text` to the session that runs plan `plan_id` (`ctl message`). Raises
        `ValueError` for a text over 64 KiB of UTF-8 (nothing is sent), `RemoteError`:
        `not_found` for an unknown plan, `bad_request` for a plan whose coordinator takes no
        messages (the dag coordinator's)."""
        self._expect(f.Ack, message_request(plan_id, text))

    # --- humans' answers -------------------------------------------------------------------------

    def pending(self) -> list[dict[str, Any]]:
        """Every task that waits for a human, as `ctl lanes --json` lists it (state
        "awaiting_approval"): [{"lane", "task", "plan", "shard", "state", "sandbox",
        "question", "since" (Unix seconds), "accepts", "needs_retries"}]. Raises
        `RemoteError(peer_down)` when the coordinator did not answer (the shards' lanes alone
        cannot say what waits)."""
        lanes = self._expect(f.LaneList, f.CtlLanes())
        if "coordinator" in lanes.unanswered:
            raise RemoteError(
                ErrorCode.PEER_DOWN,
                "the coordinator did not answer: what waits for a human is not known; try "
                "again shortly",
            )
        waiting = [lane for lane in lanes.lanes if lane.state == "awaiting_approval"]
        return msgspec.to_builtins(waiting)

    def approve(
        self,
        lane: str,
        *,
        text: str = "",
        grant: str | Mapping[str, float] | None = None,
        retries: int = 0,
    ) -> dict[str, Any]:
        """Let the task that waits on `lane` go on (`ctl approve`), answering a program's
        question with `text`, adding `grant` to its budget (`grant_budget`: {"wall_s": s,
        "cpu_s": s, "output_bytes": n} or "wall_s=60,...") and `retries` (0 to 100) to its
        retry cap. Returns what was recorded: {"lane", "plan", "task", "outcome"}. Raises
        `ConfigError` for a bad grant or retries (nothing is sent), `RemoteError`:
        `not_found` when nothing waits on `lane`, `bad_request` for an answer the pause does
        not take."""
        if not 0 <= retries <= MAX_RETRIES:
            raise ConfigError(f"retries={retries}: give 0 to {MAX_RETRIES}")
        budget = grant_budget(grant)
        return self._respond(lane, "approve", text, budget, retries)

    def reject(self, lane: str, text: str) -> dict[str, Any]:
        """Reject what the task on `lane` waits about (`ctl reject --reason`); `text` becomes
        its revision feedback. Returns and raises as `approve` (`ConfigError` for an empty
        `text`)."""
        return self._respond(lane, "reject", _required(text, "reject"))

    def redirect(self, lane: str, text: str) -> dict[str, Any]:
        """Tell the task on `lane` to do `text` instead (`ctl redirect --to`). Returns and raises
        as `reject`."""
        return self._respond(lane, "redirect", _required(text, "redirect"))

    def accept_partial(self, lane: str) -> dict[str, Any]:
        """Take what the task on `lane` has done so far and end its step (`ctl
        accept-partial`). Returns and raises as `approve`."""
        return self._respond(lane, "accept_partial")

    def _respond(
        self,
        lane: str,
        verdict: Verdict,
        text: str = "",
        grant: f.Budget | None = None,
        retries: int = 0,
    ) -> dict[str, Any]:
        ask = f.CtlRespond(lane=lane, verdict=verdict, text=text, grant=grant, retries=retries)
        return shapes.recorded_json(self._expect(f.HitlRecorded, ask))

    # --- lanes and tools -------------------------------------------------------------------------

    def call(self, tool: str, /, **params: object) -> Any:
        """Call one of the coordinator's tools through the relay (`ctl call`) and return its
        value as `ctl call --json` prints it; `params` go as `wire_params` makes them
        (`call("start_lane", run="make test", requires=["gpu"])`). Bounded by
        `call_timeout_s`. Raises `ConfigError` for a parameter that cannot be sent,
        `RemoteError` for the tool's refusal (`bad_request`, `not_found`, `path_escape`,
        `timeout`: no reply from the peer, the outcome unknown, ...)."""
        body = f.CtlCall(tool=tool, params=wire_params(params))
        return self._expect(f.ToolResult, body, self.call_timeout_s).value

    def cancel(self, lane: str) -> None:
        """Stop `lane` now, its process group with it; its task becomes cancelled (`ctl
        cancel`). Raises `RemoteError(not_found)` for a lane no shard holds."""
        self._expect(f.Ack, f.CtlCancel(lane=lane))

    # --- the event log ---------------------------------------------------------------------------

    def events(
        self, *, since: int = 0, plan: str = "", follow: bool = False
    ) -> Iterator[dict[str, Any]]:
        """The tree's event log after `since` (a `seq`; 0: from the oldest kept), oldest
        first, as `ctl events --json` prints each: {"seq", "at" (Unix seconds), "source",
        "kind", and those of "plan", "task", "lane", "child", "who", "detail" it has}. Only
        plan `plan`'s when given; with `follow`, for ever, across the tree's restarts (pass
        the last "seq" seen as `since` to resume in a later program: nothing is missed or
        repeated). It uses a connection of its own. Raises as `client.events.read_events`
        does: `ConfigError` for a negative `since`, `TreeUnreachable`, `RemoteError`."""
        if self.closed:
            raise ValueError("the client is closed")
        for event in read_events(
            lambda: CtlClient(self.run_dir, connect=self.connect, keys=self.keys),
            since=since,
            plan=plan,
            follow=follow,
            timeout_s=self.timeout_s,
        ):
            yield msgspec.to_builtins(event)


def _required(text: str, verb: str) -> str:
    if not text.strip():
        raise ConfigError(f"{verb}: the text must not be empty")
    return text
