"""Tests for `orchestra_sup.protocol.codec.Codec` and `protocol.version`: every frame type
round-trips, and every malformed input is refused with a stable `ProtocolError` code."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import msgspec
import pytest

from orchestra_sup.errors import ErrorCode, ProtocolError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import MAX_FRAME_BYTES, SOCKET_MAX_BYTES, Codec
from orchestra_sup.protocol.frames import ENVELOPE_ID_MAX
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN, PROTOCOL_VERSION, compatible

ANY_SAMPLE: Any = {"rows": [1, "two", None, 3.5, True], "nested": {"empty": []}}
"""A JSON-shaped value that msgpack gives back unchanged, for fields typed `Any`."""


def _frame_classes() -> list[type[f.Frame]]:
    """Every concrete `Frame` subclass, however deep, so a new frame type is covered at once."""
    found: list[type[f.Frame]] = []
    todo = list(f.Frame.__subclasses__())
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


FRAME_CLASSES = _frame_classes()


def _sample(tp: Any, name: str) -> Any:
    """A value of type `tp` for a field called `name`, chosen to differ from any default (so a
    round trip that silently fell back to a default would be caught)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return ANY_SAMPLE
    if tp is type(None):
        return None
    if origin in (typing.Union, types.UnionType):
        return _sample(next(a for a in args if a is not type(None)), name)
    if origin is typing.Literal:
        return args[0]
    if origin is list:
        return [_sample(args[0], name), _sample(args[0], name + "2")]
    if origin is dict:
        return {_sample(args[0], name): _sample(args[1], name)}
    if origin is tuple:
        return tuple(_sample(a, f"{name}{i}") for i, a in enumerate(args) if a is not Ellipsis)
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return list(tp)[-1]
        if issubclass(tp, bool):
            return True
        if issubclass(tp, int):
            return 7
        if issubclass(tp, float):
            return 2.5
        if issubclass(tp, str):
            return f"{name}-sample"
        if issubclass(tp, bytes):
            return f"{name}-sample".encode() + b"\x00\xff"
        if issubclass(tp, msgspec.Struct):
            return _build(tp, every_field=True)
    raise TypeError(f"no sample for field {name!r} of type {tp!r}: extend _sample")


def _build(cls: type[Any], *, every_field: bool) -> Any:
    """An instance of struct `cls`: all fields set (every_field) or only the required ones."""
    return cls(
        **{
            fi.name: _sample(fi.type, fi.name)
            for fi in msgspec.structs.fields(cls)
            if every_field or fi.required
        }
    )


def _envelope(body: Any, **overrides: Any) -> f.Envelope:
    fields: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "id": "sender.3.41",
        "corr": "peer.1.9",
        "sender": "sender",
        "gen": 3,
        "ttl_s": 1.5,
        "dest_gen": 4,
        "body": body,
    }
    fields.update(overrides)
    return f.Envelope(**fields)


def _raw_envelope(body: Any, *, v: Any = PROTOCOL_VERSION) -> bytes:
    """Envelope bytes built by hand (array-like, field order of `Envelope`), body not checked."""
    return msgspec.msgpack.encode([v, "x.1.1", None, "x", 1, None, None, body])


