"""`ctl top`: what a frame looks like for people and programs, with and without the figures a
child reports in its heartbeats, and how refreshes keep the last answers when the tree goes away."""

from __future__ import annotations

import io
import json
import re

import msgspec
from rich.console import Console

from orchestra_sup.cli import top
from orchestra_sup.errors import ErrorCode, RemoteError, TreeUnreachable
from orchestra_sup.protocol import frames as f

NOW = 1_700_000_000.0


def child(name: str, role: str, **extra: object) -> f.ChildInfo:
    base: dict[str, object] = {
        "name": name,
        "role": role,
        "pid": 4242,
        "generation": 3,
        "state": "running",
        "restarts": 2,
        "operator_restarts": 0,
        "uptime_s": 125.0,
    }
    return f.ChildInfo(**{**base, **extra})  # type: ignore[arg-type]


def status(children: list[f.ChildInfo], **extra: object) -> f.StatusReply:
    base: dict[str, object] = {
        "supervisor_pid": 100,
        "version": "9.9.9",
        "run_dir": "/run/osup",
        "state_dir": "/var/lib/osup",
        "workspace": "/srv/ws",
        "children": children,
        "loop_lag_ms": (0.25, 4.5, 9.0),
        "isolation": "bwrap",
    }
    return f.StatusReply(**{**base, **extra})  # type: ignore[arg-type]


FULL = status(
    [
        child(
            "coordinator",
            "coordinator",
            loop_lag_ms=(0.5, 2.25, 3.0),
            relay_ms=(1.25, 8.5, 12.0),
            inbox_depth=7,
            persist_depth=12,
        ),
        child(
            "shard-0",
            "shard",
            loop_lag_ms=(0.75, 1.5, 2.0),
            lanes={"running": 3, "awaiting_approval": 1},
            persist_depth=5,
        ),
    ],
    rollover="r1 of shards for 3 s: shard-0 moving",
    metrics_url="http://127.0.0.1:9108/metrics",
)
BARE = status([child("shard-1", "shard"), child("custodian", "custodian", pid=None)])
LANES = f.LaneList(
    lanes=[
        f.LaneInfo(
            lane="p1-build-1",
            task="build",
            plan="p1",
            shard="shard-0",
            state="running",
            sandbox=None,
        )
    ],
    unanswered=["shard-1"],
)


def shown(renderable: object, width: int = 220) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, markup=False, highlight=False, color_system=None)
    console.print(renderable)
    return buf.getvalue()


def row(text: str, name: str) -> list[str]:
    """The cells of the table row that starts with `name` (cells are two or more spaces
    apart; none of these has two spaces inside)."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{name} "))
    return re.split(r"\s{2,}", line.strip())


def test_every_reported_figure_is_shown() -> None:
    """A child's loop lag, relay latency, lanes by state, inbox and persistence depths, and the
    supervisor's lag, isolation, rollover and metrics URL are all on screen."""
    text = shown(top.view(top.Frame(status=FULL, lanes=LANES), NOW))
    assert "supervisor pid 100" in text
    assert "loop lag p50/p99 0.2/4.5 ms" in text  # 0.25 rounds to even
    assert "isolation bwrap" in text
    assert "rollover: r1 of shards for 3 s: shard-0 moving" in text
    assert "metrics: http://127.0.0.1:9108/metrics" in text
    assert row(text, "coordinator") == [
        "coordinator",
        "4242",
        "3",
        "running",
        "2 min",
        "2",
        "0.5/2.2",
        "1.2/8.5",
        "-",
        "7",
        "12",
    ]
    assert row(text, "shard-0")[6:] == ["0.8/1.5", "-", "1 awaiting_approval, 3 running", "-", "5"]
    assert "p1-build-1" in text
    assert "no answer from shard-1" in text


def test_figures_not_reported_are_dashes() -> None:
    """Before a heartbeat (or in a role without them) loop lag, relay, lanes and inbox are "-";
    a child that is down has no pid, uptime or queue; no metrics or rollover line is made up."""
    text = shown(top.view(top.Frame(status=BARE, lanes=None), NOW))
    assert row(text, "shard-1")[4:] == ["2 min", "2", "-", "-", "-", "-", "0"]
    assert row(text, "custodian") == ["custodian", "-", "3", "running", "-", "2"] + ["-"] * 5
    assert "metrics:" not in text
    assert "rollover:" not in text


def test_unreachable_frame_keeps_the_last_answers_and_says_how_old() -> None:
    """The view says the tree is unreachable, that it retries, and how old what it shows is;
    JSON carries the error and no stale status."""
    frame = top.Frame(status=FULL, lanes=LANES, error="no tree is running at /r", age_s=4.2)
    text = shown(top.view(frame, NOW, header="q quits"))
    assert "unreachable: no tree is running at /r (retrying; shown: 4 s old)" in text
    assert row(text, "coordinator")[0] == "coordinator"
    assert text.startswith("q quits")
    assert top.frame_json(frame) == {"status": None, "lanes": None, "error": frame.error}


