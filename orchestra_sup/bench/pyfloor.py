"""The least a relay written in Python on both ends pays here: `bench relay`'s Python floors.

`bench relay` divides each relay by the raw pyzmq round trip (a blocking DEALER and a blocking
ROUTER echo: `relay._floor`), the bound issue 20 sets. Two more rungs, measured in the same
interleaved rounds, take that ratio apart:

- `loop_echo`: the same echo, called from an event loop the way the coordinator's `Endpoint`
  calls (uvloop, which the coordinator runs on; `add_reader` on the DEALER's `zmq.FD`, one
  future per call, a non-blocking send with the `zmq.EVENTS` check after it, a drain until
  `zmq.Again`), and none of the endpoint's bookkeeping: what awaiting a reply on a loop costs
  instead of blocking in `recv`.
- `stat` and `read_file`: that loop client against a ROUTER in a second process that answers
  as the custodian's front does, minus the front's checks and counters (`answer`): decode the
  request (`Codec`), run the tool (`custodian.role.INLINE_TOOLS`, on the bench's own 200-byte
  `README`), wrap its `ToolResult` in an `Envelope`, encode it, send it.

No relay whose caller awaits on a loop and whose peer is CPython does less per round trip, so
each rung's ratio to the raw floor is a ratio a relay in Python cannot get under on the machine
of that run.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import uvloop
import zmq

from orchestra_sup.custodian.readtools import path_param
from orchestra_sup.custodian.role import INLINE_TOOLS
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION

SERVER = (
    "import sys\nfrom orchestra_sup.bench.pyfloor import serve\nserve(sys.argv[1], sys.argv[2])\n"
)
"""`python -c SERVER ADDRESS ROOT`: the Python peer (`serve`), in a process of its own."""


def answer(codec: Codec, root: Path, n: int, data: bytes) -> bytes:
    """The encoded reply to the encoded `ToolCall` request `data` for a tool in
    `INLINE_TOOLS`, run on the workspace at `root` (a realpath); `n` numbers the reply's id.
    Raises what the tool raises (`PathEscape`, `FileNotFoundError`, ...) and `ProtocolError`
    for a frame that does not decode: the bench sends only its own good requests."""
    env = codec.decode(data)
    body = env.body
    assert isinstance(body, f.ToolCall), body
    value = INLINE_TOOLS[body.tool](root, path_param(body.params, required=True))
    reply = f.Envelope(
        v=PROTOCOL_VERSION,
        id=f"custodian.1.f{n}",
        corr=env.id,
        sender="custodian",
        gen=1,
        ttl_s=None,
        dest_gen=None,
        body=f.ToolResult(value=value),
    )
    return codec.encode(reply)


def serve(address: str, root: str) -> None:
    """Bind a ROUTER at `address`, print "ready", then `answer` every request, one at a time,
    until killed."""
    codec, ids, real_root = Codec(), itertools.count(1), Path(os.path.realpath(root))
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    print("ready", flush=True)
    while True:
        peer, data = sock.recv_multipart()
        sock.send_multipart([peer, answer(codec, real_root, next(ids), data)])


def loop_round_trips(address: str, frame: bytes, iterations: int, warmup: int) -> list[float]:
    """`iterations` timed round trips of `frame` (after `warmup` untimed ones) to the ROUTER at
    `address`, one at a time from a uvloop event loop, in microseconds each."""
    return uvloop.run(_loop_client(address, frame, iterations, warmup))


async def _loop_client(address: str, frame: bytes, iterations: int, warmup: int) -> list[float]:
    loop = asyncio.get_running_loop()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    sock.send(frame)  # blocking, once: the pipe is up before any non-blocking send
    sock.recv()
    waiting: asyncio.Future[bytes] | None = None

    def drain() -> None:
        while True:
            try:
                reply = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if waiting is not None and not waiting.done():
                waiting.set_result(reply)

    fd = sock.getsockopt(zmq.FD)
    loop.add_reader(fd, drain)
    samples: list[float] = []
    try:
        for i in range(warmup + iterations):
            t0 = time.perf_counter_ns()
            waiting = loop.create_future()
            sock.send(frame, zmq.NOBLOCK)
            if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the send took the FD's edge
                loop.call_soon(drain)
            await waiting
            if i >= warmup:
                samples.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        loop.remove_reader(fd)
        sock.close()
        ctx.term()
    return samples
