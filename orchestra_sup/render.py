"""How ctl replies look: JSON for programs (stable shapes), rich tables for people."""

from __future__ import annotations

import json
import time
from typing import IO, Any

import msgspec
from rich.console import Console, Group, RenderableType
from rich.table import Column, Table
from rich.text import Text
from rich.tree import Tree

from orchestra_sup.protocol import frames as f


def status_json(reply: f.StatusReply) -> dict[str, Any]:
    return {
        "supervisor": {
            "pid": reply.supervisor_pid,
            "version": reply.version,
            "release": reply.release,
            "rollover": reply.rollover,
            "isolation": reply.isolation,
            "run_dir": reply.run_dir,
            "state_dir": reply.state_dir,
            "workspace": reply.workspace,
            "loop_lag_ms": list(reply.loop_lag_ms),
            "bad_frames": reply.bad_frames,
            "stale_frames": reply.stale_frames,
            "internal_errors": reply.internal_errors,
            "ctl_refused": reply.ctl_refused,
            "metrics_url": reply.metrics_url,
            "descriptors": msgspec.to_builtins(reply.descriptors),
            "ctl_connections": reply.ctl_connections,
            "ctl_connections_max": reply.ctl_connections_max,
        },
        "children": msgspec.to_builtins(reply.children),
    }


def plan_json(report: f.PlanReport) -> dict[str, Any]:
    out = msgspec.to_builtins(report)
    out.pop("t", None)
    return out


def rollover_json(report: f.RolloverReport) -> dict[str, Any]:
    """{"id", "target", "release": {"python", "version", "proto_min", "proto_max"}, "done",
    "ok", "error", "events": [{"seq", "at_s", "child", "text", "took_s"}]}."""
    out = msgspec.to_builtins(report)
    out.pop("t", None)
    return out


def rollover_line(event: f.RolloverEvent) -> str:
    """One rollover step for people: "  +1.234 s shard-0: lane x moved (0.012 s)"."""
    who = f"{event.child}: " if event.child else ""
    took = f" ({event.took_s:.3f} s)" if event.took_s is not None else ""
    return f"+{event.at_s:7.3f} s  {who}{event.text}{took}"


def recorded_json(reply: f.HitlRecorded) -> dict[str, Any]:
    """{"lane", "plan", "task", "outcome"}: what a HITL answer did."""
    return {"lane": reply.lane, "plan": reply.plan, "task": reply.task, "outcome": reply.outcome}


def recorded_line(reply: f.HitlRecorded) -> str:
    """What a HITL answer did, in one line: "plan 3f2a9c1b7d44: task deploy approved: it runs"
    (the coordinator's `outcome`, whitespace collapsed)."""
    return f"plan {reply.plan}: {one_line(reply.outcome, 500)}"


def lanes_json(reply: f.LaneList) -> dict[str, Any]:
    """{"lanes": [{"lane", "task", "plan", "shard", "state", "sandbox", "question", "since"}],
    "unanswered": [name, ...]}: `question` and `since` (Unix seconds) are set on a lane that
    waits for a human (state "awaiting_approval"), else null; `shard` is "" for a task no lane
    holds yet; `unanswered` names the children whose lanes are missing."""
    return {"lanes": msgspec.to_builtins(reply.lanes), "unanswered": list(reply.unanswered)}


def tree_json(reply: f.StatusReply) -> dict[str, Any]:
    """The tree nested: {"name", "strategy", "max_restarts", "max_seconds", "children": [...]},
    a worker being {"name", "role", "pid", "generation", "state"}."""
    workers = {c.name: c for c in reply.children}
    sups = {s.name: s for s in reply.supervisors}

    def node(name: str) -> dict[str, Any]:
        if name in sups:
            s = sups[name]
            return {
                "name": s.name,
                "strategy": s.strategy,
                "max_restarts": s.max_restarts,
                "max_seconds": s.max_seconds,
                "children": [node(c) for c in s.children],
            }
        c = workers[name]
        return {
            "name": c.name,
            "role": c.role,
            "pid": c.pid,
            "generation": c.generation,
            "state": c.state,
        }

    roots = [s.name for s in reply.supervisors if s.parent is None]
    return node(roots[0]) if roots else {}


def tree_text(reply: f.StatusReply, console: Console) -> None:
    tree = tree_json(reply)

    def label(n: dict[str, Any]) -> str:
        if "children" in n:
            return (
                f"{n['name']} (supervisor, {n['strategy']}, "
                f"{n['max_restarts']} restarts in {n['max_seconds']:g} s)"
            )
        return f"{n['name']} pid={n['pid'] or '-'} gen={n['generation']} {n['state']}"

    def add(branch: Tree, n: dict[str, Any]) -> None:
        for child in n.get("children", []):
            add(branch.add(label(child)), child)

    if not tree:
        console.print("(no supervision tree reported)")
        return
    root = Tree(f"orchestra-sup pid={reply.supervisor_pid} {reply.version} / {label(tree)}")
    add(root, tree)
    console.print(root)


