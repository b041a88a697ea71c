"""Each receiver's handler covers its channel, and answers nothing else (`protocol.channel`);
each tool dispatch covers its tools (`protocol.tools`).

No type checker is installed, so the exhaustiveness a checker would prove from `assert_never` is
checked here from the source: every member of a handler's union (a receiver's `Serves`, a tool
dispatch's `LaneCall` or `AwaitedRead`) has a case in its `match` that always matches it (no guard,
no sub-pattern that can fail), the match covers no type outside the union, and it ends in
`case _: assert_never(...)`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing

import pytest

from orchestra_sup.coordinator import role as coordinator
from orchestra_sup.coordinator.toolkit import Toolkit
from orchestra_sup.custodian import role as custodian
from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.protocol.channel import Channel
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.shards import role as shards
from orchestra_sup.supervisor import ctl

HANDLERS = [
    (coordinator, coordinator.Coordinator.handle),
    (custodian, custodian.Custodian.handle),
    (shards, shards.Shard.handle),
    (ctl, ctl.CtlService.answer),
]
MATCHES = [
    *((module.Serves, handler) for module, handler in HANDLERS),
    (tools.LaneCall, Toolkit.call),
    (tools.AwaitedRead, custodian.Custodian._read),
]


def _match(handler: typing.Callable[..., None]) -> ast.Match:
    tree = ast.parse(textwrap.dedent(inspect.getsource(handler)))
    matches = [node for node in ast.walk(tree) if isinstance(node, ast.Match)]
    assert len(matches) == 1, "one match statement per handler"
    return matches[0]


def _irrefutable(pattern: ast.MatchClass) -> bool:
    """A class pattern that matches every instance of its class (captures only)."""
    subpatterns = [*pattern.patterns, *pattern.kwd_patterns]
    return all(isinstance(p, ast.MatchAs) and p.pattern is None for p in subpatterns)


def _classes(pattern: ast.pattern) -> list[ast.MatchClass]:
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:  # case X() as x
        return _classes(pattern.pattern)
    if isinstance(pattern, ast.MatchOr):
        return [c for alt in pattern.patterns for c in _classes(alt)]
    if isinstance(pattern, ast.MatchClass):
        return [pattern]
    return []


def _name(cls: ast.MatchClass) -> str:
    assert isinstance(cls.cls, ast.Attribute), ast.unparse(cls.cls)  # written f.X
    return cls.cls.attr


@pytest.mark.parametrize(
    ("union", "handler"), MATCHES, ids=lambda x: getattr(x, "__qualname__", "")
)
def test_every_member_of_a_union_has_a_case(union: typing.Any, handler: typing.Any) -> None:
    members = {t.__name__ for t in typing.get_args(union)}
    match = _match(handler)
    covered: set[str] = set()
    named: set[str] = set()
    for case in match.cases:
        for cls in _classes(case.pattern):
            named.add(_name(cls))
            if case.guard is None and _irrefutable(cls):
                covered.add(_name(cls))
    assert members - covered == set(), "members with no case that always matches them"
    assert named - members == set(), "cases for types outside the channel"
    last = match.cases[-1]
    assert isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None
    assert ast.unparse(last.body[0]).startswith("assert_never(")


def test_a_role_serves_its_channel() -> None:
    assert coordinator.Coordinator.serves is coordinator.SERVES
    assert custodian.Custodian.serves is custodian.SERVES
    assert shards.Shard.serves is shards.SERVES
    for module, _ in HANDLERS:
        assert module.SERVES.members == typing.get_args(module.Serves)


class _Replies:
    """An `Endpoint` stand-in that keeps what it is asked to reply."""

    def __init__(self) -> None:
        self.sent: list[f.Body] = []

    def reply(self, request: f.Envelope[f.Body], peer: bytes | None, body: f.Body) -> None:
        self.sent.append(body)


def _env(body: f.Body) -> f.Envelope[f.Body]:
    return f.Envelope(v=1, id="x.1.1", corr=None, sender="x", gen=1, ttl_s=None, dest_gen=None,
                      body=body)  # fmt: skip


def test_admit_passes_a_member_and_answers_anything_else() -> None:
    channel = Channel[f.LaneCancel | f.Drain](f.LaneCancel | f.Drain, "a shard does not serve {}")
    ep = _Replies()
    member = _env(f.LaneCancel(lane="l"))
    assert channel.admit(typing.cast(Endpoint, ep), None, member) is member
    assert ep.sent == []
    assert channel.admit(typing.cast(Endpoint, ep), None, _env(f.CtlStatus())) is None
    assert ep.sent == [
        f.Error(code=ErrorCode.UNEXPECTED, message="a shard does not serve CtlStatus")
    ]


START = f.LaneStart(lane="l", plan="p", task=f.TaskSpec(id="t", run="true"))
HELLO = f.Hello(role="shard", name="s", generation=1, release="", proto_min=1, proto_max=1, pid=1)


@pytest.mark.parametrize(
    ("channel", "body", "message"),
    [
        (coordinator.SERVES, START, "the coordinator does not serve LaneStart"),
        (custodian.SERVES, START, "the custodian does not serve LaneStart"),
        (shards.SERVES, f.CtlStatus(), "a shard does not serve CtlStatus"),
        (ctl.SERVES, HELLO, "Hello is not a ctl request"),
    ],
)
def test_the_refusals_say_what_each_role_said(
    channel: Channel[typing.Any], body: f.Body, message: str
) -> None:
    """The words each role wrote out for itself before the channels answered for it."""
    assert type(body) not in channel.members
    assert channel.unsupported(body) == f.Error(code=ErrorCode.UNEXPECTED, message=message)
