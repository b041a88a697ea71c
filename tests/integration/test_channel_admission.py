"""Every frame type at every socket of a live tree (`protocol.channel`, issue 18), the
supervisor's control socket too (`_control_socket`): a role answers a frame outside its channel
with its one refusal, a control-channel frame from a peer `forbidden`, a frame for another
generation `stale_generation`, and one it serves with its own answer, never `internal` and
never none; every process keeps its pid. (On 6036688 every answer is the one dee4eae gave,
frame for frame.)

The frames are made from each body type's required fields alone (the smallest valid value of
each), so a frame type added to `frames.Body` is sent too. `CtlStop` is not sent to the ctl
socket (it would stop the tree, as it should).
"""

from __future__ import annotations

import time
import typing
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
import zmq

from orchestra_sup.coordinator import role as coordinator
from orchestra_sup.custodian import role as custodian
from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.channel import Channel
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.shards import role as shards
from orchestra_sup.supervisor import ctl
from tests.integration.harness import Tree

pytestmark = pytest.mark.integration

REPLY_DEADLINE_S = 30.0
STALE_GEN = 999
CONTROL = typing.get_args(f.Control)
CHANNELS: dict[str, tuple[Channel[Any], str]] = {
    "ctl": (ctl.SERVES, "{} is not a ctl request"),
    "coordinator": (coordinator.SERVES, "the coordinator does not serve {}"),
    "custodian": (custodian.SERVES, "the custodian does not serve {}"),
    "shard-0": (shards.SERVES, "a shard does not serve {}"),
    "shard-1": (shards.SERVES, "a shard does not serve {}"),
}
"""Per socket, its channel and the words of its refusal (the same before the channels were
typed: a user-visible text)."""
_codec = Codec()


def _smallest(t: mi.Type) -> Any:
    """The smallest value msgspec accepts for type `t` (a builtin, for `msgspec.convert`)."""
    match t:
        case mi.StrType():
            return "x" * max(1, t.min_length or 0)
        case mi.IntType():
            return max(1, t.ge or 0, (t.gt or 0) + 1)
        case mi.FloatType():
            return 1.0
        case mi.BytesType():
            return b"x" * max(1, t.min_length or 0)
        case mi.BoolType():
            return False
        case mi.NoneType() | mi.AnyType():
            return None
        case mi.ListType() | mi.SetType() | mi.FrozenSetType() | mi.VarTupleType():
            return []
        case mi.TupleType():
            return [_smallest(item) for item in t.item_types]
        case mi.DictType():
            return {}
        case mi.LiteralType():
            return t.values[0]
        case mi.EnumType():
            return next(iter(t.cls)).value
        case mi.UnionType():
            none = any(isinstance(member, mi.NoneType) for member in t.types)
            return None if none else _smallest(t.types[0])
        case mi.StructType():
            return {fl.encode_name: _smallest(fl.type) for fl in t.fields if fl.required}
        case mi.MetaType():
            return _smallest(t.type)
    raise TypeError(f"no smallest value for {t}")


def _bodies() -> list[f.Body]:
    """One frame of every body type, with only its required fields."""
    return [msgspec.convert(_smallest(mi.type_info(cls)), cls) for cls in typing.get_args(f.Body)]


