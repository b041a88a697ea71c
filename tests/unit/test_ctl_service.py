"""The supervisor's ctl side of HITL: who answered comes from the connection, and `ctl lanes`
merges the coordinator's pending approvals into the shards' live lanes."""

from __future__ import annotations

import asyncio
import pwd
from typing import Any, cast

import msgspec
import pytest
import zmq

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.endpoint import Endpoint, KeyIdentity, PeerCredentials
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.supervisor.ctl import CtlService, merge_pending, stamped, user_name

DEADLINE_S = 5.0
"""Upper bound for anything that should happen promptly; only reached when a test fails."""


def hostile_respond(**extra: Any) -> bytes:
    """A raw ctl frame: a `CtlRespond` body with `extra` keys a client has no business sending,
    encoded by hand the way a hostile client would (no Struct would let it)."""
    body = {"t": "ctl_respond", "lane": "p1-deploy-1", "verdict": "approve", **extra}
    return msgspec.msgpack.encode([PROTOCOL_VERSION, "x.1", None, "ctl", 0, 5.0, None, body])


def test_extra_identity_fields_in_a_request_have_no_effect() -> None:
    """A `CtlRespond` carrying "uid" and "responder" decodes to the same request as one without,
    and the forwarded `HitlRespond` says who the connection says, not who the frame says."""
    codec = Codec()
    hostile = codec.decode(hostile_respond(uid=4242, responder="mallory", gid=4242, at=1.0))
    plain = codec.decode(hostile_respond())
    assert hostile.body == plain.body
    assert isinstance(hostile.body, f.CtlRespond)
    caller = PeerCredentials(uid=1000, gid=1000, pid=77)
    sent = stamped(hostile.body, caller, "alice")
    assert (sent.uid, sent.responder) == (1000, "alice")
    assert sent == f.HitlRespond(lane="p1-deploy-1", verdict="approve", uid=1000, responder="alice")


def test_stamped_keeps_the_answer_as_asked() -> None:
    """Verdict, text, grant and retries reach the coordinator unchanged."""
    grant = f.Budget(wall_s=60.0, output_bytes=10)
    req = f.CtlRespond(lane="l", verdict="reject", text="why", grant=grant, retries=2)
    sent = stamped(req, PeerCredentials(uid=0, gid=0, pid=1), "root")
    assert (sent.lane, sent.verdict, sent.text, sent.grant, sent.retries) == (
        "l",
        "reject",
        "why",
        grant,
        2,
    )


def test_user_name_of_a_known_and_an_unknown_uid() -> None:
    """A uid the user database knows is its login name; one it does not is "uid N". (Not this
    process's uid: as a lane of the selfcheck it runs as a uid of its own, which has no name.)"""
    some = pwd.getpwall()[0]
    assert user_name(some.pw_uid) == some.pw_name
    known = {entry.pw_uid for entry in pwd.getpwall()}
    stranger = next(uid for uid in range(4242, 1 << 31) if uid not in known)
    assert user_name(stranger) == f"uid {stranger}"


def test_respond_without_peer_credentials_is_forbidden() -> None:
    """A `CtlRespond` that arrives on a connection with no peer credentials (here `inproc://`)
    is refused `forbidden` before anything is forwarded (the service never touches its tree)."""

    async def main() -> None:
        ctx = zmq.Context()
        codec = Codec()
        service = CtlService(cast(Any, None))  # refused before it would look at its supervisor
        router = Endpoint(
            ctx, zmq.ROUTER, name="supervisor", generation=1, codec=codec, handler=service.handle
        )
        dealer = Endpoint(ctx, zmq.DEALER, name="ctl", generation=0, codec=codec, identity="c")
        try:
            assert router.reads_caller
            router.bind("inproc://ctl")
            router.start()
            dealer.connect("inproc://ctl")
            dealer.start()
            ask = f.CtlRespond(lane="p1-deploy-1", verdict="approve")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(ask, timeout_s=DEADLINE_S)
            assert info.value.code is ErrorCode.FORBIDDEN
            assert "\n" not in info.value.message
        finally:
            dealer.close()
            router.close()
            ctx.term()

    asyncio.run(main())


