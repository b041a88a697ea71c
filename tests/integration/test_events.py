"""The tree's one event log on a real tree (issue 22, `state.events`): `ctl events --follow`
killed and resumed with `--since` sees every event once, across a coordinator SIGKILL and a
supervisor re-exec; an approval appears with who gave it, stamped by the tree."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup import Client
from tests.integration.harness import Tree, make_release, wait_until
from tests.integration.test_hitl_ctl import ctl as ctl_cli
from tests.integration.test_hitl_ctl import submit_gated

pytestmark = pytest.mark.integration


class Follower:
    """`ctl events --follow --json [--since N]` as a subprocess; its events, as they come."""

    def __init__(self, tree: Tree, since: int = 0) -> None:
        argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
        argv += ["events", "--follow", "--json", "--since", str(since)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def saw(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        found = wait_until(lambda: next((e for e in self.events if pred(e)), None), 30, what)
        assert isinstance(found, dict)
        return found

    def kill(self) -> list[dict[str, Any]]:
        """SIGKILL it mid-stream; what it printed in full lines before."""
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return list(self.events)


def whole_log(tree: Tree) -> list[dict[str, Any]]:
    lines = ctl_cli(tree, "events", "--json").stdout.splitlines()
    return [json.loads(line) for line in lines]


def test_a_follower_resumed_with_since_sees_every_event_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    tree = tree_factory(workspace=repo, shards=1)
    first = Follower(tree)
    first.saw(lambda e: e["kind"] == "child.running" and e["child"] == "shard-0", "shard-0 up")

    coordinator = tree.child("coordinator")
    assert coordinator.pid is not None
    os.kill(coordinator.pid, signal.SIGKILL)
    tree.wait_running("coordinator", coordinator.generation + 1)
    first.saw(
        lambda e: (
            e["kind"] == "child.exited"
            and e.get("child") == "coordinator"
            and "signal 9" in e.get("detail", "")
        ),
        "the coordinator's SIGKILL",
    )
    seen_before = first.kill()
    resume_at = seen_before[-1]["seq"]

    second = Follower(tree, since=resume_at)
    done = tree.rollover("supervisor", make_release(tmp_path, "again", version="9.0.0"))
    assert done.returncode == 0, done.stdout + done.stderr
    second.saw(lambda e: e["kind"] == "rollover.done", "the re-exec's rollover done")

    plan_id, entry = submit_gated(tree, tmp_path)  # after the re-exec: the follower went on
    approved = ctl_cli(tree, "approve", str(entry["lane"]))
    assert approved.returncode == 0, approved.stderr
    answer = second.saw(lambda e: e["kind"] == "hitl.answered", "the approval")
    user = pwd.getpwuid(os.getuid()).pw_name
    assert answer["who"] == f"{user} (uid {os.getuid()})"
    assert answer["plan"] == plan_id and answer["detail"].startswith("approve")
    second.saw(lambda e: e["kind"] == "plan.finished" and e.get("plan") == plan_id, "the end")
    seen_after = second.kill()

    log = whole_log(tree)
    seqs = [e["seq"] for e in log]
    assert seqs == list(range(1, len(seqs) + 1)), "the log has a gap or a repeat"
    followed = [e["seq"] for e in seen_before + seen_after]
    assert followed == seqs[: len(followed)], "the followers missed or repeated an event"
    assert seen_before + seen_after == log[: len(followed)]
    sources = {e["source"] for e in log}
    assert {"supervisor", "coordinator"} <= sources
    kinds = {e["kind"] for e in log}
    assert {"child.starting", "rollover.step", "plan.accepted", "task.succeeded"} <= kinds
    began = next(e["seq"] for e in log if e["kind"] == "rollover.step")
    ended = next(e["seq"] for e in log if e["kind"] == "rollover.done")
    readopted = [e for e in log if began < e["seq"] < ended and e["kind"].startswith("child.")]
    assert readopted == [], "a re-exec re-adopts its children: none of them started"

    with Client(run_dir=tree.run_dir) as sdk:  # the SDK's iterator reads the same log
        plans = [e for e in sdk.events(plan=plan_id)]
    assert [e["seq"] for e in plans] == [e["seq"] for e in log if e.get("plan") == plan_id]


def test_events_options_are_checked(tree: Tree) -> None:
    """A --since out of 0..2**63-1 is refused in one line before anything is sent."""
    for since in ("-1", str(2**64 - 1)):
        refused = ctl_cli(tree, "events", "--since", since)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    began = time.monotonic()
    listed = ctl_cli(tree, "events", "--plan", "nosuchplan")
    assert listed.returncode == 0 and listed.stdout == ""
    assert time.monotonic() - began < 30


def test_a_reader_is_told_of_events_trimmed_before_it_read_them(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """With `events_s = 0`, `ctl prune` trims the whole log; a reader resuming after seq 1 is
    told which events went, on stderr, and gets the rest."""
    config = tmp_path / "tree.toml"
    config.write_text("[retention]\nevents_s = 0\nevery_s = 3600\n")
    tree = tree_factory(shards=1, config=config)
    wait_until(lambda: len(whole_log(tree)) >= 3, 20, "a few events")
    assert ctl_cli(tree, "prune").returncode == 0
    resumed = ctl_cli(tree, "events", "--since", "1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    (line,) = resumed.stderr.splitlines()
    assert line.startswith("orchestra-sup: events 2..") and "were trimmed" in line, line
    kinds = [json.loads(x)["kind"] for x in resumed.stdout.splitlines()]
    assert kinds and kinds[0] == "retention.pruned"