def _ask_all(path: Path, bodies: list[tuple[str, f.Body, int | None]]) -> dict[str, f.Body]:
    """Send every (id, body, dest_gen) on one DEALER to `path` at once; the answers by id
    (an id missing: no answer within the deadline)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.IDENTITY, f"admission.{time.monotonic_ns()}".encode())
    sock.connect(f"ipc://{path}")
    answers: dict[str, f.Body] = {}
    try:
        for msg_id, body, dest_gen in bodies:
            env = f.Envelope(
                v=PROTOCOL_VERSION,
                id=msg_id,
                corr=None,
                sender="admission",
                gen=1,
                ttl_s=REPLY_DEADLINE_S,
                dest_gen=dest_gen,
                body=body,
            )
            sock.send(_codec.encode(env))
        deadline = time.monotonic() + REPLY_DEADLINE_S
        while len(answers) < len(bodies):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not sock.poll(left_ms):
                break
            reply = _codec.decode(sock.recv())
            if reply.corr is not None:
                answers[reply.corr] = reply.body
    finally:
        sock.close(linger=0)
        ctx.term()
    return answers


def _control_socket(path: Path) -> list[tuple[str, str, str, str]]:
    """The supervisor's control socket, from a stranger: a `Hello` is rejected, a `Heartbeat`
    (one-way) is not answered, any other frame is `unexpected` naming it and the peer, and a
    frame for another generation `stale_generation`. What is not so, as (socket, frame, answer,
    expected)."""
    frames = [b for b in _bodies() if not isinstance(b, f.Heartbeat)]
    sent = [(f"{i}", b, None) for i, b in enumerate(frames)]
    sent += [(f"stale.{i}", b, STALE_GEN) for i, b in enumerate(frames)]
    answers = _ask_all(path, sent)
    wrong = []
    for msg_id, body, dest_gen in sent:
        name, got = type(body).__name__, answers.get(msg_id)
        if dest_gen is not None:
            expected = "stale_generation"
            ok = isinstance(got, f.Error) and got.code == ErrorCode.STALE_GENERATION
        elif isinstance(body, f.Hello):
            expected, ok = "Reject", isinstance(got, f.Reject)
        else:
            expected = f"the supervisor does not serve {name} from b'admission."
            ok = (
                isinstance(got, f.Error)
                and got.code == ErrorCode.UNEXPECTED
                and got.message.startswith(expected)
            )
        if not ok:
            wrong.append(("supervisor", f"{name}@{dest_gen}", _shown(got), expected))
    return wrong


def _shown(got: f.Body | None) -> str:
    return f"{_code(got)}: {got.message}" if isinstance(got, f.Error) else _code(got)


def _code(body: f.Body | None) -> str:
    return str(body.code) if isinstance(body, f.Error) else type(body).__name__


def test_every_frame_at_every_role_gets_its_documented_answer(tree: Tree) -> None:
    before = tree.pids()
    ends = {"supervisor": tree.run_dir / "supervisor.ipc", "ctl": tree.run_dir / "ctl.ipc"}
    ends |= {c.name: Path(c.endpoint.removeprefix("ipc://")) for c in tree.status().children}
    wrong: list[tuple[str, str, str, str]] = []
    for role, path in ends.items():
        if role == "supervisor":
            wrong += _control_socket(path)
            continue
        channel, refusal = CHANNELS[role]
        frames = [b for b in _bodies() if not (role == "ctl" and isinstance(b, f.CtlStop))]
        sent = [(f"{i}", b, None) for i, b in enumerate(frames)]
        sent += [(f"stale.{i}", b, STALE_GEN) for i, b in enumerate(frames)]
        answers = _ask_all(path, sent)
        for msg_id, body, dest_gen in sent:
            name = type(body).__name__
            got = answers.get(msg_id)
            if dest_gen is not None:
                ok = isinstance(got, f.Error) and got.code == ErrorCode.STALE_GENERATION
                expected = "stale_generation"
            elif isinstance(body, CONTROL) and role != "ctl":
                ok = got == f.Error(
                    code=ErrorCode.FORBIDDEN, message=f"{name} comes only from the supervisor"
                )
                expected = "forbidden"
            elif not isinstance(body, channel.members):
                expected = refusal.format(name)
                ok = got == f.Error(code=ErrorCode.UNEXPECTED, message=expected)
            else:  # served: its own answer, whatever it is, but an answer and not `internal`
                ok = got is not None and _code(got) != ErrorCode.INTERNAL
                expected = "an answer, not internal"
            if not ok:
                wrong.append((role, f"{name}@{dest_gen}", _shown(got), expected))
    assert not wrong, "\n".join(map(str, wrong))
    after = tree.status()
    assert {c.name: c.pid for c in after.children} == before
    assert after.internal_errors == 0