def lane(name: str, state: str = "running", **kw: Any) -> f.LaneInfo:
    defaults: dict[str, Any] = {"task": "t", "plan": "p", "shard": "shard-0", "sandbox": "/sb"}
    return f.LaneInfo(lane=name, state=state, **{**defaults, **kw})


def test_pending_entry_for_a_live_lane_takes_its_place() -> None:
    """A lane a shard lists and the coordinator says waits for a human: one row, with the
    coordinator's state, question and since, and the shard's placement."""
    live = [lane("a"), lane("b", shard="shard-1", sandbox="/b")]
    pending = [lane("b", "awaiting_approval", shard="", sandbox=None, question="ok?", since=5.0)]
    assert merge_pending(live, pending) == [
        lane("a"),
        lane("b", "awaiting_approval", shard="shard-1", sandbox="/b", question="ok?", since=5.0),
    ]


def test_pending_entry_keeps_the_shards_question_where_the_coordinator_has_none() -> None:
    """What the shard knows of the pause is not erased by a pending entry that lacks it."""
    live = [lane("a", "awaiting_approval", question="shard's", since=3.0)]
    pending = [lane("a", "awaiting_approval")]
    assert merge_pending(live, pending) == live


def test_a_question_the_coordinator_has_not_recorded_yet_is_shown_running() -> None:
    """The shard shows its lane waiting before the pause reaches the coordinator through the
    outbox: an answer then would be refused as nothing waiting, so ctl lanes does not offer it
    (a test answering what ctl lanes showed lost that race under load)."""
    live = [lane("a", "awaiting_approval", question="ship?", since=3.0)]
    assert merge_pending(live, []) == [lane("a")]


def test_pending_entries_without_a_live_lane_are_added_after_the_live_ones() -> None:
    """A task waiting for approval before it runs (no lane anywhere) is listed too, after the
    live lanes and in the coordinator's order."""
    live = [lane("a")]
    pending = [
        lane("z", "awaiting_approval", shard="", question="first?", since=1.0),
        lane("y", "awaiting_approval", shard="", question="second?", since=2.0),
    ]
    assert [x.lane for x in merge_pending(live, pending)] == ["a", "z", "y"]
    assert merge_pending([], []) == []


OWNER = 1000


@pytest.mark.parametrize(
    ("caller", "admitted"),
    [
        (PeerCredentials(uid=OWNER, gid=OWNER, pid=7), True),
        (PeerCredentials(uid=OWNER, gid=0, pid=8), True),  # the uid decides, not the group
        (PeerCredentials(uid=OWNER + 1, gid=OWNER, pid=9), False),
        (PeerCredentials(uid=0, gid=0, pid=10), False),  # root is not the owner either
        (KeyIdentity(name="operator"), True),
        (None, False),
    ],
)
def test_admit_only_the_owner_uid_or_an_allowed_key(
    caller: PeerCredentials | KeyIdentity | None, admitted: bool
) -> None:
    """Who may steer the tree, from the connection: the owner's uid over ipc, or a CURVE key
    the gate admitted; anyone else is refused with a reason naming their uid and pid, and
    counted."""
    service = CtlService(cast(Any, None), owner_uid=OWNER)
    reason = service.admit(caller)
    assert (reason is None) is admitted
    assert service.refused == (0 if admitted else 1)
    if isinstance(caller, PeerCredentials) and not admitted:
        assert reason is not None and f"uid {caller.uid} (pid {caller.pid})" in reason


def test_stamped_with_a_key_names_the_key_and_no_uid() -> None:
    """A HITL answer over CURVE is recorded as the key's name, uid -1: a key is not a user."""
    req = f.CtlRespond(lane="l", verdict="approve")
    sent = stamped(req, KeyIdentity(name="alice-laptop"), "key:alice-laptop")
    assert (sent.uid, sent.responder) == (-1, "key:alice-laptop")