def status_table(reply: f.StatusReply, console: Console) -> None:
    console.print(
        f"supervisor pid {reply.supervisor_pid}, version {reply.version} ({reply.release}), "
        f"run dir {reply.run_dir}, loop lag p50/p99/max ms {_lag(reply.loop_lag_ms)}, "
        f"refused frames stale/bad {reply.stale_frames}/{reply.bad_frames}, "
        f"internal errors {reply.internal_errors}, "
        f"ctl refused {reply.ctl_refused}, isolation {reply.isolation or '?'}"
    )
    if reply.descriptors is not None:
        console.print(
            f"descriptors {fds(reply.descriptors)}, ctl connections "
            f"{reply.ctl_connections} of {reply.ctl_connections_max} "
            f"(refused {reply.descriptors.refused})"
        )
    if reply.metrics_url:
        console.print(f"metrics {reply.metrics_url}")
    if reply.rollover is not None:
        console.print(f"rollover {reply.rollover}")
    table = Table(
        Column("name", no_wrap=True),
        "role",
        "pid",
        "gen",
        "state",
        "restarts",
        "op restarts",
        "uptime s",
        "last exit",
        "loop lag ms p50/p99/max",
        "release",
        "refused stale/bad",
        "internal",
        "fds",
    )
    for c in reply.children:
        last = "-"
        if c.last_exit is not None:
            last = (
                f"signal {c.last_exit.signal}"
                if c.last_exit.signal is not None
                else f"status {c.last_exit.status}"
            )
        table.add_row(
            c.name,
            c.role,
            str(c.pid or "-"),
            str(c.generation),
            c.state,
            str(c.restarts),
            str(c.operator_restarts),
            f"{c.uptime_s:.1f}",
            last,
            "-" if c.loop_lag_ms is None else _lag(c.loop_lag_ms),
            _release(c, reply.release),
            f"{c.stale_frames}/{c.bad_frames}",
            str(c.internal_errors),
            "-" if c.descriptors is None else fds(c.descriptors),
        )
    console.print(table)


def fds(d: f.Descriptors) -> str:
    """A process's descriptors for people: "31/1024", and "31/1024 shut: ctl" while a socket
    of it takes no new connections."""
    shut = f" shut: {', '.join(d.shut)}" if d.shut else ""
    return f"{d.open}/{d.limit}{shut}"


def _release(child: f.ChildInfo, supervisor_release: str) -> str:
    """A child's version, and its interpreter when it is not the supervisor's."""
    if not child.release:
        return "-"
    version = child.version or "?"
    return version if child.release == supervisor_release else f"{version} {child.release}"


def _lag(figures: tuple[float, float, float]) -> str:
    return "/".join(f"{ms:.1f}" for ms in figures)


def plan_verdict(report: f.PlanReport) -> str:
    """ "running", "ok", "cancelled" (every task that did not succeed was cancelled on request)
    or "FAILED"."""
    return _verdict(report.done, report.ok, {t.status for t in report.tasks})


def _verdict(done: bool, ok: bool, statuses: set[str]) -> str:
    if not done:
        return "running"
    if ok:
        return "ok"
    return "cancelled" if statuses - {"succeeded"} == {"cancelled"} else "FAILED"


QUESTION_CHARS = 60
"""How much of a HITL question a table shows (`ctl lanes`); `--json` has all of it."""
AWAITING = "awaiting_approval"
"""The state (of a lane) and status (of a task) of work that waits for a human."""
ANSWER_HINT = "answer with: orchestra-sup ctl approve|reject|redirect|accept-partial LANE"


def one_line(text: str, limit: int) -> str:
    """`text` with its whitespace runs (newlines too) collapsed to one space, cut to at most
    `limit` characters with a trailing "…" when it was longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def waited(seconds: float) -> str:
    """A wait for people: "42 s", "7 min", "3 h 05 min", "2 d 4 h" (negative: clock skew
    between the hosts, shown as "0 s")."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def plan_table(report: f.PlanReport, console: Console) -> None:
    """The plan's verdict, a table of its tasks (the failure class of each failed one), then one
    line per task that waits for a human: its lane (to answer with) and its question."""
    console.print(f"plan {report.plan} ({report.id}): {plan_verdict(report)}")
    table = Table(
        Column("task", no_wrap=True),
        Column("status", no_wrap=True),
        Column("failure", no_wrap=True),
        "exit",
        "attempts",
        Column("shard", no_wrap=True),
        Column("lane", no_wrap=True),
        "s",
        "commit",
        "error",
        "warnings",
    )
    for t in report.tasks:
        table.add_row(
            t.id,
            t.status,
            t.failure or "-",
            "-" if t.exit_code is None else str(t.exit_code),
            str(t.attempts),
            t.shard or "-",
            t.lane or "-",
            f"{t.duration_s:.2f}",
            (t.commit or "-")[:10],
            t.error or "",
            str(len(t.warnings)) if t.warnings else "",  # in full with --json
        )
    console.print(table)
    asking = [t for t in report.tasks if t.question is not None]
    for t in asking:
        console.print(f"{t.id} asks (lane {t.lane or '-'}): {one_line(t.question or '', 200)}")
    if asking:
        console.print(ANSWER_HINT)


