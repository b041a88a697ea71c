"""`orchestra-sup bench scale`: does the relay slow down, and what does a lane cost, as parked
lanes pile up?

A parked lane is one whose program waits for its next message (`Parked`, below): registered on its
shard with its sandbox, transcript and mailbox, and no process. For 10, 100 and 1,000 parked lanes
spread over 8 shards (`lanes_per_shard` high enough to hold them), in one private tree:

- relay p50/p99: `message_lane` through the coordinator to one parked lane and back (the shard
  puts the text in the lane's mailbox and acknowledges), timed inside the coordinator like
  `bench relay`, each with its own idempotency key;
- shard memory per parked lane: the growth of the shards' unique set size (USS, psutil), summed,
  from the previous step, divided by the lanes added (what one more parked lane costs), and the
  average over all lanes (which includes what each shard loads once, at its first lane).

The 10-lane figures are the baseline the others are divided by (`ratio_p50`). Targets (issue 6):
relay p50 at 1,000 lanes <= 1.1x at 10; <= 16 KiB of shard memory per parked lane.
"""

from __future__ import annotations

import math
import time
from typing import Any

import psutil

from orchestra_sup.bench.scratch import scratch_tree
from orchestra_sup.bench.stats import summary
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import SupervisionError
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.program import LaneContext, Outcome

PARKED = "orchestra_sup.bench.scale:Parked"
TARGET_RATIO = 1.1
TARGET_BYTES = 16 * 1024


class Parked:
    """A lane program that waits for messages: each one becomes a line of its output, and the
    message `stop` ends the lane, succeeded."""

    async def run(self, lane: LaneContext) -> Outcome:
        while True:
            text = await lane.recv()
            if text == "stop":
                return Outcome(status="succeeded")
            lane.emit(str(text))


COUNTS = (10, 100, 1000)
SHARDS = 8
MAX_PARKED = 10_000
"""The most parked lanes one run starts (one plan of them: its record must stay a sane size)."""


def _shard_uss(client: CtlClient) -> int:
    """Bytes of memory unique to the shard processes, summed (psutil USS)."""
    status = client.request(f.CtlStatus(), timeout_s=30.0)
    assert isinstance(status, f.StatusReply)
    total = 0
    for child in status.children:
        if child.role == "shard" and child.pid is not None:
            total += psutil.Process(child.pid).memory_full_info().uss
    return total


def _parked(client: CtlClient) -> list[str]:
    """Ids of the lanes the shards report running."""
    reply = client.request(f.CtlLanes(), timeout_s=60.0)
    assert isinstance(reply, f.LaneList)
    return [lane.lane for lane in reply.lanes if lane.state == "running"]


def _park(client: CtlClient, count: int, timeout_s: float) -> list[str]:
    """Start `count` more parked lanes (one plan) and wait until the shards run them all."""
    before = set(_parked(client))
    spec = f.PlanSpec(
        name=f"parked-{count}",
        tasks=[f.TaskSpec(id=f"p{i}", run="", program=PARKED) for i in range(count)],
    )
    accepted = client.request(f.CtlSubmit(plan=spec), timeout_s=60.0)
    assert isinstance(accepted, f.PlanAccepted)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = _parked(client)
        if len(running) >= len(before) + count:
            return running
        time.sleep(0.2)
    raise SupervisionError(f"{count} parked lanes were not all running within {timeout_s:g} s")


def run_scale_bench(
    counts: tuple[int, ...] = COUNTS, iterations: int = 2000, warmup: int = 200
) -> dict[str, Any]:
    """Relay round trips and shard memory at each count of parked lanes; see the module
    docstring. Raises `SupervisionError` when the tree does not start or the lanes do not all
    run within a minute per hundred."""
    capacity = math.ceil(max(counts) / SHARDS) + 1
    steps: dict[str, Any] = {}
    config = f'[lanes]\nprograms = ["{PARKED}"]\n'
    with scratch_tree(config, shards=SHARDS, lanes_per_shard=capacity) as client:
        empty = before = _shard_uss(client)
        parked = 0
        for count in counts:
            lanes = _park(client, count - parked, timeout_s=60.0 + count * 0.6)
            uss = _shard_uss(client)
            per_lane = (uss - before) / (count - parked)
            average = (uss - empty) / count
            before, parked = uss, count
            reply = client.request(
                f.CtlBenchRelay(
                    tool="message_lane",
                    params={"lane": lanes[-1], "text": "ping"},
                    iterations=iterations,
                    warmup=warmup,
                ),
                timeout_s=600.0,
            )
            assert isinstance(reply, f.BenchSamples)
            relay = summary(reply.samples_us, "us", digits=1)
            steps[str(count)] = {
                "lanes": count,
                "relay": relay,
                "shard_bytes_per_lane": round(per_lane),
                "shard_bytes_per_lane_average": round(average),
                "samples_us": reply.samples_us,
            }
    first = steps[str(counts[0])]["relay"]
    for step in steps.values():
        step["relay"]["ratio_p50"] = round(step["relay"]["p50_us"] / first["p50_us"], 3)
    last = steps[str(counts[-1])]
    return {
        "steps": steps,
        "target": {
            "relay_ratio_p50": TARGET_RATIO,
            "shard_bytes_per_lane": TARGET_BYTES,
            "met": last["relay"]["ratio_p50"] <= TARGET_RATIO
            and last["shard_bytes_per_lane"] <= TARGET_BYTES,
        },
        "method": {
            "shards": SHARDS,
            "lanes_per_shard": capacity,
            "iterations": iterations,
            "warmup": warmup,
            "relay": "message_lane to the newest parked lane, timed inside the coordinator "
            "(as bench relay), a fresh idempotency key each time",
            "memory": "shard_bytes_per_lane: the growth of the shards' summed USS (psutil) "
            "from the previous step, divided by the lanes added (the marginal cost); "
            "..._average: growth from before the first lane, divided by all lanes (includes "
            "what the first lane of each shard loads once)",
            "percentiles": "nearest rank",
        },
    }


def format_table(result: dict[str, Any]) -> str:
    """One line per count, for people."""
    lines = [
        f"{'parked lanes':>12} {'relay p50 us':>13} {'p99 us':>9} {'x at first':>11} "
        f"{'shard KiB/lane':>15}"
    ]
    for step in result["steps"].values():
        relay = step["relay"]
        lines.append(
            f"{step['lanes']:>12} {relay['p50_us']:>13} {relay['p99_us']:>9} "
            f"{relay['ratio_p50']:>11} {step['shard_bytes_per_lane'] / 1024:>15.1f}"
        )
    return "\n".join(lines)
