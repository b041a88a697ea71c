"""How ctl replies look: a plan's headline, tables of lanes and tasks (pending approvals,
failure classes), and the JSON shapes programs read."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import msgspec
import pytest
from rich.console import Console

from orchestra_sup.cli import render
from orchestra_sup.cli.render import plan_verdict
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes


def report(done: bool, *statuses: str) -> f.PlanReport:
    tasks = [f.TaskReport(id=f"t{i}", status=s) for i, s in enumerate(statuses)]
    ok = done and all(s == "succeeded" for s in statuses)
    return f.PlanReport(plan="p", id="1", done=done, ok=ok, tasks=tasks)


@pytest.mark.parametrize(
    ("plan", "verdict"),
    [
        (report(False, "running", "succeeded"), "running"),
        (report(True, "succeeded", "succeeded"), "ok"),
        (report(True, "succeeded", "cancelled"), "cancelled"),
        (report(True, "cancelled", "failed"), "FAILED"),
        (report(True, "skipped", "failed"), "FAILED"),
    ],
)
def test_plan_verdict(plan: f.PlanReport, verdict: str) -> None:
    assert plan_verdict(plan) == verdict


def printed(draw: Callable[[Console], None], width: int = 200) -> str:
    """What `draw` prints on a plain console `width` columns wide."""
    buf = io.StringIO()
    draw(Console(file=buf, width=width, markup=False, highlight=False, color_system=None))
    return buf.getvalue()


QUESTION = "Deploy build 41 to production?\nIt replaces build 40, " + "which " * 30 + "end"


def pending_lanes() -> f.LaneList:
    return f.LaneList(
        lanes=[
            f.LaneInfo(
                lane="p1-build-1", task="build", plan="p1", shard="shard-0", state="running",
                sandbox="/sb/1",
            ),
            f.LaneInfo(
                lane="p1-deploy-1", task="deploy", plan="p1", shard="", state="awaiting_approval",
                sandbox=None, question=QUESTION, since=1000.0,
            ),
        ]
    )  # fmt: skip


def test_lanes_table_shows_what_waits_for_a_human() -> None:
    """A pending approval is a row with its state and how long it has waited; under the table
    a line gives its question on one line, cut to `QUESTION_CHARS`, and one says how to
    answer it."""
    lanes = pending_lanes()
    text = printed(lambda c: render.lanes_table(lanes, c, now=1000.0 + 3 * 60 + 5), width=1000)
    row, asks, hint = [line for line in text.splitlines() if "p1-deploy-1" in line]
    assert "awaiting_approval" in row and "3 min" in row
    assert asks.startswith("p1-deploy-1 asks (3 min): Deploy build 41 to production? It ")
    assert asks.endswith("…") and len(asks.split(": ", 1)[1]) == render.QUESTION_CHARS
    assert (
        hint == "answer with: orchestra-sup ctl approve|reject|redirect|accept-partial p1-deploy-1"
    )
    (live,) = [line for line in text.splitlines() if "p1-build-1" in line]
    assert "running" in live and "shard-0" in live and "/sb/1" in live


def test_lanes_table_without_pending_has_no_hint() -> None:
    """No answer hint when nothing waits for a human; an empty list says so in words."""
    running = f.LaneList(lanes=pending_lanes().lanes[:1])
    assert "answer" not in printed(lambda c: render.lanes_table(running, c))
    empty = printed(lambda c: render.lanes_table(f.LaneList(lanes=[]), c))
    assert empty.strip() == "no live lanes, nothing awaits approval"


def test_lanes_table_names_the_children_that_did_not_answer() -> None:
    """What a silent child holds is missing from the table, and the table says whose."""
    partial = f.LaneList(lanes=pending_lanes().lanes[:1], unanswered=["coordinator", "shard-1"])
    text = printed(lambda c: render.lanes_table(partial, c))
    assert "no answer from coordinator, shard-1" in text
    empty = printed(lambda c: render.lanes_table(f.LaneList(lanes=[], unanswered=["shard-0"]), c))
    assert "no answer from shard-0" in empty
    assert shapes.lanes_json(partial)["unanswered"] == ["coordinator", "shard-1"]


def test_lanes_json_carries_the_whole_question_and_since() -> None:
    """`ctl lanes --json`: every lane has `question` and `since` (null when not waiting)."""
    lanes = shapes.lanes_json(pending_lanes())["lanes"]
    assert [(x["question"], x["since"]) for x in lanes] == [(None, None), (QUESTION, 1000.0)]
    assert all(
        set(x)
        == {"lane", "task", "plan", "shard", "state", "sandbox", "question", "since"}
        | {"accepts", "needs_retries"}
        for x in lanes
    )


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "0 s"),
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600 + 5 * 60, "1 h 05 min"),
        (86400 * 2 + 3600 * 4 + 59, "2 d 4 h"),
    ],
)
def test_waited(seconds: float, shown: str) -> None:
    """A wait in the unit a person reads at a glance; clock skew never shows as negative."""
    assert render.waited(seconds) == shown


@pytest.mark.parametrize(
    ("text", "limit", "shown"),
    [
        ("short", 10, "short"),
        ("two\nlines  and\ttabs", 40, "two lines and tabs"),
        ("abcdefghij", 10, "abcdefghij"),
        ("abcdefghijk", 10, "abcdefghi…"),
    ],
)
def test_one_line(text: str, limit: int, shown: str) -> None:
    """Whitespace collapsed, cut with an ellipsis to at most `limit` characters."""
    assert render.one_line(text, limit) == shown
    assert len(render.one_line(text, limit)) <= limit


def failing_report() -> f.PlanReport:
    answer = f.Answer(
        verdict="approve", grant=f.Budget(wall_s=60.0), responder="root", uid=0, at=5.0
    )
    tasks = [
        f.TaskReport(
            id="build", status="failed", exit_code=None, error="cpu budget spent",
            failure="budget_exhaustion", spent=f.Spend(wall_s=1.5, cpu_s=10.0, output_bytes=3),
            answers=[answer],
        ),
        f.TaskReport(
            id="deploy", status="awaiting_approval", lane="p1-deploy-1",
            question="Deploy\nnow?",
        ),
        f.TaskReport(id="test", status="pending", retry_at=99.5),
    ]  # fmt: skip
    return f.PlanReport(
        plan="p", id="p1", done=False, ok=False, tasks=tasks,
        spent=f.Spend(wall_s=1.5), budget=f.Budget(cpu_s=10.0),
    )  # fmt: skip


def test_plan_table_shows_failure_classes_and_questions() -> None:
    """Each task's failure class is a column; a task waiting for a human gets a line with its
    lane and question after the table, then how to answer."""
    text = printed(lambda c: render.plan_table(failing_report(), c))
    build, tail = [line for line in text.splitlines() if line.startswith("build ")]
    assert tail == "build failed with no output"
    assert "budget_exhaustion" in build and "cpu budget spent" in build
    assert "deploy asks (lane p1-deploy-1): Deploy now?" in text.splitlines()
    assert text.splitlines()[-1] == (
        "answer with: orchestra-sup ctl approve|reject|redirect|accept-partial p1-deploy-1"
    )


def test_plan_json_carries_the_issue_8_task_fields() -> None:
    """`ctl plan --json` / `run --json` have each task's failure, spent, question, answers and
    retry_at, and the plan's spent and budget."""
    out = shapes.plan_json(failing_report())
    build, deploy, test = out["tasks"]
    assert build["failure"] == "budget_exhaustion"
    assert build["spent"] == {"wall_s": 1.5, "cpu_s": 10.0, "output_bytes": 3}
    assert build["answers"] == [
        {
            "verdict": "approve",
            "text": "",
            "grant": {"wall_s": 60.0, "cpu_s": None, "output_bytes": None},
            "retries": 0,
            "responder": "root",
            "uid": 0,
            "at": 5.0,
        }
    ]
    assert (deploy["question"], deploy["answers"], deploy["failure"]) == ("Deploy\nnow?", [], None)
    assert test["retry_at"] == 99.5
    assert out["budget"] == {"wall_s": None, "cpu_s": 10.0, "output_bytes": None}
    assert out["spent"]["wall_s"] == 1.5
    assert "t" not in out


