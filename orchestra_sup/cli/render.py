"""How ctl replies look: JSON for programs (stable shapes), rich tables for people."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.text import Text
from rich.tree import Tree

from orchestra_sup.cli.columns import Field, dropped_line, fit, pack
from orchestra_sup.cli.hosts_view import add_hosts, cluster_parts
from orchestra_sup.cli.session_view import session_view
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.patterns import DAG
from orchestra_sup.protocol.shapes import tree_json


def rollover_line(event: f.RolloverEvent) -> str:
    """One rollover step for people: "  +1.234 s shard-0: lane x moved (0.012 s)"."""
    who = f"{event.child}: " if event.child else ""
    took = f" ({event.took_s:.3f} s)" if event.took_s is not None else ""
    return f"+{event.at_s:7.3f} s  {who}{event.text}{took}"


def reload_lines(report: f.ReloadReport) -> list[str]:
    """A reload's report for people: what changed, then what that did to which child."""
    if not report.config:
        return ["nothing to reload: the tree was started without --config"]
    if not report.changed:
        return [f"config {report.config}: nothing changed"]
    lines = [f"config {report.config}: changed {', '.join(report.changed)}"]
    for label, names in (
        ("restarted", report.restarted),
        ("added", report.added),
        ("retired", report.retired),
        ("updated in place", report.updated),
        ("unchanged", report.unchanged),
    ):
        if names:
            lines.append(f"{label}: {', '.join(names)}")
    return lines


def recorded_line(reply: f.HitlRecorded) -> str:
    """What a HITL answer did, in one line: "plan 3f2a9c1b7d44: task deploy approved: it runs"
    (the coordinator's `outcome`, whitespace collapsed)."""
    return f"plan {reply.plan}: {one_line(reply.outcome, 500)}"


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
    add_hosts(root, reply)
    console.print(root)


STATUS_FIELDS = (
    Field("name"),
    Field("role", rank=5),
    Field("pid", right=True),
    Field("gen", rank=1, right=True),
    Field("state"),
    Field("restarts", rank=1, right=True),
    Field("op restarts", rank=4, right=True),
    Field("uptime", rank=2, right=True),
    Field("last exit", rank=3),
    Field("loop lag ms p50/p99/max", rank=2, right=True),
    Field("release", rank=5),
    Field("fds", rank=3, right=True),
    Field("refused stale/bad", rank=6, right=True),
    Field("internal", rank=6, right=True),
    Field("cpu", rank=5),
)
"""`ctl status`'s columns in table order, each with the rank it is dropped by when the terminal
is too narrow for all of them (`columns.fit`; `--wide` and piped output show every one). Dropped
first: frames refused (6), then the release and role (5: the name says the role), restarts by
`ctl restart` (4), the last exit (3), uptime and loop lag (2), restarts and generation (1); name,
pid and state (0) always stay. A figure added later takes the rank of what it is worth beside
these (a child's open descriptors, `fds`, is 3, with the last exit; requests answered
`internal` are 6, with the frames refused; the CPU class in force, `cpu`, is 5, with the
release)."""
WIDE_HINT = "--wide shows them"
"""How to see what a narrow terminal left out (`ctl status`, `ctl lanes`, `ctl top`)."""


