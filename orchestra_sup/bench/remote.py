"""`orchestra-sup bench relay --remote`: a host's shard through its agent's data port, next to
the raw pyzmq tcp+CURVE floor, in one run (issue 21, ADR 0021 step 3).

- The host's network: a network namespace over a veth pair (`bench.netns`), the agent and the
  floor's echo inside it, so each tcp round trip crosses the pair as it would a link to
  another machine. Where the machine cannot make one (not root, no `ip`), loopback, and the
  report says why (`method.network`).
- Floor: a blocking DEALER in this process and a ROUTER echo in a second process, plain pyzmq
  over tcp to the host's address with CURVE (the same encryption, no ZAP handler: it admits at
  the handshake only), exchanging the very bytes of the request frame.
- Direct: the same DEALER shape, as the root's coordinator would call a local shard: to the
  shard's `ipc://` socket, `ListLanes`, answered by the real shard process.
- Remote: `ListLanes` to the same kind of shard on a real `orchestra-sup host` agent, over
  tcp and CURVE with the root's server keypair, through the agent's data port
  (`supervisor.hostdata`): the hop a root's process pays to reach a host's shard. The agent
  joins no root (its `--join` port is closed): its shards and data port run without one.
- Interleaving: `rounds` rounds of floor, direct, remote, each its share of the iterations.

Reports p50/p90/p99/p99.9/max in microseconds, the ratios remote/floor and remote/direct at
p50 and p99, and each round's p50 ratio (its spread over the run). Absolute times on a shared
machine are noise; the ratios taken in one run are the result.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq

from orchestra_sup.bench import machine
from orchestra_sup.bench.netns import HostNet, open_host_net
from orchestra_sup.bench.relay import request_frame
from orchestra_sup.bench.stats import nearest_rank, summary
from orchestra_sup.errors import SupervisionError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.curve import connect
from orchestra_sup.protocol.keys import ClientKeys, init_keys, load_client_keys, load_server_keys

HOST = "host-a"
READY_S = 60.0
"""Seconds the agent's shard has to answer through the data port."""
ECHO = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
public, secret = zmq.curve_keypair()
sock.curve_server = True
sock.curve_secretkey, sock.curve_publickey = secret, public
sock.bind(sys.argv[1])
print(public.decode(), flush=True)
while True:
    sock.send_multipart(sock.recv_multipart())
