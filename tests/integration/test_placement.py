"""Placement on a real tree: capabilities and tenants from the config, affinity tickets."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration

DEDICATED = """
[shards.shard-1]
capabilities = ["gpu"]
tenants = ["acme"]
"""


@pytest.fixture
def dedicated(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> Tree:
    """shard-0 offers nothing special and serves anyone; shard-1 offers `gpu`, only to acme."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text(DEDICATED)
    return tree_factory(workspace=repo, config=cfg)


def test_shards_advertise_what_the_config_gives_them(dedicated: Tree) -> None:
    shards = {c.name: c for c in dedicated.status().children if c.role == "shard"}
    assert (shards["shard-0"].capabilities, shards["shard-0"].tenants) == ([], [])
    assert (shards["shard-1"].capabilities, shards["shard-1"].tenants) == (["gpu"], ["acme"])


def test_capabilities_and_tenant_decide_the_shard(dedicated: Tree) -> None:
    """Eligibility is a hard filter: a plan with no tenant never reaches the shard dedicated to
    acme, however idle it is; acme's gpu task runs there; acme's plain task may run anywhere."""
    anyone = dedicated.submit(plan("anyone", *(task(f"t{i}", "true") for i in range(4))))
    report = dedicated.wait_plan(anyone, timeout_s=60)
    assert report.ok and {t.shard for t in report.tasks} == {"shard-0"}

    acme = f.PlanSpec(
        name="acme",
        tenant="acme",
        tasks=[f.TaskSpec(id="train", run="true", requires=["gpu"]), task("plain", "true")],
    )
    report = dedicated.wait_plan(dedicated.submit(acme), timeout_s=60)
    assert report.ok
    assert report.tasks[0].shard == "shard-1"
    assert report.tasks[0].ticket is not None and report.tasks[0].ticket.startswith("shard-1.1@")


@pytest.mark.parametrize(
    ("tenant", "requires", "missing"),
    [
        (None, ["tpu"], "capabilities tpu to plans without a tenant"),
        ("acme", ["tpu"], "capabilities tpu to tenant acme"),
        (None, ["gpu"], "capabilities gpu to plans without a tenant"),
        ("umbrella", ["gpu"], "capabilities gpu to tenant umbrella"),
    ],
)
def test_a_need_no_shard_meets_is_refused_at_submission(
    dedicated: Tree, tenant: str | None, requires: list[str], missing: str
) -> None:
    """Refused in one line naming what is missing and what each shard offers, instead of
    waiting forever; nothing is recorded."""
    spec = f.PlanSpec(
        name="nowhere", tenant=tenant, tasks=[f.TaskSpec(id="x", run="true", requires=requires)]
    )
    with pytest.raises(RemoteError) as info:
        dedicated.ctl(f.CtlSubmit(plan=spec))
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert f"task x: no shard offers {missing}" in str(info.value)
    assert "shard-1: gpu, tenants acme" in str(info.value)


def test_affinity_ticket_returns_a_lane_to_its_shard_while_its_generation_lives(
    tree: Tree,
) -> None:
    """A live ticket beats the tie-break; once its shard restarts (a newer generation) the same
    ticket falls back to fresh placement."""
    busy = tree.call("start_lane", run="sleep 300")
    assert busy["shard"] == "shard-0"  # idle shards tie: the name decides
    first = tree.call("start_lane", run="true")
    assert first["shard"] == "shard-1"  # least loaded
    ticket = str(first["ticket"])
    assert ticket.startswith("shard-1.1@")
    assert tree.wait_plan(str(first["plan"]), timeout_s=20).ok
    tree.call("cancel_lane", lane=str(busy["lane"]))
    tree.wait_plan(str(busy["plan"]), timeout_s=20)

    # Both shards idle: fresh placement would pick shard-0, the ticket picks shard-1.
    warm = tree.call("start_lane", run="true", ticket=ticket)
    assert (warm["shard"], warm["ticket"]) == ("shard-1", ticket)
    assert tree.wait_plan(str(warm["plan"]), timeout_s=20).ok
    control = tree.call("start_lane", run="true")
    assert control["shard"] == "shard-0"
    assert tree.wait_plan(str(control["plan"]), timeout_s=20).ok

    os.kill(tree.pids()["shard-1"], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("shard-1", 2)
    stale = tree.call("start_lane", run="true", ticket=ticket)
    assert stale["shard"] == "shard-0"
    assert str(stale["ticket"]).startswith("shard-0.1@")
    assert tree.wait_plan(str(stale["plan"]), timeout_s=20).ok


def test_a_malformed_ticket_is_refused(tree: Tree) -> None:
    with pytest.raises(RemoteError) as info:
        tree.call("start_lane", run="true", ticket="shard-1")
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert "is not <shard>.<generation>@<boot>" in str(info.value)


def test_a_slot_is_free_before_its_lanes_result_can_reach_the_coordinator(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """One shard of one slot. Lane `a` ends while the shard's commits are held (a stalled disk:
    `hold_commits`), so its result leaves from memory (the outbox's resend) before its own write
    lands, and the coordinator places `b`, which needs `a`, on that shard at once. The shard
    must count `a`'s slot free by then: refused `shard_full`, `b` would wait until another lane
    of that shard ended, and here none would."""
    tree = tree_factory(
        workspace=repo, shards=1, lanes=1, extra_env={"ORCHESTRA_SUP_DEBUG_HOOKS": "1"}
    )
    plan_id = tree.submit(plan("p", task("a", "sleep 2"), task("b", "true", needs=["a"])))
    wait_until(lambda: tree.task(plan_id, "a").status == "running", 30.0, "lane a running")
    hold = f.CtlDebug(name="shard-0", action="hold_commits", seconds=8.0)
    assert tree.ctl(hold) == f.Ack()
    report = tree.wait_plan(plan_id, timeout_s=40.0)
    assert [(t.id, t.status, t.attempts) for t in report.tasks] == [
        ("a", "succeeded", 1),
        ("b", "succeeded", 1),
    ]


def test_hold_commits_is_refused_by_a_child_without_a_store(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    tree = tree_factory(workspace=repo, extra_env={"ORCHESTRA_SUP_DEBUG_HOOKS": "1"})
    with pytest.raises(RemoteError) as info:
        tree.ctl(f.CtlDebug(name="custodian", action="hold_commits", seconds=1.0))
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert str(info.value) == "custodian has no state store to hold"