def status_view(reply: f.StatusReply, width: int | None) -> Group:
    """`ctl status` for people, `width` columns wide (None: unbounded): the supervisor's figures
    packed on as few lines as fit (`columns.pack`), its directories and interpreter one line
    each, the metrics URL and the rollover in progress when there are, then the children's
    table (`STATUS_FIELDS`) and what it left out."""
    facts = [
        f"supervisor pid {reply.supervisor_pid}",
        f"orchestra-sup {reply.version}",
        f"isolation {reply.isolation or '?'}",
        f"loop lag ms p50/p99/max {_lag(reply.loop_lag_ms)}",
        f"refused frames stale/bad {reply.stale_frames}/{reply.bad_frames}",
        f"internal errors {reply.internal_errors}",
        f"ctl refused {reply.ctl_refused}",
    ]
    if reply.descriptors is not None:
        facts += [
            f"descriptors {fds(reply.descriptors)}",
            f"ctl connections {reply.ctl_connections} of {reply.ctl_connections_max} "
            f"(refused {reply.descriptors.refused})",
        ]
    facts += [f"cpu {reply.cpu or '?'}", f"lanes' cpu {reply.lane_cpu or '?'}"]
    if reply.rt_demoted or reply.cpu.startswith("fifo"):
        facts.append(f"real-time demotions {reply.rt_demoted}")
    lines = pack(facts, width)
    lines += [f"run dir {reply.run_dir}", f"state dir {reply.state_dir}"]
    if reply.workspace:
        lines.append(f"workspace {reply.workspace}")
    if reply.release:
        lines.append(f"interpreter {reply.release}")
    if reply.metrics_url:
        lines.append(f"metrics {reply.metrics_url}")
    if reply.http_url:
        counts = reply.http
        shown = f" ({counts.open} of {counts.max} connections" if counts is not None else ""
        if counts is not None and (counts.refused or counts.reset):
            shown += f"; {counts.refused} refused, {counts.reset} reset for not reading"
        lines.append(f"http api {reply.http_url}{shown + ')' if shown else ''}")
        lines.append(f"console {reply.http_url.removesuffix('v1/')}")
    if reply.rollover is not None:
        lines.append(f"rollover {reply.rollover}")
    if reply.state_disk is not None:
        refusing = ": refusing new plans and lanes" if reply.state_disk.short else ""
        lines.append(f"state disk {reply.state_disk.text()}{refusing}")
    rows = [_status_row(c, reply.release) for c in reply.children]
    fitted = fit(STATUS_FIELDS, rows, width)
    parts: list[RenderableType] = [Text(line) for line in lines]
    parts.append(fitted.table)
    if fitted.dropped:
        parts.append(Text(dropped_line(fitted.dropped, WIDE_HINT), style="dim"))
    parts += cluster_parts(reply, width, WIDE_HINT)
    return Group(*parts)


def status_table(reply: f.StatusReply, console: Console, width: int | None = None) -> None:
    """`status_view` printed on `console`."""
    console.print(status_view(reply, width))


def _status_row(c: f.ChildInfo, supervisor_release: str) -> list[str]:
    last = "-"
    if c.last_exit is not None:
        last = (
            f"signal {c.last_exit.signal}"
            if c.last_exit.signal is not None
            else f"status {c.last_exit.status}"
        )
    return [
        c.name,
        c.role,
        str(c.pid or "-"),
        str(c.generation),
        c.state,
        str(c.restarts),
        str(c.operator_restarts),
        waited(c.uptime_s) if c.pid is not None else "-",
        last,
        "-" if c.loop_lag_ms is None else _lag(c.loop_lag_ms),
        _release(c, supervisor_release),
        "-" if c.descriptors is None else fds(c.descriptors),
        f"{c.stale_frames}/{c.bad_frames}",
        str(c.internal_errors),
        c.cpu or "-",
    ]


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


QUESTION_CHARS = 200
"""How much of a HITL question a table's line shows (`ctl lanes`, `ctl plan`); `--json` has all
of it."""
WARNING_CHARS = 200
"""How much of each of a task's warnings `ctl plan` and `run` show; `--json` has all of it."""
TAIL_LINES = 10
"""How many of a failed task's last output lines `ctl plan` and `run` show under the table."""
AWAITING = "awaiting_approval"
"""The state (of a lane) and status (of a task) of work that waits for a human."""
CTL = "orchestra-sup ctl"
"""The ctl command a hint names when the caller does not say how it reached the tree
(`invocation.ctl_command` says it in full)."""
VERDICTS = ("approve", "reject", "redirect", "accept_partial")
"""Every answer to a pause, as a coordinator older than `LaneInfo.accepts` takes them."""