def _refused(data: bytes, codec: Codec | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        (codec or Codec()).decode(data)
    return info.value


# --- round trips ---------------------------------------------------------------------------------


def test_frame_discovery_finds_the_known_frames() -> None:
    """Subclass discovery sees the frames of every channel (guards against an empty parametrize)."""
    names = {cls.__name__ for cls in FRAME_CLASSES}
    assert {"Hello", "Ack", "Error", "LaneStart", "InboxPut", "CtlSubmit", "PlanReport"} <= names


def test_every_frame_has_a_unique_explicit_tag() -> None:
    """Every frame's wire tag is set explicitly (not the class name) and no two frames share one."""
    tags = [cls.__struct_config__.tag for cls in FRAME_CLASSES]
    for cls, tag in zip(FRAME_CLASSES, tags, strict=True):
        assert isinstance(tag, str), cls
        assert tag != cls.__name__, f"{cls.__name__} has no explicit tag"
    assert len(set(tags)) == len(tags)


@pytest.mark.parametrize("cls", FRAME_CLASSES, ids=lambda c: c.__name__)
def test_every_frame_round_trips_with_every_field_set(cls: type[f.Frame]) -> None:
    """A frame with every field set to a non-default value comes back equal through the codec."""
    codec = Codec()
    env = _envelope(_build(cls, every_field=True))
    back = codec.decode(codec.encode(env))
    assert back == env
    assert type(back.body) is cls


@pytest.mark.parametrize("cls", FRAME_CLASSES, ids=lambda c: c.__name__)
def test_every_frame_round_trips_with_only_required_fields(cls: type[f.Frame]) -> None:
    """A frame with only its required fields set comes back equal, defaults included."""
    codec = Codec()
    env = _envelope(_build(cls, every_field=False), corr=None, ttl_s=None, dest_gen=None)
    back = codec.decode(codec.encode(env))
    assert back == env
    assert type(back.body) is cls


def test_round_trip_accepts_memoryview() -> None:
    """`decode` takes a memoryview (what zero-copy receives give) as well as bytes."""
    codec = Codec()
    env = _envelope(f.Welcome(generation=2))
    assert codec.decode(memoryview(codec.encode(env))) == env


def test_dest_gen_is_read_from_the_head_of_a_frame_whose_body_this_release_does_not_know() -> None:
    """`dest_gen_of` (a host's data port routing a frame) reads the envelope's head only: a
    body it does not know still names its generation; a frame with no such head is
    `bad_frame`."""
    codec = Codec()
    assert codec.dest_gen_of(codec.encode(_envelope(f.Ack(), dest_gen=7))) == 7
    assert codec.dest_gen_of(codec.encode(_envelope(f.Ack(), dest_gen=None))) is None
    head = [PROTOCOL_VERSION, "m.1", None, "x", 1, None]
    assert codec.dest_gen_of(msgspec.msgpack.encode([*head, 3, {"t": "new"}])) == 3
    for bad in (b"garbage", msgspec.msgpack.encode([*head, "3"])):
        with pytest.raises(ProtocolError) as exc:
            codec.dest_gen_of(bad)
        assert exc.value.code == ErrorCode.BAD_FRAME


def test_error_code_decodes_as_enum() -> None:
    """An `Error` frame's code comes back as an `ErrorCode` member, not a bare string."""
    codec = Codec()
    env = codec.decode(codec.encode(_envelope(f.Error(code=ErrorCode.SHARD_FULL, message="m"))))
    assert isinstance(env.body, f.Error)
    assert env.body.code is ErrorCode.SHARD_FULL


@pytest.mark.parametrize("status", list(f.ResultStatus), ids=str)
def test_a_lane_results_status_is_its_string_on_the_wire(status: f.ResultStatus) -> None:
    """`LaneResult.status` is a `ResultStatus` in memory and its value on the wire, so a result
    from an older release (a plain string) decodes as the member."""
    result = f.LaneResult(
        lane="l",
        plan="p",
        task="t",
        shard="shard-0",
        status=status,
        exit_code=None,
        duration_s=0.0,
        output_tail="",
        sandbox=None,
        commit=None,
        error=None,
    )
    wire = msgspec.msgpack.encode(result)
    assert msgspec.msgpack.decode(wire)["status"] == str(status)
    assert msgspec.msgpack.decode(wire, type=f.LaneResult).status is status


# --- malformed input -----------------------------------------------------------------------------

BAD_INPUTS: dict[str, bytes] = {
    "garbage": b"\xc1\xff\x00not msgpack at all",
    "empty": b"",
    "truncated": Codec().encode(_envelope(f.Reject(reason="no")))[:-3],
    "map_not_array": msgspec.msgpack.encode({"v": 1, "id": "x"}),
    "scalar": msgspec.msgpack.encode(42),
    "array_too_short": msgspec.msgpack.encode([1, "x.1.1", None]),
    "unknown_tag": _raw_envelope({"t": "nope"}),
    "missing_tag": _raw_envelope({"generation": 1}),
    "body_not_a_map": _raw_envelope("hello"),
    "wrong_field_type": _raw_envelope(
        {
            "t": "hello",
            "role": "shard",
            "name": "shard-0",
            "generation": "3",
            "release": "0.1.0",
            "proto_min": 1,
            "proto_max": 1,
            "pid": 10,
        }
    ),
    "missing_required_field": _raw_envelope({"t": "welcome"}),
    "unknown_error_code": _raw_envelope({"t": "error", "code": "no_such_code", "message": "m"}),
    "version_not_int": _raw_envelope({"t": "ack"}, v="1"),
    "trailing_bytes": Codec().encode(_envelope(f.Ack())) + b"\x00",
    # 100,000 one-element arrays around a nil (100 KB): msgspec raises RecursionError
    "nested_too_deep": _raw_envelope({"t": "tool_result", "value": None})[:-1]
    + b"\x91" * 100_000
    + b"\xc0",
}


@pytest.mark.parametrize("data", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_malformed_input_is_bad_frame(data: bytes) -> None:
    """Anything that is not a well-formed envelope of a known body raises bad_frame."""
    exc = _refused(data)
    assert exc.code is ErrorCode.BAD_FRAME
    assert str(exc).startswith("bad_frame: ")


def test_hand_built_envelope_is_accepted() -> None:
    """The hand-built envelope used for malformed cases decodes when its body is well-formed, so
    the refusals above are about the body and not the hand encoding."""
    env = Codec().decode(_raw_envelope({"t": "welcome", "generation": 5}))
    assert env.body == f.Welcome(generation=5)


def test_oversized_frame_is_too_large_and_names_its_id() -> None:
    """A frame longer than max_bytes is refused with too_large naming both sizes, and carries
    the frame's message id so the refusal can answer the request."""
    data = Codec().encode(_envelope(f.Reject(reason="x" * 200)))
    exc = _refused(data, Codec(max_bytes=100))
    assert exc.code is ErrorCode.TOO_LARGE
    assert f"{len(data):,}" in exc.detail
    assert "100 bytes" in exc.detail
    assert exc.msg_id == "sender.3.41"


def test_oversized_garbage_is_too_large_without_an_id() -> None:
    """Oversized bytes that are no envelope at all are too_large too, with no id to answer."""
    exc = _refused(b"\xc1" * 200, Codec(max_bytes=100))
    assert exc.code is ErrorCode.TOO_LARGE
    assert exc.msg_id is None


def test_a_body_this_release_does_not_know_is_bad_frame_and_names_its_id() -> None:
    """A well-formed envelope of an unknown body (a newer ctl's request) is bad_frame with the
    frame's id, so the refusal answers the request rather than leaving it to time out."""
    exc = _refused(_raw_envelope({"t": "ctl_ping"}))
    assert exc.code is ErrorCode.BAD_FRAME
    assert exc.msg_id == "x.1.1"


def test_an_id_past_its_bound_is_not_echoed() -> None:
    """A frame whose id is over ENVELOPE_ID_MAX is refused without it (every answer echoes it)."""
    long_id = "x" * (ENVELOPE_ID_MAX + 1)
    data = msgspec.msgpack.encode(
        [PROTOCOL_VERSION, long_id, None, "s", 1, None, None, {"t": "ctl_status"}]
    )
    exc = _refused(data)
    assert exc.code is ErrorCode.BAD_FRAME
    assert exc.msg_id is None


def test_frame_of_exactly_max_bytes_is_accepted() -> None:
    """The size limit is inclusive: a frame of exactly max_bytes decodes, one byte less refuses."""
    env = _envelope(f.Reject(reason="x" * 50))
    data = Codec().encode(env)
    assert Codec(max_bytes=len(data)).decode(data) == env
    assert _refused(data, Codec(max_bytes=len(data) - 1)).code is ErrorCode.TOO_LARGE


def test_encode_refuses_a_frame_over_the_limit() -> None:
    """The limit holds both ways: a frame one byte over max_bytes is not made at all (a sender
    learns before sending), one of exactly max_bytes is."""
    env = _envelope(f.Reject(reason="x" * 50))
    size = len(Codec().encode(env))
    assert len(Codec(max_bytes=size).encode(env)) == size
    with pytest.raises(ProtocolError) as info:
        Codec(max_bytes=size - 1).encode(env)
    assert info.value.code is ErrorCode.TOO_LARGE
    assert f"{size:,} bytes" in info.value.detail


def test_socket_limit_is_above_the_frame_limit() -> None:
    """Every socket takes messages up to twice the frame limit, so a frame somewhat over the
    limit reaches the codec and is answered rather than cut off by libzmq."""
    assert SOCKET_MAX_BYTES == 2 * MAX_FRAME_BYTES


def test_default_max_bytes() -> None:
    """A codec built without arguments uses the documented 16 MiB limit."""
    assert Codec().max_bytes == MAX_FRAME_BYTES == 16 * 1024 * 1024


@pytest.mark.parametrize(
    "v", [PROTOCOL_MIN - 1, PROTOCOL_MAX + 1, 0, -1, 1_000_000], ids=lambda v: f"v{v}"
)
def test_version_outside_range_is_version_skew(v: int) -> None:
    """A well-formed frame whose v is outside PROTOCOL_MIN..PROTOCOL_MAX raises version_skew."""
    codec = Codec()
    exc = _refused(codec.encode(_envelope(f.Ack(), v=v)), codec)
    assert exc.code is ErrorCode.VERSION_SKEW
    assert str(v) in exc.detail


@pytest.mark.parametrize("v", range(PROTOCOL_MIN, PROTOCOL_MAX + 1), ids=lambda v: f"v{v}")
def test_every_version_in_range_is_accepted(v: int) -> None:
    """Every version from PROTOCOL_MIN to PROTOCOL_MAX inclusive decodes."""
    codec = Codec()
    assert codec.decode(codec.encode(_envelope(f.Ack(), v=v))).v == v


# --- version.compatible --------------------------------------------------------------------------

COMPATIBLE_TABLE = [
    ("same range", PROTOCOL_MIN, PROTOCOL_MAX, True),
    ("only our max", PROTOCOL_MAX, PROTOCOL_MAX, True),
    ("only our min", PROTOCOL_MIN, PROTOCOL_MIN, True),
    ("wider on both sides", PROTOCOL_MIN - 3, PROTOCOL_MAX + 3, True),
    ("older, touching our min", PROTOCOL_MIN - 2, PROTOCOL_MIN, True),
    ("newer, touching our max", PROTOCOL_MAX, PROTOCOL_MAX + 2, True),
    ("entirely older", PROTOCOL_MIN - 5, PROTOCOL_MIN - 1, False),
    ("entirely newer", PROTOCOL_MAX + 1, PROTOCOL_MAX + 5, False),
    ("just older", PROTOCOL_MIN - 1, PROTOCOL_MIN - 1, False),
    ("just newer", PROTOCOL_MAX + 1, PROTOCOL_MAX + 1, False),
    ("empty range below", PROTOCOL_MAX, PROTOCOL_MIN - 1, False),
]


@pytest.mark.parametrize(
    ("peer_min", "peer_max", "expected"),
    [row[1:] for row in COMPATIBLE_TABLE],
    ids=[row[0] for row in COMPATIBLE_TABLE],
)
def test_compatible_truth_table(peer_min: int, peer_max: int, expected: bool) -> None:
    """Two peers are compatible exactly when their version ranges overlap."""
    assert compatible(peer_min, peer_max) is expected


def test_protocol_constants_are_consistent() -> None:
    """Our own range is non-empty and we send its newest version."""
    assert PROTOCOL_MIN <= PROTOCOL_MAX
    assert PROTOCOL_VERSION == PROTOCOL_MAX
    assert compatible(PROTOCOL_MIN, PROTOCOL_MAX)


@pytest.mark.parametrize("field", ["id", "corr", "sender"])
def test_an_envelope_id_past_its_bound_is_a_bad_frame(field: str) -> None:
    """An `id`, `corr` or `sender` over `ENVELOPE_ID_MAX` characters is refused `bad_frame`
    (every answer echoes the id: one near the frame limit made every answer too large, and the
    endpoint re-encoded its refusal ~960 times, stalling its loop for tens of seconds)."""
    codec = Codec()
    raw = msgspec.msgpack.encode(_envelope(f.CtlStatus(), **{field: "i" * (f.ENVELOPE_ID_MAX + 1)}))
    with pytest.raises(ProtocolError) as info:
        codec.decode(raw)
    assert info.value.code is ErrorCode.BAD_FRAME
    ok = msgspec.msgpack.encode(_envelope(f.CtlStatus(), **{field: "i" * f.ENVELOPE_ID_MAX}))
    assert getattr(codec.decode(ok), field) == "i" * f.ENVELOPE_ID_MAX
