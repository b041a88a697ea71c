"""`ctl logs LANE [--follow]`: a lane's transcript read over the ctl socket, followed across the
attempts of its task that a lost or restarted shard makes, and written out (`LogSink`).

Without `--follow`: the rows there are now, once. With it: the rows as they come (a long poll of
`CtlLogs`), until the lane ends. A lane that ends `interrupted:` or `lost:` (its shard was
restarted, stopped or died: not a verdict on the work, which its task runs again) does not end
the follow: the coordinator is asked for the lane's task (a lane id is PLAN-TASK-ATTEMPT,
`coordinator.runner.PlanRecord.place`) until the task has another lane, which is then followed
from its first row (`LogSink.moved` says so), or the task ends without one. A tree that goes
away before the task runs again, or before the lane's end reached the follower (the tree stopped
between two exchanges), is an error that says so: the follower is never left believing the work
is done when it is not.
"""

from __future__ import annotations

import json
import time
from typing import IO

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import ErrorCode, RemoteError, TreeUnreachable
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes

POLL_S = 5.0
"""How long one `--follow` exchange waits at the shard for new rows (a long poll)."""
RETRY_S = 0.2
"""Seconds between asks while a shard is down, or while a task waits for its next lane."""
RE_RUN = ("interrupted:", "lost:")
"""How the end events of a lane whose task runs again begin (README, "Lane transcripts")."""
ENDED = frozenset({"succeeded", "failed", "skipped", "cancelled"})
"""The statuses of a task that runs no more."""


class LogSink:
    """Writes `ctl logs` rows as they come, flushed after each batch.

    Text: "stdout" rows to `stdout` and "stderr" rows to `stderr`, as the command wrote them (so
    `ctl logs LANE > out.txt` holds the command's stdout); an "event" row as one `# event: ...` line
    on `stderr`, started on a line of its own; a move to the next attempt's lane (`moved`) as a
    `# next attempt: ...` line there too. JSON: one object per row per line on `stdout`
    (`shapes.log_row_json`: each names its lane). Text is written as UTF-8 bytes whatever the
    locale.
    """

    def __init__(self, as_json: bool, stdout: IO[str], stderr: IO[str]):
        self.as_json = as_json
        self.stdout = stdout
        self.stderr = stderr
        self._line_open = False  # the last text written (either stream) did not end a line

    def write(self, rows: list[f.LogRow], lane: str) -> None:
        for row in rows:
            if self.as_json:
                self.stdout.write(json.dumps(shapes.log_row_json(row, lane)) + "\n")
            elif row.stream == "event":
                self._note(f"# event: {row.data}\n")
            else:
                self._put(self.stdout if row.stream == "stdout" else self.stderr, row.data)
        self.stdout.flush()
        self.stderr.flush()

    def moved(self, lane: str, after: str) -> None:
        """Say that `lane`'s task runs again as lane `after`, whose rows follow (text only: in
        JSON each row names its lane)."""
        if not self.as_json:
            self._note(f"# next attempt: lane {after} (the task of {lane} runs again)\n")
            self.stderr.flush()

    def _note(self, line: str) -> None:
        self._put(self.stderr, ("\n" if self._line_open else "") + line)

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


def show_logs(
    client: CtlClient, lane: str, sink: LogSink, *, follow: bool, timeout_s: float
) -> None:
    """Write lane `lane`'s transcript to `sink`; with `follow`, as it comes and on to the next
    attempt of its task (module docstring). Each exchange waits at most `timeout_s` seconds
    beyond its long poll. Raises `RemoteError` (`not_found`: no shard knows the lane; a down
    shard not back within `timeout_s`) and `TreeUnreachable` (the tree went away, or went
    before an interrupted task ran again)."""
    origin: str | None = None  # the lane whose task `lane` runs again, until `lane` is known
    how = ""  # how `origin` ended: "interrupted", "lost"
    while True:
        try:
            last = _transcript(client, lane, sink, follow=follow, timeout_s=timeout_s)
        except RemoteError as exc:
            if origin is None or exc.code is not ErrorCode.NOT_FOUND:
                raise
            # placed, and not started on its shard yet (or the placement was taken back: the
            # shard was full): ask again which lane runs the task
            time.sleep(RETRY_S)
            after = _rerun(client, origin, how, timeout_s)
            if after is None:
                return
            if after != lane:
                sink.moved(origin, after)
            lane = after
            continue
        origin = None
        if not follow or last is None or not last.data.startswith(RE_RUN):
            return
        how = last.data.split(":")[0]
        after = _rerun(client, lane, how, timeout_s)
        if after is None:
            return
        sink.moved(lane, after)
        origin, lane = lane, after