"""
SERIES = ("floor", "direct", "remote")


def _frame() -> bytes:
    """`ListLanes` as the coordinator sends it (to no generation in particular)."""
    return request_frame(f.ListLanes(), dest_gen=None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dealer(ctx: zmq.Context, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.rcvtimeo = round(READY_S * 1000)
    return sock


@contextlib.contextmanager
def _floor(ctx: zmq.Context, net: HostNet | None) -> Iterator[zmq.Socket]:
    """A CURVE ROUTER echo in a second process (on `net`'s host side), and a DEALER connected
    to it as a client."""
    addr = f"tcp://{_address(net)}:{_free_port()}"
    argv = [*_wrap(net), sys.executable, "-c", ECHO, addr]
    echo = subprocess.Popen(argv, stdout=subprocess.PIPE)
    sock = _dealer(ctx, b"floor")
    try:
        assert echo.stdout is not None
        server = echo.stdout.readline().strip()
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server, public, secret
        sock.connect(addr)
        yield sock
    finally:
        sock.close()
        echo.terminate()
        echo.wait(timeout=10)


def _address(net: HostNet | None) -> str:
    return "127.0.0.1" if net is None else net.host_ip


def _wrap(net: HostNet | None) -> list[str]:
    return [] if net is None else net.wrap


@contextlib.contextmanager
def _agent(
    work: Path, ctx: zmq.Context, net: HostNet | None
) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A real host agent (on `net`'s host side) with one shard and a data port; DEALERs to its
    shard directly (`ipc://`) and through the data port (CURVE, the root's keypair)."""
    keys, run_dir = work / "keys", work / "run"
    init_keys(keys, [HOST], host=True)
    data = f"tcp://{_address(net)}:{_free_port()}"
    argv = [*_wrap(net), sys.executable, "-m", "orchestra_sup", "host", "--join"]
    argv += [f"tcp://127.0.0.1:{_free_port()}", "--keys", str(keys), "--name", HOST]
    argv += ["--shards", "1", "--listen", data, "--state-dir", str(work / "state")]
    argv += ["--run-dir", str(run_dir)]
    log = (work / "agent.log").open("ab")
    agent = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    host = load_client_keys(keys, HOST)
    root = ClientKeys(
        server_public=host.client.public, client=load_server_keys(keys).server, name="root"
    )
    # two callers: a routing id connected twice to one ROUTER is served on one connection only
    remote, direct = _dealer(ctx, b"coordinator.1>shard-0"), _dealer(ctx, b"coordinator.2")
    try:
        connect(remote, data, root)
        _first_answer(remote, agent, work)
        direct.connect(f"ipc://{run_dir / 'shard-0.ipc'}")
        yield direct, remote
    finally:
        remote.close()
        direct.close()
        agent.terminate()
        agent.wait(timeout=60)
        log.close()


def _first_answer(sock: zmq.Socket, agent: subprocess.Popen[bytes], work: Path) -> None:
    """Ask until the agent's shard answers (it starts with the agent)."""
    deadline = time.monotonic() + READY_S
    frame = _frame()
    while True:
        if agent.poll() is not None or time.monotonic() > deadline:
            log = (work / "agent.log").read_text(errors="replace")[-2000:]
            raise SupervisionError(f"the bench's host agent never answered:\n{log}")
        sock.send(frame)
        if sock.poll(500):
            sock.recv()
            while sock.poll(200):  # answers to the earlier tries, not to be timed later
                sock.recv()
            return


def _round_trips(name: str, sock: zmq.Socket, iterations: int, warmup: int) -> list[float]:
    """One series' round trips, in us. Raises `SupervisionError` when an answer does not come
    within `READY_S` (the socket's receive timeout)."""
    frame = _frame()
    samples: list[float] = []
    for i in range(warmup + iterations):
        t0 = time.perf_counter_ns()
        sock.send(frame)
        try:
            sock.recv()
        except zmq.Again:
            raise SupervisionError(
                f"bench relay --remote: no {name} answer in {READY_S:g} s"
            ) from None
        if i >= warmup:
            samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples


def run_remote_bench(iterations: int = 5000, warmup: int = 500, rounds: int = 5) -> dict[str, Any]:
    """Measure the three series (module docstring), the host in a network namespace where the
    machine can make one; raises `SupervisionError` when the bench's agent does not come up."""
    rounds = max(1, min(rounds, iterations))
    shares = [iterations // rounds + (r < iterations % rounds) for r in range(rounds)]
    warm = max(1, warmup // rounds)
    samples: dict[str, list[float]] = {name: [] for name in SERIES}
    per_round: list[dict[str, float]] = []
    ctx = zmq.Context()
    made = open_host_net(os.getpid() % 16384)
    net = made if isinstance(made, HostNet) else None
    network = f"loopback ({made})" if net is None else "a network namespace over a veth pair"
    try:
        with tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp:
            start = machine.sample()
            with _floor(ctx, net) as floor, _agent(Path(tmp), ctx, net) as (direct, remote):
                socks = {"floor": floor, "direct": direct, "remote": remote}
                for share in shares:
                    got = {n: _round_trips(n, socks[n], share, warm) for n in SERIES}
                    for name, xs in got.items():
                        samples[name] += xs
                    p50 = {name: nearest_rank(xs, 0.5) for name, xs in got.items()}
                    per_round.append(
                        {
                            "remote_to_floor": round(p50["remote"] / p50["floor"], 2),
                            "remote_to_direct": round(p50["remote"] / p50["direct"], 2),
                        }
                    )
            end = machine.sample()
    finally:
        ctx.term()
        if net is not None:
            net.remove()
    stats = {name: summary(xs, "us", digits=1) for name, xs in samples.items()}

    def ratio(a: str, b: str, q: str) -> float:
        return round(stats[a][f"{q}_us"] / stats[b][f"{q}_us"], 2)

    return {
        **stats,
        "ratios": {
            "remote_to_floor_p50": ratio("remote", "floor", "p50"),
            "remote_to_floor_p99": ratio("remote", "floor", "p99"),
            "remote_to_direct_p50": ratio("remote", "direct", "p50"),
            "remote_to_direct_p99": ratio("remote", "direct", "p99"),
            "direct_to_floor_p50": ratio("direct", "floor", "p50"),
        },
        "rounds": per_round,
        "machine": machine.record(start, end, hold_cpu_latency=False),
        "method": {
            "iterations": iterations,
            "warmup": warm * rounds,
            "rounds": rounds,
            "network": f"the host and the floor's echo on {network}",
            "floor": "blocking pyzmq DEALER -> CURVE ROUTER echo in a second process, "
            "tcp to the host's address, the request's own bytes",
            "direct": "ListLanes to a host agent's shard over its ipc:// socket",
            "remote": "ListLanes to the same shard through the agent's data port, "
            "tcp to the host's address with CURVE (the root's server keypair)",
            "interleaving": "rounds of floor, direct, remote; samples pooled",
            "percentiles": "nearest rank",
        },
    }


def format_text(result: dict[str, Any]) -> str:
    """Each series' p50, p99 and max, the ratios and their spread over the rounds."""
    lines = []
    for name in SERIES:
        s = result[name]
        lines.append(
            f"{name}: p50 {s['p50_us']} us, p99 {s['p99_us']} us, max {s['max_us']} us "
            f"({s['n']} round trips)"
        )
    r = result["ratios"]
    spread = [x["remote_to_floor"] for x in result["rounds"]]
    lines.append(
        f"remote / floor: p50 {r['remote_to_floor_p50']}x (rounds {min(spread)}-{max(spread)}x), "
        f"p99 {r['remote_to_floor_p99']}x; remote / direct: p50 {r['remote_to_direct_p50']}x, "
        f"p99 {r['remote_to_direct_p99']}x"
    )
    lines.append(f"network: {result['method']['network']}")
    lines.append(f"machine: {machine.one_line(result['machine'])}")
    return "\n".join(lines)