def test_recorded_line_and_json() -> None:
    """What a HITL answer did: one line for people, four keys for programs."""
    rec = f.HitlRecorded(
        lane="l", plan="p1", task="deploy", outcome="task deploy approved:\nit runs"
    )
    assert render.recorded_line(rec) == "plan p1: task deploy approved: it runs"
    assert shapes.recorded_json(rec) == {
        "lane": "l",
        "plan": "p1",
        "task": "deploy",
        "outcome": "task deploy approved:\nit runs",
    }


def test_status_says_what_was_refused_and_how_lanes_are_isolated() -> None:
    reply = f.StatusReply(
        supervisor_pid=10,
        version="0.1.0",
        run_dir="/run/x",
        state_dir="/state",
        workspace="/ws",
        children=[],
        ctl_refused=3,
        bad_frames=2,
        stale_frames=1,
        internal_errors=4,
        isolation="bwrap",
    )
    text = printed(lambda c: render.status_table(reply, c))
    assert "refused frames stale/bad 1/2" in text and "internal errors 4" in text
    assert "ctl refused 3" in text and "isolation bwrap" in text
    sup = shapes.status_json(reply)["supervisor"]
    assert (sup["ctl_refused"], sup["bad_frames"], sup["stale_frames"]) == (3, 2, 1)
    assert sup["internal_errors"] == 4
    assert sup["isolation"] == "bwrap"