def answer_hints(pauses: list[tuple[str, list[str], bool]], command: str = CTL) -> list[str]:
    """How to answer each pause: `pauses` are (lane, the verdicts it takes, whether an approval
    needs `--retries N`: `LaneInfo.accepts`, `needs_retries`); `command` is the ctl command that
    reached the tree (`invocation.ctl_command`), so the hint works pasted. Only the answers a
    pause takes are offered: "answer with: orchestra-sup ctl --run-dir /r approve|reject|redirect
    LANE", the lane id itself in place of LANE when one pause is meant. Pauses that take
    different answers get a line for each kind, naming their lanes."""
    groups: dict[tuple[tuple[str, ...], bool], list[str]] = {}
    for lane, accepts, needs_retries in pauses:
        groups.setdefault((tuple(accepts) or VERDICTS, needs_retries), []).append(lane)
    lines = []
    for (accepts, needs_retries), lanes in groups.items():
        target = lanes[0] if len(lanes) == 1 else "LANE"
        who = "" if len(groups) == 1 or len(lanes) == 1 else f" {', '.join(lanes)}"
        verbs = [v.replace("_", "-") for v in accepts if not (v == "approve" and needs_retries)]
        hint = f"{command} {'|'.join(verbs)} {target}"
        if needs_retries:
            hint += f", or approve {target} --retries N"
        lines.append(f"answer{who} with: {hint}")
    return lines


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


def printable(line: str) -> str:
    """A line of a command's output made safe for a terminal: every control character but tab
    (an escape sequence could move the cursor, retitle the window, hide what follows) becomes
    U+FFFD."""
    return "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in line)


PLAN_FIELDS = (
    Field("task"),
    Field("status"),
    Field("failure", rank=1),
    Field("exit", rank=1, right=True),
    Field("attempts", rank=2, right=True),
    Field("shard", rank=1),
    Field("secs", rank=2, right=True),
    Field("commit", rank=3),
    Field("lane", rank=3),
    Field("error", squeeze=24),
)
"""A plan's task columns in table order with the rank each is dropped by when the terminal is
too narrow (`columns.fit`): commit and lane first (3), then attempts and duration (2), then
failure class, exit status and shard (1); task, status and error (0) stay, the error wrapped."""


def plan_table(
    report: f.PlanReport, console: Console, width: int | None = None, command: str = CTL
) -> None:
    """`plan_view` printed on `console` (`session_view` for a session)."""
    if report.coordinator != DAG:
        console.print(session_view(report, width))
    else:
        console.print(plan_view(report, width, command))


def plan_view(report: f.PlanReport, width: int | None, command: str = CTL) -> Group:
    """The plan's verdict and a table of its tasks fitted to `width` columns (None: every
    column), then, under it: each task's warnings (one line each, at most `WARNING_CHARS`), the
    last `TAIL_LINES` lines of each failed task's output (what says why, when the tree that ran
    it is gone), and one line per task that waits for a human with its lane (to answer with)
    and its question, then how to answer (`answer_hints`, with `command`)."""
    parts: list[RenderableType] = [
        Text(f"plan {report.plan} ({report.id}): {plan_verdict(report)}")
    ]
    rows = [
        [
            t.id,
            t.status,
            t.failure or "-",
            "-" if t.exit_code is None else str(t.exit_code),
            str(t.attempts),
            t.shard or "-",
            f"{t.duration_s:.2f}",
            (t.commit or "-")[:10],
            t.lane or "-",
            t.error or "",
        ]
        for t in report.tasks
    ]
    fitted = fit(PLAN_FIELDS, rows, width)
    parts.append(fitted.table)
    if fitted.dropped:
        parts.append(Text(dropped_line(fitted.dropped, "--json has every field"), style="dim"))
    for t in report.tasks:
        for warning in t.warnings:
            parts.append(Text(f"{t.id} warning: {one_line(warning, WARNING_CHARS)}"))
    for t in report.tasks:
        if t.status == "failed":
            parts.extend(_tail(t))
    asking = [t for t in report.tasks if t.question is not None]
    for t in asking:
        question = one_line(t.question or "", QUESTION_CHARS)
        parts.append(Text(f"{t.id} asks (lane {t.lane or '-'}): {question}"))
    pauses = [(t.lane or "LANE", t.accepts, t.needs_retries) for t in asking]
    parts.extend(Text(line) for line in answer_hints(pauses, command))
    return Group(*parts)