def test_frame_json_shapes() -> None:
    """--json: the shapes of `ctl status --json` and `ctl lanes --json`, side by side."""
    data = json.loads(json.dumps(top.frame_json(top.Frame(status=FULL, lanes=LANES))))
    assert data["error"] is None
    assert data["status"]["supervisor"]["loop_lag_ms"] == [0.25, 4.5, 9.0]
    coordinator = data["status"]["children"][0]
    assert coordinator["relay_ms"] == [1.25, 8.5, 12.0]
    assert coordinator["inbox_depth"] == 7
    assert data["status"]["children"][1]["lanes"] == {"running": 3, "awaiting_approval": 1}
    assert data["lanes"]["unanswered"] == ["shard-1"]
    assert data["lanes"]["lanes"][0]["lane"] == "p1-build-1"


def test_lanes_by_state() -> None:
    """Counts by state, sorted by state name, states with no lane left out (a shard reports
    every state, zeros too); all zero is "0"; nothing reported is a dash."""
    assert top.lanes_by_state({"running": 3, "awaiting_approval": 1, "starting": 0}) == (
        "1 awaiting_approval, 3 running"
    )
    assert top.lanes_by_state({"running": 0, "starting": 0}) == "0"
    assert top.lanes_by_state({}) == "-"


def test_how_to_quit_survives_a_screen_too_small_for_the_view() -> None:
    """The live view cuts what does not fit at the bottom: the quit hint is the first line, so
    a terminal too short for every row still says how to leave."""
    console = Console(file=io.StringIO(), width=80, height=6, color_system=None)
    lines = console.render_lines(
        top.view(top.Frame(status=FULL, lanes=LANES), NOW, header="q quits"),
        console.options,
        pad=False,
    )
    assert "".join(seg.text for seg in lines[0]).startswith("q quits")


class Script:
    """A ctl transport whose answers are given in order; each call advances a fake clock by
    `cost_s` and records (request type, timeout)."""

    def __init__(self, answers: list[f.Body | Exception], cost_s: float = 0.0) -> None:
        self.answers = answers
        self.cost_s = cost_s
        self.now = 0.0
        self.asked: list[tuple[str, float]] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, body: f.Body, timeout_s: float) -> f.Body:
        self.asked.append((type(body).__name__, timeout_s))
        self.now += self.cost_s
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_refresh_keeps_last_answers_across_an_outage() -> None:
    """Unreachable after an answer: the frame has the error, the last answers and their age;
    the next answer clears the error."""
    gone = TreeUnreachable("the tree at /r did not answer within 2 s")
    script = Script([FULL, LANES, gone, BARE, f.LaneList(lanes=[])], cost_s=0.5)
    watcher = top.Watcher(script, timeout_s=2.0, clock=script.clock)
    assert watcher.poll() == top.Frame(status=FULL, lanes=LANES)
    lost = watcher.poll()
    assert (lost.status, lost.lanes, lost.error) == (FULL, LANES, str(gone))
    assert lost.age_s == 0.5  # answered at t=1.0, lost at t=1.5
    back = watcher.poll()
    assert (back.status, back.error) == (BARE, None)


def test_status_and_lanes_share_one_deadline() -> None:
    """Lanes get what status left of the refresh's timeout, and never less than the minimum."""
    script = Script([FULL, LANES, FULL, LANES], cost_s=0.75)
    watcher = top.Watcher(script, timeout_s=2.0, clock=script.clock)
    watcher.poll()
    assert script.asked == [("CtlStatus", 2.0), ("CtlLanes", 1.25)]
    slow = top.Watcher(script, timeout_s=0.5, clock=script.clock)
    slow.poll()
    assert script.asked[-1] == ("CtlLanes", top.MIN_LANES_WAIT_S)


def test_first_refresh_raises_what_the_tree_said() -> None:
    """`poll_or_raise` (the first refresh of `ctl top`) lets the caller report the error."""
    refused = RemoteError(ErrorCode.FORBIDDEN, "uid 7 is not the tree owner's")
    watcher = top.Watcher(Script([refused]), timeout_s=1.0)
    try:
        watcher.poll_or_raise()
    except RemoteError as exc:
        assert exc is refused
    else:
        raise AssertionError("poll_or_raise swallowed the error")


def test_the_view_fits_80_columns_and_cuts_no_name_pid_or_state() -> None:
    """At 80 columns (the live view gets the terminal's width): every line fits, each child's
    row has its name, pid and state whole, a line names the columns left out, and the
    supervisor's line is broken between its facts, never inside one."""
    lanes = f.LaneList(
        lanes=[
            msgspec.structs.replace(
                LANES.lanes[0], sandbox="/tmp/" + "/".join(["a-deep-directory"] * 6) + "/sb"
            )
        ]
    )
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(top.view(top.Frame(status=FULL, lanes=lanes), NOW, "q quits", width=80))
    lines = console.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    for c in FULL.children:
        cells = row(console.file.getvalue(), c.name)
        assert cells[:2] == [c.name, str(c.pid)] and c.state in cells
    assert any(line.startswith("not shown: ") and "persist q" in line for line in lines)
    for fact in ("supervisor pid 100", "loop lag p50/p99 0.2/4.5 ms", "run dir /run/osup"):
        assert any(fact in line for line in lines), fact
    assert {"shard-0", "running"} <= set(row(console.file.getvalue(), "p1-build-1"))
    assert any(line.startswith("not shown: ") and "sandbox" in line for line in lines)
