"""The event log (`state.events`): one sequence across writers in two processes, pages that
resume without a gap or a repeat, a plan's filter, and the front trimmed by age."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from orchestra_sup.state.events import DB, EventLog

WRITER = """
import sys
from pathlib import Path
from orchestra_sup.state.events import DB, EventLog
log = EventLog.open(Path(sys.argv[1]), "other")
for i in range(int(sys.argv[2])):
    log.emit("task.running", plan="p2", task=str(i))
log.close()
"""


def test_two_processes_share_one_sequence_without_holes(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path, "here")
    other = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "400"])
    for i in range(400):
        log.emit("task.running", plan="p1", task=str(i))
        if i % 50 == 0:
            time.sleep(0.001)  # let the other writer's batches in between ours
    assert other.wait(60) == 0
    log.close()
    log = EventLog.open(tmp_path, "here")
    try:
        events, since = [], 0
        while True:
            page = log.page(since, limit=97)
            events += page.events
            if page.next >= page.last:
                break
            since = page.next
        assert [e.seq for e in events] == list(range(1, 801))
        for source, plan in (("here", "p1"), ("other", "p2")):
            mine = [e for e in events if e.source == source]
            assert [e.task for e in mine] == [str(i) for i in range(400)]
            assert {e.plan for e in mine} == {plan}
        only = log.page(0, limit=1000, plan="p2")
        assert [e.plan for e in only.events] == ["p2"] * 400
        assert (only.first, only.last) == (1, 800)
    finally:
        log.close()


def test_the_front_is_trimmed_by_age_and_the_rest_keeps_its_seqs(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path, "here")
    for i in range(10):
        log.emit("child.running", child=f"c{i}")
    log.close()
    log = EventLog.open(tmp_path, "here")
    try:
        assert log.trim(time.time() - 3600) == 0  # nothing that old
        assert log.trim(time.time() + 1) == 10
        log.emit("child.running", child="after")
        log.close()
        log = EventLog.open(tmp_path, "here")
        page = log.page(0)
        assert [(e.seq, e.child) for e in page.events] == [(11, "after")]
        assert (page.first, page.last) == (11, 11)
    finally:
        log.close()


def test_one_process_shares_one_environment(tmp_path: Path) -> None:
    """Colocated, the supervisor and the coordinator open the log twice in one process: one
    LMDB environment, closed with its last user."""
    a = EventLog.open(tmp_path, "supervisor")
    b = EventLog.open(tmp_path, "coordinator")
    assert a.store is b.store
    a.emit("child.running", child="x")
    a.close()
    b.emit("plan.accepted", plan="p")
    b.close()
    c = EventLog.open(tmp_path, "reader")
    try:
        assert [(e.source, e.kind) for e in c.page(0).events] == [
            ("supervisor", "child.running"),
            ("coordinator", "plan.accepted"),
        ]
    finally:
        c.close()


def test_an_unreadable_row_is_passed_over_and_trimmed(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path, "here")
    try:
        log.emit("child.running", child="a")
        log.store.append(DB, b"", b"\xc1 not msgpack")
        log.emit("child.running", child="b")
        log.close()
        log = EventLog.open(tmp_path, "here")
        page = log.page(0)
        assert [(e.seq, e.child) for e in page.events] == [(1, "a"), (3, "b")]
        assert page.next == 3
        assert log.trim(0.0) == 0  # the first row is newer: the front stops there
    finally:
        log.close()
