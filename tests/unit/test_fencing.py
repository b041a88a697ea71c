"""Which inbox messages the coordinator refuses as fenced (`coordinator.fencing.refusal`, ADR
0021), as a table: a host's shard is heard only for the lane its task has placed on it now,
and a result only with that placement's token; the root's own processes are never refused."""

from __future__ import annotations

import pytest

from orchestra_sup.coordinator.fencing import refusal
from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.protocol import frames as f

HOST_SHARD = "host-a/shard-0"
TOKEN = 41


def _placed(shard: str = HOST_SHARD, fence: int = TOKEN) -> PlanRecord:
    """Plan "p" whose task "t" is placed once on `shard` (lane "p-t-1") with token `fence`."""
    spec = f.PlanSpec(name="demo", tasks=[f.TaskSpec(id="t", run="true")])
    plan = PlanRecord.new("p", spec, submitted_at=0.0)
    plan.place(spec.tasks[0], AffinityTicket(shard=shard, generation=1, boot="b"))
    plan.tasks["t"].fence = fence
    return plan


def _result(lane: str = "p-t-1", fence: int = TOKEN, shard: str = HOST_SHARD) -> f.InboxPut:
    result = f.LaneResult(
        lane=lane, plan="p", task="t", shard=shard, status=f.ResultStatus.SUCCEEDED,
        exit_code=0, duration_s=0.1, output_tail="", sandbox=None, commit=None, error=None,
        fence=fence,
    )  # fmt: skip
    return f.InboxPut(msg_id=f"result:{lane}", result=result)


def _note(lane: str = "p-t-1") -> f.InboxPut:
    note = f.LaneNote(lane=lane, plan="p", task="t", text="hi", at=0.0)
    return f.InboxPut(msg_id=f"note:{lane}:1", note=note)


def test_the_current_placements_result_with_its_token_is_taken() -> None:
    assert refusal(_result(), HOST_SHARD, {"p": _placed()}) is None
    assert refusal(_note(), HOST_SHARD, {"p": _placed()}) is None


@pytest.mark.parametrize(
    ("put", "sender", "why"),
    [
        (_result(fence=TOKEN - 1), HOST_SHARD, "carries fence 40, not 41"),
        (_result(fence=0), HOST_SHARD, "carries fence 0, not 41"),
        (_result(lane="p-t-0"), HOST_SHARD, "lane p-t-0 is not host-a/shard-0's now"),
        (_note(lane="p-t-0"), HOST_SHARD, "lane p-t-0 is not host-a/shard-0's now"),
        (_result(shard="host-b/shard-0"), "host-b/shard-0", "is not host-b/shard-0's now"),
        (_result(), "host-a/shard-1", "is not host-a/shard-1's now"),
    ],
)
def test_a_hosts_message_of_another_attempt_or_shard_is_refused(
    put: f.InboxPut, sender: str, why: str
) -> None:
    refused = refusal(put, sender, {"p": _placed()})
    assert refused is not None and why in refused


def test_a_message_of_a_plan_or_task_the_coordinator_does_not_have_is_refused() -> None:
    assert refusal(_result(), HOST_SHARD, {}) is not None


def test_the_roots_own_shards_are_never_refused_here() -> None:
    """A root shard's stale result is the runner's to ignore (`PlanRecord.apply`), as before."""
    local = _placed(shard="shard-0", fence=0)
    assert refusal(_result(lane="p-t-9", fence=5, shard="shard-0"), "shard-0", {"p": local}) is None