def plans_table(reply: f.PlanList, console: Console) -> None:
    if not reply.plans:
        console.print("no plans")
        return
    table = Table(
        Column("id", no_wrap=True),
        "plan",
        Column("submitted", no_wrap=True),
        "state",
        "tasks",
    )
    for p in reply.plans:
        state = _verdict(p.done, p.ok, set(p.tasks))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.submitted_at))
        counts = ", ".join(f"{n} {status}" for status, n in sorted(p.tasks.items()))
        table.add_row(p.id, p.plan, when, state, counts)
    console.print(table)


def lanes_table(reply: f.LaneList, console: Console, now: float | None = None) -> None:
    """Live lanes and tasks awaiting approval (`lanes_view`), printed on `console`."""
    console.print(lanes_view(reply, now))


def lanes_view(reply: f.LaneList, now: float | None = None) -> Group:
    """Live lanes and tasks awaiting approval: for those, how long they have waited (from
    `since` to `now`, Unix seconds; default: the wall clock, as `since` is another process's)
    and their question on one line of at most `QUESTION_CHARS`. Children that did not answer
    are named last: what they hold is missing from the table. Shared by `ctl lanes` and
    `ctl top`."""
    parts: list[RenderableType] = []
    if reply.unanswered:
        missing = ", ".join(reply.unanswered)
        note = f"no answer from {missing}: their lanes (or pauses) are not listed"
    if not reply.lanes:
        parts.append(Text("no live lanes, nothing awaits approval"))
        if reply.unanswered:
            parts.append(Text(note))
        return Group(*parts)
    now = time.time() if now is None else now
    table = Table(
        Column("lane", no_wrap=True),
        "task",
        "plan",
        Column("shard", no_wrap=True),
        Column("state", no_wrap=True),
        Column("waiting", no_wrap=True),
        "question",  # cut to QUESTION_CHARS, then wrapped: ids must never be cut
        Column("sandbox", overflow="fold"),
    )
    for lane in reply.lanes:
        table.add_row(
            lane.lane,
            lane.task or "-",
            lane.plan or "-",
            lane.shard or "-",
            lane.state,
            "-" if lane.since is None else waited(now - lane.since),
            "" if lane.question is None else one_line(lane.question, QUESTION_CHARS),
            lane.sandbox or "-",
        )
    parts.append(table)
    if any(lane.state == AWAITING for lane in reply.lanes):
        parts.append(Text(ANSWER_HINT))
    if reply.unanswered:
        parts.append(Text(note))
    return Group(*parts)


# --- ctl logs ------------------------------------------------------------------------------------


def log_row_json(row: f.LogRow) -> dict[str, Any]:
    """One transcript row for programs: exactly {"seq", "ts", "stream", "data"}."""
    return {"seq": row.seq, "ts": row.ts, "stream": row.stream, "data": row.data}


class LogSink:
    """Writes `ctl logs` rows as they come, flushed after each batch.

    Text: "stdout" rows to `stdout` and "stderr" rows to `stderr`, as the command wrote them (so
    `ctl logs LANE > out.txt` holds the command's stdout); an "event" row as one `# event: ...` line
    on `stderr`, started on a line of its own. JSON: one object per row per line on `stdout`
    (`log_row_json`). Text is written as UTF-8 bytes whatever the locale.
    """

    def __init__(self, as_json: bool, stdout: IO[str], stderr: IO[str]):
        self.as_json = as_json
        self.stdout = stdout
        self.stderr = stderr
        self._line_open = False  # the last text written (either stream) did not end a line

    def write(self, rows: list[f.LogRow]) -> None:
        for row in rows:
            if self.as_json:
                self.stdout.write(json.dumps(log_row_json(row)) + "\n")
            elif row.stream == "event":
                lead = "\n" if self._line_open else ""
                self._put(self.stderr, f"{lead}# event: {row.data}\n")
            else:
                self._put(self.stdout if row.stream == "stdout" else self.stderr, row.data)
        self.stdout.flush()
        self.stderr.flush()

    def _put(self, stream: IO[str], text: str) -> None:
        if not text:
            return
        raw = getattr(stream, "buffer", None)
        if raw is None:
            stream.write(text)
        else:
            stream.flush()  # keep order with what was written as text before
            raw.write(text.encode("utf-8", errors="replace"))
            raw.flush()
        self._line_open = not text.endswith("\n")
