"""The Python SDK against a real tree: `orchestra_sup.Client` and `AsyncClient` submit plans (a
dict and a file), wait for them, call tools, answer pauses and send messages, and raise the
typed errors `ctl` maps to its exit statuses."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchestra_sup
from orchestra_sup.errors import CallTimeout, ErrorCode, PlanError, RemoteError, TreeUnreachable
from tests.integration.harness import Tree, wait_until

pytestmark = pytest.mark.integration

ECHO = {"name": "echo", "task": [{"id": "say", "run": "echo from-a-dict"}]}


def gated(name: str) -> dict[str, Any]:
    """A plan whose one task waits for a human's approval before it runs."""
    return {"name": name, "task": [{"id": "deploy", "run": "echo deployed", "approve": True}]}


def waiting_lane(client: orchestra_sup.Client, plan_id: str) -> str:
    """The lane id to answer for plan `plan_id`'s pause, once the coordinator lists it."""

    def lane() -> str | None:
        return next((p["lane"] for p in client.pending() if p["plan"] == plan_id), None)

    return str(wait_until(lane, 20, f"plan {plan_id} to wait for a human"))


def test_a_dict_and_a_file_are_submitted_waited_for_and_read(tree: Tree, tmp_path: Path) -> None:
    plan_file = tmp_path / "file.toml"
    plan_file.write_text('name = "file"\n[[task]]\nid = "say"\nrun = "echo from-a-file"\n')
    with orchestra_sup.Client(tree.run_dir) as client:
        from_dict = client.submit(ECHO)
        from_file = client.submit(plan_file)
        report = client.wait(from_dict, timeout_s=60)
        assert report["done"] and report["ok"] and report["plan"] == "echo"
        assert report["tasks"][0]["output_tail"] == "from-a-dict\n"
        assert client.wait(from_file)["tasks"][0]["output_tail"] == "from-a-file\n"
        assert client.plan(from_file)["ok"] is True
        listed = {p["id"]: p for p in client.plans()}
        assert listed[from_dict]["tasks"] == {"succeeded": 1}
        assert from_file in listed


def test_tools_are_called_with_their_values_as_ctl_sends_them(tree: Tree) -> None:
    with orchestra_sup.Client(tree.run_dir) as client:
        listing = client.call("list_dir", path=".")
        assert {"name": "README", "type": "file", "size": 5} in listing["entries"]
        started = client.call("start_lane", run="echo from-a-lane", timeout_s=30, requires=[])
        assert started["duplicate"] is False
        report = client.wait(started["plan"], timeout_s=60)
        assert report["tasks"][0]["output_tail"] == "from-a-lane\n"


def test_a_wait_gives_up_at_its_timeout_and_cancel_stops_the_lane(tree: Tree) -> None:
    with orchestra_sup.Client(tree.run_dir) as client:
        plan_id = client.submit({"name": "slow", "task": [{"id": "nap", "run": "sleep 300"}]})
        with pytest.raises(CallTimeout, match=f"plan {plan_id}"):
            client.wait(plan_id, timeout_s=0.5)

        def running_lane() -> str | None:
            task = client.plan(plan_id)["tasks"][0]
            return task["lane"] if task["status"] == "running" else None

        client.cancel(str(wait_until(running_lane, 20, "the task's lane to run")))
        assert client.wait(plan_id, timeout_s=60)["tasks"][0]["status"] == "cancelled"


def test_a_pause_is_approved_and_another_rejected(tree: Tree) -> None:
    with orchestra_sup.Client(tree.run_dir) as client:
        yes, no = client.submit(gated("yes")), client.submit(gated("no"))
        recorded = client.approve(waiting_lane(client, yes))
        assert recorded["plan"] == yes and recorded["task"] == "deploy"
        client.reject(waiting_lane(client, no), "not on a Friday")
        approved, rejected = client.wait(yes, timeout_s=60), client.wait(no, timeout_s=60)
        assert approved["ok"] and approved["tasks"][0]["output_tail"] == "deployed\n"
        assert not rejected["ok"] and "not on a Friday" in rejected["tasks"][0]["error"]
        with pytest.raises(RemoteError) as nothing:
            client.approve(approved["tasks"][0]["lane"] or "no-such-lane")
        assert nothing.value.code is ErrorCode.NOT_FOUND


def test_the_errors_are_the_ones_ctl_maps(tree: Tree, tmp_path: Path) -> None:
    nowhere = orchestra_sup.Client(tmp_path / "no-tree")  # nothing connects until a call
    with nowhere, pytest.raises(TreeUnreachable, match="no tree is running at"):
        nowhere.plans()
    with orchestra_sup.Client(tree.run_dir) as client:
        before = len(client.plans())
        with pytest.raises(PlanError, match="task 'a': missing required key 'run'"):
            client.submit({"name": "bad", "task": [{"id": "a"}]})
        assert len(client.plans()) == before  # refused before anything was sent
        plan_id = client.submit(ECHO)
        with pytest.raises(RemoteError, match="runs the dag coordinator") as refused:
            client.message(plan_id, "hello")
        assert refused.value.code is ErrorCode.BAD_REQUEST
        with pytest.raises(RemoteError) as unknown:
            client.message("no-such-plan", "hello")
        assert unknown.value.code is ErrorCode.NOT_FOUND
        with pytest.raises(ValueError, match="over the 65536"):
            client.message(plan_id, "x" * 65537)
    with pytest.raises(ValueError, match="closed"):
        client.plans()
    ctl = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    shown = subprocess.run(
        [*ctl, "message", plan_id, "hello"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 2  # as ctl maps bad_request
    assert shown.stderr == (
        f"orchestra-sup: plan {plan_id} runs the dag coordinator: only a coordinator program's "
        "session takes messages\n"
    )


def test_the_async_client_takes_the_same_path(tree: Tree) -> None:
    async def drive() -> tuple[list[dict[str, Any]], Any, RemoteError]:
        async with orchestra_sup.AsyncClient(tree.run_dir) as client:
            ids = [await client.submit(ECHO) for _ in range(2)]
            gate = await client.submit(gated("async"))
            reports = await asyncio.gather(*(client.wait(i, timeout_s=60) for i in ids))
            listing = await client.call("list_dir", path=".")
            while not any(p["plan"] == gate for p in await client.pending()):
                await asyncio.sleep(0.05)  # polled under the test's own deadline (wait_for)
            lane = next(p["lane"] for p in await client.pending() if p["plan"] == gate)
            await client.approve(lane)
            reports.append(await client.wait(gate, timeout_s=60))
            try:
                await client.message(ids[0], "hello")
            except RemoteError as exc:
                return reports, listing, exc
            raise AssertionError("a dag plan took a message")

    reports, listing, refused = asyncio.run(asyncio.wait_for(drive(), 120))
    assert [r["tasks"][0]["output_tail"] for r in reports] == ["from-a-dict\n"] * 2 + ["deployed\n"]
    assert any(e["name"] == "README" for e in listing["entries"])
    assert refused.code is ErrorCode.BAD_REQUEST
    with pytest.raises(TreeUnreachable):
        asyncio.run(orchestra_sup.AsyncClient(tree.run_dir / "nowhere").plans())
