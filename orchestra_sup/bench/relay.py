"""`orchestra-sup bench relay`: the coordinator's relay next to the raw pyzmq floor, in one run.

- Baseline (the floor): a DEALER in this process and a ROUTER echo in a second process, both
  plain blocking pyzmq over `ipc://`, exchanging the very bytes of the relay's request frame
  (an `Envelope` carrying `ToolCall(stat)`); one round trip at a time.
- The busy-polling floor (`busy_floor`): the same, against an echo that busy-polls for the
  window the custodian's front does (`[cpu] busy_poll_s` of the bench's tree: the default
  `[cpu]`, or the `[cpu]` of `--cpu-config FILE`; with `busy_poll_s = 0` it is a second
  blocking floor). It tells the relay's gain from busy polling apart from the rest: the
  relays' ratios are to the blocking floor, the one the bound names; divide them by this
  rung's for what the relay adds over a raw pair that busy-polls too (ADR 0001, "Busy polling
  the front").
- Relays: inside the coordinator of a real private tree, calls through its relay one at a time
  (`CtlBenchRelay`: `Coordinator._bench` awaits `Toolkit.call`), timed with `perf_counter_ns`
  around the awaited call, so each figure is one real hop including the peer's handler and the
  tool's own work: `stat` and `read_file` (coordinator -> custodian -> coordinator), and
  `message_lane` (coordinator -> shard -> coordinator) to a live lane (`sleep 600`, started with
  `start_lane` and cancelled afterwards). The bench passes no idempotency key, so the toolkit
  makes a new one per call, as it does for a caller without one: every message is really
  delivered (key claimed, transcript row, one line appended to the lane's inbox file, then the
  acknowledgement), none is answered as a duplicate.
- Python floors (`bench.pyfloor`): the least a relay in Python on both ends pays, on the same
  machine in the same run: `loop_echo` (a uvloop client of the echo, waiting the coordinator's
  way) and `stat`, `read_file` (that client against a second process that decodes, runs the
  custodian's inline tool and encodes). Each read relay's `ratio_p50_python`/`ratio_p99_python`
  is to its own Python floor: what the product adds over the least Python can do.
- Interleaving: the work is split into `rounds` rounds, each running the floor, the
  busy-polling floor, the Python floors and then every relay for its share of the iterations
  (with its share of the warm-up), so a machine whose speed drifts during the run (a shared,
  2-vCPU box) weighs on every figure alike.

Every run reports p50/p90/p99/p99.9/max in microseconds and each figure's ratio to the floor,
with the iteration, warm-up and round counts, every sample (`samples_us`: "baseline",
"busy_floor", "python_<rung>" and each relay, for plots) and the machine it ran on (`machine`:
CPUs, idle states, load, steal; see `orchestra_sup.bench.machine`). Absolute times on a shared
machine are noise; the ratios taken in one run are the result.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq

from orchestra_sup.bench import machine, pyfloor
from orchestra_sup.bench.policy import policy_config, write_config
from orchestra_sup.bench.stats import summary
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree
from orchestra_sup.config import settings_from_mapping
from orchestra_sup.errors import ErrorCode, RemoteError, SupervisionError
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
    sock.send_multipart(sock.recv_multipart())
"""


BUSY_ECHO = """
import os, sys, time, zmq
window = float(sys.argv[2])
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("ready", flush=True)
while True:
    deadline = time.perf_counter() + window
    while True:
        try:
            parts = sock.recv_multipart(zmq.NOBLOCK)
            break
        except zmq.Again:
            if time.perf_counter() >= deadline:
                parts = sock.recv_multipart()
                break
            os.sched_yield()
    sock.send_multipart(parts)
"""
"""The echo, busy-polling as `runtime.front` does (window: argv[2], seconds)."""


STAT = f.ToolCall(tool="stat", params={"path": "README"})
"""The relay request the floor's bytes are of."""


def request_frame(body: f.Body = STAT, dest_gen: int | None = 1) -> bytes:
    """The bytes of a request carrying `body` as the coordinator sends them (default: the
    relay's `stat`)."""
    env = f.Envelope(
        v=PROTOCOL_VERSION,
        id="coordinator.1.12345",
        corr=None,
        sender="coordinator",
        gen=1,
        ttl_s=55.0,
        dest_gen=dest_gen,
        body=body,
    )
    return Codec().encode(env)


RELAYS: tuple[tuple[str, dict[str, str]], ...] = (
    ("stat", {"path": "README"}),
    ("read_file", {"path": "README"}),
    ("message_lane", {"text": "x"}),  # + the live lane's id
)
PYTHON_FLOORS = ("loop_echo", "stat", "read_file")
"""`bench.pyfloor`'s rungs: the loop client against the echo, then against the Python peer for
each read relay."""
LANE_READY_S = 30.0


