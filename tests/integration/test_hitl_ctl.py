"""HITL answers through the ctl socket of a real tree: who answered is what the connection
says (ARCHITECTURE.md §11 invariant 9), and `ctl lanes` / `ctl approve` as an operator uses
them."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import zmq

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from tests.integration.harness import Tree, wait_until

pytestmark = pytest.mark.integration

APPROVE_PLAN = 'name = "gate"\n[[task]]\nid = "deploy"\nrun = "echo deployed"\napprove = true\n'


def ctl(tree: Tree, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def submit_gated(tree: Tree, tmp_path: Path) -> tuple[str, dict[str, object]]:
    """Submit a plan whose one task waits for approval; return its id and its pending entry
    as `ctl lanes --json` lists it (no lane runs it yet: shard "")."""
    plan = tmp_path / "gate.toml"
    plan.write_text(APPROVE_PLAN)
    plan_id = json.loads(ctl(tree, "submit", str(plan), "--json").stdout)["id"]

    def pending() -> dict[str, object] | None:
        lanes = json.loads(ctl(tree, "lanes", "--json").stdout)["lanes"]
        return next((x for x in lanes if x["plan"] == plan_id), None)

    entry = wait_until(pending, 20, "the task to wait for approval")
    assert isinstance(entry, dict)
    return plan_id, entry


def raw_request(tree: Tree, body: dict[str, object]) -> f.Body:
    """Send `body` (a hand-built map, as a hostile client would) to the tree's ctl socket over a
    plain DEALER and return the decoded reply body."""
    env = [PROTOCOL_VERSION, "raw.1", None, "ctl", 0, 10.0, None, body]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(f"ipc://{tree.run_dir / 'ctl.ipc'}")
        sock.send(msgspec.msgpack.encode(env))
        assert sock.poll(15_000), "no reply from the ctl socket"
        reply = Codec().decode(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()
    assert reply.corr == "raw.1"
    return reply.body


def test_responder_is_stamped_from_the_connection_not_the_frame(tree: Tree, tmp_path: Path) -> None:
    """A `CtlRespond` sent raw with `"uid": 4242, "responder": "mallory"` is recorded by the
    coordinator as answered by this process's real uid and user name."""
    plan_id, entry = submit_gated(tree, tmp_path)
    assert entry["state"] == "awaiting_approval" and entry["shard"] == ""
    assert entry["question"] and isinstance(entry["since"], float)
    hostile = {
        "t": "ctl_respond",
        "lane": entry["lane"],
        "verdict": "approve",
        "uid": 4242,
        "responder": "mallory",
    }
    recorded = raw_request(tree, hostile)
    assert isinstance(recorded, f.HitlRecorded), recorded
    assert (recorded.plan, recorded.task) == (plan_id, "deploy")

    report = tree.wait_plan(plan_id)
    (task,) = report.tasks
    (answer,) = task.answers
    assert (answer.uid, answer.responder) == (os.getuid(), pwd.getpwuid(os.getuid()).pw_name)
    assert answer.verdict == "approve"
    assert report.ok


def test_operator_answers_with_the_cli(tree: Tree, tmp_path: Path) -> None:
    """`ctl reject LANE --reason` prints what was recorded in one line; answering a lane that
    nothing waits on is one line and exit 2."""
    plan_id, entry = submit_gated(tree, tmp_path)
    table = ctl(tree, "lanes")
    assert table.returncode == 0 and "awaiting_approval" in table.stdout
    assert str(entry["lane"]) in table.stdout and "approve|reject" in table.stdout

    done = ctl(tree, "reject", str(entry["lane"]), "--reason", "not today", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"] == plan_id

    gone = ctl(tree, "approve", str(entry["lane"]))
    assert gone.returncode == 2 and "Traceback" not in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1, gone.stderr

    report = tree.wait_plan(plan_id)
    (task,) = report.tasks
    assert [a.verdict for a in task.answers] == ["reject"] and task.answers[0].text == "not today"


def answer_hint(tree: Tree, lane: str) -> str:
    """The command `ctl lanes` tells to answer `lane` with."""
    table = ctl(tree, "lanes")
    assert table.returncode == 0, table.stderr
    lines = [ln for ln in table.stdout.splitlines() if ln.startswith("answer") and lane in ln]
    assert len(lines) == 1, table.stdout
    return lines[0].split(" with: ", 1)[1]


def test_the_answer_hint_pastes_and_offers_only_what_the_pause_takes(
    tree: Tree, tmp_path: Path
) -> None:
    """`ctl --run-dir DIR lanes`: the hint repeats DIR and the program as it was run, so pasted
    as it is (a verb picked) in another directory it is answered. An approval is offered
    approve, reject and redirect (not accept-partial, which it refuses); a failed attempt with
    no retry left, accept-partial or approve with --retries (not reject, which needs one)."""
    plan = tmp_path / "two.toml"
    plan.write_text(
        'name = "two"\n'
        '[[task]]\nid = "gate"\nrun = "echo deployed"\napprove = true\n'
        '[[task]]\nid = "flaky"\nrun = "exit 3"\non_failure = "pause"\n'
    )
    plan_id = json.loads(ctl(tree, "submit", str(plan), "--json").stdout)["id"]

    def pauses() -> dict[str, str] | None:
        lanes = json.loads(ctl(tree, "lanes", "--json").stdout)["lanes"]
        waiting = {x["task"]: x["lane"] for x in lanes if x["state"] == "awaiting_approval"}
        return waiting if len(waiting) == 2 else None

    lanes = wait_until(pauses, 30, "both tasks to wait for an answer")
    assert isinstance(lanes, dict)
    gate = answer_hint(tree, lanes["gate"])
    assert f"ctl --run-dir {tree.run_dir} approve|reject|redirect {lanes['gate']}" in gate
    assert "accept-partial" not in gate
    flaky = answer_hint(tree, lanes["flaky"])
    assert flaky.endswith(
        f"ctl --run-dir {tree.run_dir} accept-partial {lanes['flaky']}, "
        f"or approve {lanes['flaky']} --retries N"
    )
    shown = ctl(tree, "plan", plan_id)  # the plan's view offers the same, lane ids filled in
    hints = [line for line in shown.stdout.splitlines() if line.startswith("answer")]
    assert hints == [f"answer with: {gate}", f"answer with: {flaky}"]
    assert f"gate asks (lane {lanes['gate']}):" in shown.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for pasted in (gate.replace("approve|reject|redirect", "approve"), flaky.split(", or ")[0]):
        done = subprocess.run(
            shlex.split(pasted), cwd=elsewhere, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (pasted, done.stderr)
    report = tree.wait_plan(plan_id)
    assert [t.status for t in report.tasks] == ["succeeded", "succeeded"]
    assert [a.verdict for t in report.tasks for a in t.answers] == ["approve", "accept_partial"]