def busy_status() -> f.StatusReply:
    """A status of 12 children with 7-digit pids, long paths, an exit and a restart each."""
    deep = "/tmp/" + "/".join(["a-deep-temporary-directory"] * 4)
    children = [
        f.ChildInfo(
            name=name, role=name.split("-")[0], pid=4194300 + i, generation=3, state=state,
            restarts=12, operator_restarts=1, uptime_s=18060, loop_lag_ms=(0.4, 12.5, 123.4),
            last_exit=f.ExitInfo(signal=9), release="/opt/other/bin/python3", version="0.1.0",
        )
        for i, (name, state) in enumerate(
            [("custodian", "running"), ("coordinator", "starting")]
            + [(f"shard-{k}", "backoff" if k % 3 else "running") for k in range(10)]
        )
    ]  # fmt: skip
    return f.StatusReply(
        supervisor_pid=4194000, version="0.1.0", run_dir="/run/orchestra-sup",
        state_dir=deep, workspace=f"{deep}/ws", children=children,
        loop_lag_ms=(0.25, 4.5, 9.0), release="/usr/bin/python3", isolation="bwrap",
        cpu="fifo 5, cpus 0", lane_cpu="cpu.idle, nice 10",
        metrics_url="http://127.0.0.1:9464/metrics",
    )  # fmt: skip