@contextlib.contextmanager
def _peer(code: str, address: str, *args: str) -> Iterator[None]:
    """`python -c code address *args` in a second process, from its "ready" line to the end of
    the block (terminated on the way out)."""
    proc = subprocess.Popen([sys.executable, "-c", code, address, *args], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def _blocking(address: str) -> Iterator[zmq.Socket]:
    """A blocking DEALER connected to `address`."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(address)
        yield sock
    finally:
        sock.close()
        ctx.term()


def _floor(sock: zmq.Socket, iterations: int, warmup: int) -> list[float]:
    """Raw pyzmq DEALER<->ROUTER round trips of the relay's frame between two processes."""
    frame = request_frame()
    samples: list[float] = []
    for i in range(warmup + iterations):
        t0 = time.perf_counter_ns()
        sock.send(frame)
        sock.recv()
        if i >= warmup:
            samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples


def _call(client: CtlClient, tool: str, **params: str) -> Any:
    reply = client.request(f.CtlCall(tool=tool, params=params), timeout_s=60.0)
    assert isinstance(reply, f.ToolResult), reply
    return reply.value


def _start_lane(client: CtlClient) -> str:
    """Start a `sleep 600` lane and return its id once its command runs on its shard."""
    started = _call(client, "start_lane", run="sleep 600", name="bench-relay")
    lane = str(started["lane"])
    deadline = time.monotonic() + LANE_READY_S
    while _lane_state(client, lane) != "running":
        if time.monotonic() > deadline:
            raise SupervisionError(f"bench lane {lane} not running after {LANE_READY_S:g} s")
        time.sleep(0.05)  # a one-off wait in a bench, not a service loop
    return lane


def _lane_state(client: CtlClient, lane: str) -> str | None:
    """The lane's state on its shard; None while the shard has not admitted it yet."""
    try:
        return str(_call(client, "lane_status", lane=lane)["state"])
    except RemoteError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            return None
        raise


def _seed_workspace(repo: Path) -> None:
    """A git repository with one committed 200-byte `README`, the file the read tools use."""
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


def _measure(
    work: Path, shares: list[int], warm: int, cpu: dict[str, Any], window: float
) -> tuple[list[float], list[float], dict[str, list[float]], dict[str, list[float]]]:
    """The floor's samples, the busy-polling floor's, the Python floors' (`bench.pyfloor`) and
    each relay's, in us, over `shares` interleaved rounds; the tree runs with the `[cpu]` table
    `cpu`, the busy-polling echo polls for `window` seconds."""
    repo = work / "ws"
    config = write_config(work / "tree.toml", cpu) if cpu else None
    _seed_workspace(repo)
    echo_at, python_at = f"ipc://{work / 'echo.ipc'}", f"ipc://{work / 'python.ipc'}"
    busy_at = f"ipc://{work / 'busy.ipc'}"
    floor: list[float] = []
    busy: list[float] = []
    floors: dict[str, list[float]] = {rung: [] for rung in PYTHON_FLOORS}
    samples: dict[str, list[float]] = {tool: [] for tool, _ in RELAYS}
    with (
        private_tree(
            workspace=repo, state_dir=work / "state", shards=1, lanes_per_shard=8, config=config
        ) as client,
        _peer(ECHO, echo_at),
        _peer(BUSY_ECHO, busy_at, repr(window)),
        _peer(pyfloor.SERVER, python_at, str(repo)),
        _blocking(echo_at) as echo,
        _blocking(busy_at) as busy_echo,
    ):
        lane = _start_lane(client)
        try:
            for share in shares:
                floor += _floor(echo, share, warm)
                busy += _floor(busy_echo, share, warm)
                floors["loop_echo"] += pyfloor.loop_round_trips(
                    echo_at, request_frame(), share, warm
                )
                for tool in PYTHON_FLOORS[1:]:
                    frame = request_frame(f.ToolCall(tool=tool, params=dict(RELAYS)[tool]))
                    floors[tool] += pyfloor.loop_round_trips(python_at, frame, share, warm)
                for tool, params in RELAYS:
                    if tool == "message_lane":
                        params = {**params, "lane": lane}
                    reply = client.request(
                        f.CtlBenchRelay(tool=tool, params=params, iterations=share, warmup=warm),
                        timeout_s=600.0,
                    )
                    assert isinstance(reply, f.BenchSamples), reply
                    samples[tool] += reply.samples_us
        finally:
            _call(client, "cancel_lane", lane=lane)
    return floor, busy, floors, samples


def run_relay_bench(
    iterations: int = 5000,
    warmup: int = 500,
    rounds: int = 5,
    hold_cpu_latency: bool = False,
    cpu_config: Path | None = None,
) -> dict[str, Any]:
    """Measure the floor and each relay; see the module docstring for the JSON shape. With
    `hold_cpu_latency`, `/dev/cpu_dma_latency` is held at 0 for the whole run, floor and relays
    alike (`machine.cpu_latency_held`). `cpu_config`: a TOML file whose `[cpu]` the tree runs
    with (None: the default `[cpu]`). Raises `ConfigError` (one line) before anything starts
    when that hold cannot be taken, or `cpu_config` cannot be read or has a bad `[cpu]` value."""
    cpu = {} if cpu_config is None else policy_config(cpu_config)
    window = settings_from_mapping({"cpu": cpu}).cpu.busy_poll_s
    rounds = max(1, min(rounds, iterations))
    shares = [iterations // rounds + (r < iterations % rounds) for r in range(rounds)]
    warm = max(1, warmup // rounds)
    with (
        machine.cpu_latency_held(hold_cpu_latency),
        tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp,
    ):
        start = machine.sample()
        floor, busy, floors, samples = _measure(Path(tmp), shares, warm, cpu, window)
        end = machine.sample()
    base = summary(floor, "us", digits=1)
    pythons = {rung: _against(summary(xs, "us", digits=1), base) for rung, xs in floors.items()}
    relays: dict[str, Any] = {}
    for tool, xs in samples.items():
        stats = _against(summary(xs, "us", digits=1), base)
        if tool in pythons:
            stats["ratio_p50_python"] = round(stats["p50_us"] / pythons[tool]["p50_us"], 2)
            stats["ratio_p99_python"] = round(stats["p99_us"] / pythons[tool]["p99_us"], 2)
        relays[tool] = stats
    return {
        "baseline": base,
        "busy_floor": _against(summary(busy, "us", digits=1), base),
        "python_floors": pythons,
        "relays": relays,
        "machine": machine.record(start, end, hold_cpu_latency=hold_cpu_latency),
        "samples_us": {
            "baseline": [round(x, 1) for x in floor],
            "busy_floor": [round(x, 1) for x in busy],
            **{f"python_{rung}": [round(x, 1) for x in xs] for rung, xs in floors.items()},
            **{tool: [round(x, 1) for x in xs] for tool, xs in samples.items()},
        },
        "method": {
            "iterations": iterations,
            "warmup": warm * rounds,
            "rounds": rounds,
            "baseline": "blocking pyzmq DEALER -> ROUTER echo in a second process, ipc://, "
            "the relay's own request frame",
            "busy_floor": f"the same against an echo that busy-polls {window} s after each "
            "frame, as the custodian's front does",
            "busy_poll_s": window,
            "cpu": cpu,
            "relays": "sequential awaited calls inside the coordinator (Toolkit.call), "
            "coordinator -> custodian (stat, read_file) or shard (message_lane, a new "
            "idempotency key per call, every message delivered) -> coordinator, including "
            "the peer's work",
            "python_floors": "a uvloop add_reader client (the coordinator's way of waiting, "
            "none of its bookkeeping) against the echo (loop_echo), and against a second "
            "process that decodes the request, runs the custodian's inline tool and encodes "
            "its reply (stat, read_file)",
            "interleaving": "rounds of floor, busy-polling floor, each Python floor, then each "
            "relay, samples pooled",
            "percentiles": "nearest rank",
        },
    }


def _against(stats: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """`stats` with `ratio_p50` and `ratio_p99` to the raw floor `base` of the same run."""
    stats["ratio_p50"] = round(stats["p50_us"] / base["p50_us"], 2)
    stats["ratio_p99"] = round(stats["p99_us"] / base["p99_us"], 2)
    return stats


def format_text(result: dict[str, Any]) -> str:
    """The floor, each Python floor and each relay's p50, p99, p99.9 and max (ratios to the
    floor; a read relay's also to its Python floor), and the machine, for people."""
    base = result["baseline"]
    lines = [
        f"raw pyzmq floor: p50 {base['p50_us']} us, p99 {base['p99_us']} us, "
        f"p99.9 {base['p999_us']} us, max {base['max_us']} us ({base['n']} round trips)"
    ]
    busy = result["busy_floor"]
    window_us = result["method"]["busy_poll_s"] * 1e6
    lines.append(
        f"busy-polling floor ({window_us:g} us window): "
        f"p50 {busy['p50_us']} us ({busy['ratio_p50']}x), "
        f"p99 {busy['p99_us']} us ({busy['ratio_p99']}x), "
        f"p99.9 {busy['p999_us']} us, max {busy['max_us']} us"
    )
    for rung, stats in result["python_floors"].items():
        lines.append(
            f"python floor {rung}: p50 {stats['p50_us']} us ({stats['ratio_p50']}x), "
            f"p99 {stats['p99_us']} us ({stats['ratio_p99']}x), "
            f"p99.9 {stats['p999_us']} us, max {stats['max_us']} us"
        )
    for tool, stats in result["relays"].items():
        python = (
            f" [p50 {stats['ratio_p50_python']}x / p99 {stats['ratio_p99_python']}x its python "
            "floor]"
            if "ratio_p50_python" in stats
            else ""
        )
        lines.append(
            f"relay {tool}: p50 {stats['p50_us']} us ({stats['ratio_p50']}x), "
            f"p99 {stats['p99_us']} us ({stats['ratio_p99']}x), "
            f"p99.9 {stats['p999_us']} us, max {stats['max_us']} us{python}"
        )
    lines.append(f"machine: {machine.one_line(result['machine'])}")
    return "\n".join(lines)