def _rerun(client: CtlClient, lane: str, how: str, timeout_s: float) -> str | None:
    """`_next_lane`, with a tree gone before it answered said in words: `lane` was `how`
    ("interrupted", "lost") and its task runs again when a tree starts on its state."""
    try:
        return _next_lane(client, lane, timeout_s)
    except TreeUnreachable as exc:
        raise TreeUnreachable(
            f"lane {lane} was {how} and the tree went away before its task ran again ({exc}); "
            "it runs again when a tree starts on its state directory"
        ) from None


def _transcript(
    client: CtlClient, lane: str, sink: LogSink, *, follow: bool, timeout_s: float
) -> f.LogRow | None:
    """Write one lane's rows to `sink` (as they come, with `follow`, until its end); returns
    its last event row (None when it has none). Raises `RemoteError` (`not_found` at once) and
    `TreeUnreachable` (with `follow`: saying the lane's end never reached the follower)."""
    wait_s = POLL_S if follow else 0.0
    after = -1
    last: f.LogRow | None = None
    down_since: float | None = None
    while True:
        ask = f.CtlLogs(lane=lane, after_seq=after, wait_s=wait_s)
        try:
            chunk = client.request(ask, timeout_s=wait_s + timeout_s)
        except TreeUnreachable as exc:
            if not follow:
                raise
            # The tree stopped between two exchanges: the lane's end event may be on disk,
            # but it never reached this follower. A lane the tree did not finish runs again.
            raise TreeUnreachable(
                f"lane {lane}: the tree stopped answering before its end reached this follower "
                f"({exc}); a lane the tree did not finish runs again when a tree starts on its "
                "state directory"
            ) from None
        except RemoteError as exc:
            # Following a lane whose shard died: its next generation comes back within seconds
            # and closes the transcript with a `lost:` event; wait for that.
            if not follow or exc.code is not ErrorCode.PEER_DOWN:
                raise
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > timeout_s:
                raise
            time.sleep(RETRY_S)
            continue
        down_since = None
        assert isinstance(chunk, f.LogChunk)
        sink.write(chunk.rows, lane)
        last = next((r for r in reversed(chunk.rows) if r.stream == "event"), last)
        after = chunk.rows[-1].seq if chunk.rows else after
        if chunk.done or (not follow and not chunk.rows):  # without --follow: what there is now
            return last


def _next_lane(client: CtlClient, lane: str, timeout_s: float) -> str | None:
    """The lane of the attempt of `lane`'s task after `lane`, once the coordinator has placed
    one (asked every `RETRY_S` seconds, each ask waiting at most `timeout_s`); None when the task
    ends without one, or no plan of the coordinator has that lane. Raises `TreeUnreachable`."""
    plan_id = lane.split("-", 1)[0]
    while True:
        try:
            report = client.request(f.CtlPlan(id=plan_id), timeout_s=timeout_s)
        except RemoteError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                return None
            raise
        assert isinstance(report, f.PlanReport)
        task = next((t for t in report.tasks if _attempt_of(lane, report.id, t.id)), None)
        if task is None:
            return None
        if task.lane is not None and task.lane != lane:
            return task.lane
        if task.status in ENDED:
            return None
        time.sleep(RETRY_S)


def _attempt_of(lane: str, plan_id: str, task_id: str) -> bool:
    """`lane` is an attempt of task `task_id` of plan `plan_id` (PLAN-TASK-N)."""
    prefix = f"{plan_id}-{task_id}-"
    return lane.startswith(prefix) and lane[len(prefix) :].isdigit()