def _tail(task: f.TaskReport) -> list[Text]:
    """The last `TAIL_LINES` lines of a failed task's output (`output_tail`), indented under a
    line that names the task, or that it printed nothing."""
    lines = task.output_tail.splitlines()[-TAIL_LINES:]
    if not lines:
        return [Text(f"{task.id} failed with no output")]
    head = f"{task.id} failed; the last {len(lines)} lines of its output:"
    if len(lines) == 1:
        head = f"{task.id} failed; the last line of its output:"
    return [Text(head), *(Text(f"  {printable(line)}") for line in lines)]


PLANS_FIELDS = (
    Field("id"),
    Field("plan", squeeze=16),
    Field("submitted", rank=2),
    Field("state"),
    Field("tasks", rank=1, squeeze=20),
)
"""`ctl plans`' columns in table order, with the rank each is dropped by (`columns.fit`)."""


def plans_table(reply: f.PlanList, console: Console, width: int | None = None) -> None:
    if not reply.plans:
        console.print("no plans")
        return
    rows = []
    for p in reply.plans:
        state = _verdict(p.done, p.ok, set(p.tasks))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.submitted_at))
        counts = ", ".join(f"{n} {status}" for status, n in sorted(p.tasks.items()))
        rows.append([p.id, p.plan, when, state, counts])
    fitted = fit(PLANS_FIELDS, rows, width)
    console.print(fitted.table)
    if fitted.dropped:
        console.print(Text(dropped_line(fitted.dropped, "--json has every field"), style="dim"))


LANE_FIELDS = (
    Field("lane"),
    Field("task", rank=3),
    Field("plan", rank=3),
    Field("shard", rank=1),
    Field("state"),
    Field("waiting", rank=1),
    Field("sandbox", rank=4),
)
"""`ctl lanes`' columns in table order with the rank each is dropped by when the terminal is too
narrow (`columns.fit`): the sandbox path first (4), then task and plan (3: the lane id is
PLAN-TASK-ATTEMPT), then shard and how long it has waited (1: a pause's line under the table
says that too); lane and state (0) stay."""


def lanes_table(
    reply: f.LaneList,
    console: Console,
    now: float | None = None,
    width: int | None = None,
    command: str = CTL,
) -> None:
    """Live lanes and tasks awaiting approval (`lanes_view`), printed on `console`."""
    console.print(lanes_view(reply, now, width, command))


def lanes_view(
    reply: f.LaneList, now: float | None = None, width: int | None = None, command: str = CTL
) -> Group:
    """Live lanes and tasks awaiting approval, fitted to `width` columns (None: every column).
    Under the table, each that waits: its lane, how long it has waited (from `since` to `now`,
    Unix seconds; default: the wall clock, as `since` is another process's) and its question
    on one line of at most `QUESTION_CHARS`, then how to answer (`answer_hints`, with
    `command`). Children that did not answer are named last: what they hold is missing from
    the table. Shared by `ctl lanes` and `ctl top`."""
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
    rows = [
        [
            lane.lane,
            lane.task or "-",
            lane.plan or "-",
            lane.shard or "-",
            lane.state,
            "-" if lane.since is None else waited(now - lane.since),
            lane.sandbox or "-",
        ]
        for lane in reply.lanes
    ]
    fitted = fit(LANE_FIELDS, rows, width)
    parts.append(fitted.table)
    if fitted.dropped:
        parts.append(Text(dropped_line(fitted.dropped, WIDE_HINT), style="dim"))
    for lane in reply.lanes:
        if lane.question is not None:
            wait = "" if lane.since is None else f" ({waited(now - lane.since)})"
            question = one_line(lane.question, QUESTION_CHARS)
            parts.append(Text(f"{lane.lane} asks{wait}: {question}"))
    pauses = [(x.lane, x.accepts, x.needs_retries) for x in reply.lanes if x.state == AWAITING]
    parts.extend(Text(line) for line in answer_hints(pauses, command))
    if reply.unanswered:
        parts.append(Text(note))
    return Group(*parts)
