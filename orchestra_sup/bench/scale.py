"""`orchestra-sup bench scale`: does the relay slow down, and what does a lane cost, as parked
lanes pile up?

A parked lane is one whose program waits for its next message (`Parked`, below): registered on its
shard with its sandbox, transcript and mailbox, and no process. For 10, 100 and 1,000 parked lanes
spread over 8 shards (`lanes_per_shard` high enough to hold them), in one private tree:

- relay p50/p99: `message_lane` through the coordinator to one parked lane and back (the shard
  puts the text in the lane's mailbox and acknowledges), timed inside the coordinator like
  `bench relay`, each with its own idempotency key;
- shard memory per parked lane: the shards' unique set size (USS, psutil) summed, minus the same
  sum with no lane, divided by the number of lanes.

The 10-lane figures are the baseline the others are divided by (`ratio_p50`). Targets (issue 6):
relay p50 at 1,000 lanes <= 1.1x at 10; <= 16 KiB of shard memory per parked lane.
"""

from __future__ import annotations

from orchestra_sup.shards.program import LaneContext, Outcome

PARKED = "orchestra_sup.bench.scale:Parked"


class Parked:
    """A lane program that waits for messages: each one becomes a line of its output, and the
    message `stop` ends the lane, succeeded."""

    async def run(self, lane: LaneContext) -> Outcome:
        while True:
            text = await lane.recv()
            if text == "stop":
                return Outcome(status="succeeded")
            lane.emit(str(text))
