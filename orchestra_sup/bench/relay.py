"""`orchestra-sup bench relay`: the coordinator's relay next to the raw pyzmq floor, in one run.

- Baseline (the floor): a DEALER in this process and a ROUTER echo in a second process, both
  plain blocking pyzmq over `ipc://`, exchanging the very bytes of the relay's request frame
  (an `Envelope` carrying `ToolCall(stat)`); one round trip at a time.
- Relays: inside the coordinator of a real private tree, `stat` and `read_file` calls through its
  relay to the custodian, one at a time (`CtlBenchRelay`), timed with `perf_counter_ns` around
  the awaited call. So each relay figure is one real hop, coordinator -> custodian -> coordinator,
  including the custodian's handler and the tool's own work.

Every run reports p50/p90/p99/p99.9 in microseconds and each relay's ratio to the floor, with
the iteration and warm-up counts. Absolute times on a shared machine are noise; the ratios taken
in one run are the result.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from orchestra_sup.oneshot import private_tree
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION

ECHO = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("ready", flush=True)
while True:
    parts = sock.recv_multipart()
    if parts[-1] == b"stop":
        break
    sock.send_multipart(parts)
"""


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p90/p99/p99.9 (nearest rank) of `samples`, rounded to 0.1."""
    ordered = sorted(samples)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)

    return {
        "p50_us": q(0.50),
        "p90_us": q(0.90),
        "p99_us": q(0.99),
        "p999_us": q(0.999),
        "n": len(ordered),
    }


def request_frame() -> bytes:
    """The bytes of a relay request as the coordinator sends them."""
    env = f.Envelope(
        v=PROTOCOL_VERSION,
        id="coordinator.1.12345",
        corr=None,
        sender="coordinator",
        gen=1,
        ttl_s=55.0,
        dest_gen=1,
        body=f.ToolCall(tool="stat", params={"path": "README"}),
    )
    return Codec().encode(env)


def baseline(iterations: int, warmup: int, workdir: Path) -> list[float]:
    """Raw pyzmq DEALER<->ROUTER round trips of the relay's frame between two processes."""
    addr = f"ipc://{workdir / 'echo.ipc'}"
    echo = subprocess.Popen([sys.executable, "-c", ECHO, addr], stdout=subprocess.PIPE)
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == b"ready"
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(addr)
        frame = request_frame()
        samples: list[float] = []
        for i in range(warmup + iterations):
            t0 = time.perf_counter_ns()
            sock.send(frame)
            sock.recv()
            if i >= warmup:
                samples.append((time.perf_counter_ns() - t0) / 1000)
        sock.send(b"stop")
        sock.close()
        ctx.term()
        return samples
    finally:
        echo.wait(timeout=10)


def run_relay_bench(iterations: int = 5000, warmup: int = 500) -> dict[str, Any]:
    """Measure the floor and each relay; see the module docstring for the JSON shape."""
    with tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp:
        work = Path(tmp)
        repo = work / "ws"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        (repo / "README").write_text("x" * 200)
        subprocess.run(["git", "-C", str(repo), "add", "README"], check=True)
        subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "-c",
                "user.name=b",
                "-c",
                "user.email=b@b",
                "commit",
                "-q",
                "-m",
                "seed",
            ],
            check=True,
        )
        floor = percentiles(baseline(iterations, warmup, work))
        relays: dict[str, Any] = {}
        with private_tree(
            workspace=repo, state_dir=work / "state", shards=1, lanes_per_shard=8, config=None
        ) as client:
            for tool in ("stat", "read_file"):
                reply = client.request(
                    f.CtlBenchRelay(
                        tool=tool, params={"path": "README"}, iterations=iterations, warmup=warmup
                    ),
                    timeout_s=600.0,
                )
                assert isinstance(reply, f.BenchSamples)
                stats = percentiles(reply.samples_us)
                stats["ratio_p50"] = round(stats["p50_us"] / floor["p50_us"], 2)
                stats["ratio_p99"] = round(stats["p99_us"] / floor["p99_us"], 2)
                relays[tool] = stats
    return {
        "baseline": floor,
        "relays": relays,
        "method": {
            "iterations": iterations,
            "warmup": warmup,
            "baseline": "blocking pyzmq DEALER -> ROUTER echo in a second process, ipc://, "
            "the relay's own request frame",
            "relays": "sequential awaited calls inside the coordinator, coordinator -> "
            "custodian -> coordinator, including the tool's work",
            "percentiles": "nearest rank",
        },
    }