@pytest.mark.parametrize("width", [80, 120])
def test_status_fits_the_terminal_and_cuts_no_name_pid_or_state(width: int) -> None:
    """At 80 and 120 columns: no line is wider, every child's row has its name, pid and state
    whole, and a line names the columns left out; at 120 restarts and loop lag stay."""
    reply = busy_status()
    text = printed(lambda c: render.status_table(reply, c, width), width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    for child in reply.children:
        (line,) = [ln for ln in lines if ln.startswith(f"{child.name} ")]
        assert f" {child.pid} " in line and f" {child.state} " in f"{line} "
    assert any(line.startswith("not shown: ") for line in lines)
    for fact in (
        "supervisor pid 4194000",
        "isolation bwrap",
        "loop lag ms p50/p99/max 0.2/4.5/9.0",
        "refused frames stale/bad 0/0",
        "ctl refused 0",
    ):  # the figures are broken between facts, never inside one
        assert any(fact in line for line in lines), fact
    assert f"state dir {reply.state_dir}".replace(" ", "") in text.replace("\n", "").replace(
        " ", ""
    )
    if width == 120:
        assert "restarts" in text and "0.4/12.5/123.4" in text


def test_status_unbounded_keeps_each_line_whole() -> None:
    """No width (piped, --wide): the supervisor's figures on one line, each path on its own,
    every column of the table, nothing left out."""
    reply = busy_status()
    lines = printed(lambda c: render.status_table(reply, c, None), width=10_000).splitlines()
    assert lines[0] == (
        "supervisor pid 4194000  orchestra-sup 0.1.0  isolation bwrap  loop lag ms "
        "p50/p99/max 0.2/4.5/9.0  refused frames stale/bad 0/0  internal errors 0  ctl refused 0"
        "  cpu fifo 5, cpus 0  lanes' cpu cpu.idle, nice 10  real-time demotions 0"
    )
    assert lines[1:6] == [
        "run dir /run/orchestra-sup",
        f"state dir {reply.state_dir}",
        f"workspace {reply.workspace}",
        "interpreter /usr/bin/python3",
        "metrics http://127.0.0.1:9464/metrics",
    ]
    assert [h.header for h in render.STATUS_FIELDS] == re.split(r"\s{2,}", lines[6].strip())
    assert not any(line.startswith("not shown") for line in lines)


def test_plan_shows_failed_output_tails_and_warnings_safely() -> None:
    """Under the table: each warning on a line of its own, and the last `TAIL_LINES` lines of a
    failed task's output, control characters (an escape sequence) made harmless."""
    output = "".join(f"line {n}\n" for n in range(30)) + "\x1b]0;owned\x07cat: README.md: gone\n"
    tasks = [
        f.TaskReport(
            id="readme", status="failed", exit_code=1, error="exited with status 1",
            output_tail=output, warnings=["partial work: lane x was interrupted\nand re-run"],
        ),
        f.TaskReport(id="quiet", status="failed", error="timed out after 5 s"),
        f.TaskReport(id="fine", status="succeeded", output_tail="all good\n"),
    ]  # fmt: skip
    report = f.PlanReport(plan="p", id="p1", done=True, ok=False, tasks=tasks)
    lines = printed(lambda c: render.plan_table(report, c, 80), width=80).splitlines()
    assert "readme warning: partial work: lane x was interrupted and re-run" in lines
    at = lines.index(f"readme failed; the last {render.TAIL_LINES} lines of its output:")
    shown = lines[at + 1 : at + 1 + render.TAIL_LINES]
    assert shown[0] == "  line 21" and shown[-1] == "  \ufffd]0;owned\ufffdcat: README.md: gone"
    assert "\x1b" not in "".join(lines)
    assert "quiet failed with no output" in lines
    assert not any(line.startswith("fine failed") or "all good" in line for line in lines)


def test_answer_hints_offer_only_what_each_pause_takes() -> None:
    """One kind of pause: one line, the lane id in it when one pause is meant; an approval has
    no accept-partial; a review with no retry left offers accept-partial or approve with
    --retries; kinds that differ get a line each naming their lanes; a coordinator that does
    not say what a pause takes gets all four answers offered."""
    command = "osup ctl --run-dir /r"
    approval = ["approve", "reject", "redirect"]
    assert render.answer_hints([("p-a-1", approval, False)], command) == [
        "answer with: osup ctl --run-dir /r approve|reject|redirect p-a-1"
    ]
    assert render.answer_hints([("p-a-1", approval, False), ("p-b-1", approval, False)]) == [
        "answer with: orchestra-sup ctl approve|reject|redirect LANE"
    ]
    mixed = [
        ("p-a-1", approval, False),
        ("p-b-1", ["approve", "accept_partial"], True),
        ("p-c-1", approval, False),
    ]
    assert render.answer_hints(mixed, command) == [
        "answer p-a-1, p-c-1 with: osup ctl --run-dir /r approve|reject|redirect LANE",
        "answer with: osup ctl --run-dir /r accept-partial p-b-1, or approve p-b-1 --retries N",
    ]
    assert render.answer_hints([("p-a-1", [], False)]) == [
        "answer with: orchestra-sup ctl approve|reject|redirect|accept-partial p-a-1"
    ]
    assert render.answer_hints([]) == []


def test_status_shows_the_hosts_under_the_children_and_says_none_for_one_host() -> None:
    """A tree with `[cluster] listen`: one line for where hosts join, how many did and how many
    were refused, then a row per host that fits 80 columns; a tree without: no cluster line."""
    shards = [
        f.HostShard(name=f"shard-{i}", state="running", generation=1, pid=900 + i, capacity=8)
        for i in range(2)
    ]
    host = f.HostInfo(
        name="host-a", state="joined", boot="0f3c9a", version="0.1.0", pid=4194301,
        heard_s=0.42, joined_s=61.0, shards=shards, capabilities=["gpu", "remote"], lease=0x7F3A,
    )  # fmt: skip
    reply = msgspec.structs.replace(
        busy_status(), cluster_listen="tcp://10.0.0.2:7450", hosts=[host], hosts_refused=2
    )
    text = printed(lambda c: render.status_table(reply, c, 80), width=80)
    assert "cluster tcp://10.0.0.2:7450: 1 of 1 hosts joined, 2 refused" in text
    (row,) = [line for line in text.splitlines() if line.startswith("host-a ")]
    assert " joined " in row and " 4194301 " in row and " 2/2 " in row
    assert max(len(line) for line in text.splitlines()) <= 80
    assert shapes.status_json(reply)["cluster"]["hosts"][0]["lease"] == 0x7F3A
    assert "cluster" not in printed(lambda c: render.status_table(busy_status(), c, 80), width=80)
