"""What a shard does for one lane's program (`program.LaneHost`): run its commands, take its
output, count what it spends, record its questions and notes for the coordinator.

- Commands (`Host.exec`) run in the lane's sandbox through `shards.shell.run_shell`, each in the
  lane's cgroup (whatever is left in it when the command ends is killed) and its v1 limit
  cgroups (`shards.limits`), under the rlimits and, in mode "bwrap", the bubblewrap of
  `system.isolation`, as the sandbox's owner (`laneuser`: a uid of its own when the tree is
  root), at the shard's `lane_nice`, with the scrubbed environment of `lane_env`.
  Their CPU is counted from the cgroup (`LaneCgroups.cpu_s`), else sampled by the shard's
  `BudgetWatch` (`shards.spend`).
- Output (commands' chunks and `emit`ted lines) goes to the lane's tail and meter and to its
  transcript, and is checked at once against an `output_bytes` grant; so are the bytes of its
  notes to the coordinator (not in the tail: a note is an event row of the transcript).
- Questions and notes go through the durable outbox (`shards.outbox`) before anything waits on
  them: a pause is committed before the lane is shown waiting, a note before `tell_coordinator`
  returns (ARCHITECTURE.md §11 invariant 8). While the lane waits for a human it is
  "awaiting_approval", its wall clock and its program's `timeout_s` are held (`Meter.hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.node import Node
from orchestra_sup.shards.lane import TAIL_BYTES, Lane, LaneState
from orchestra_sup.shards.limits import LaneLimits
from orchestra_sup.shards.outbox import Outbox, note_id, pause_id
from orchestra_sup.shards.program import NOTES_MAX
from orchestra_sup.shards.shell import ShellOutcome, run_shell
from orchestra_sup.shards.spend import BudgetWatch
from orchestra_sup.shards.transcript import Transcript
from orchestra_sup.state.permissions import (
    PASSAGE,
    PRIVATE_DIR,
    private_dir,
    private_file,
)
from orchestra_sup.system.isolation import (
    Mounts,
    as_uid_fn,
    bwrap_argv,
    bwrap_binary,
    rlimits,
    set_rlimits_fn,
    setpriv_binary,
    with_veils,
)
from orchestra_sup.system.lanecgroups import LaneCgroups
from orchestra_sup.system.lanecpu import LaneCpu
from orchestra_sup.system.laneuser import is_lane_uid, object_stores, python_paths

ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")
"""Variables a lane command inherits from the shard; everything else is scrubbed."""


def inbox_path(state_dir: Path, lane: str) -> Path:
    """The file a shell lane reads its messages from (`$ORCHESTRA_INBOX`), one line each."""
    return state_dir / "inboxes" / lane


def _existing(paths: list[Path]) -> list[Path]:
    """`paths` resolved, those that are directories (a missing one has nothing to hide)."""
    real = (Path(os.path.realpath(p)) for p in paths)
    return [p for p in real if p.is_dir()]


def lane_uid(sandbox: Path) -> int | None:
    """The uid lane commands in `sandbox` run as: its owner when that is a lane's uid
    (`laneuser`) and this process is root, None when it is this process's own.

    Raises `PermissionError` when it belongs to anyone else: a command never runs as a uid
    the tree did not give it."""
    owner = os.lstat(sandbox).st_uid
    if owner == os.geteuid():
        return None
    if os.geteuid() == 0 and is_lane_uid(owner):
        return owner
    raise PermissionError(
        errno.EPERM, f"sandbox {sandbox} belongs to uid {owner}: neither the tree's nor a lane's"
    )


def lane_env(node: Node, lane: Lane, uid: int | None = None) -> dict[str, str]:
    """A lane command's whole environment: `ENV_ALLOW` from the shard's, and `ORCHESTRA_LANE`,
    `_PLAN`, `_TASK`, `_ATTEMPT`, `_PYTHON` (this interpreter), `_INBOX` (`inbox_path`,
    resolved: the path a lane sees it at), and `_FEEDBACK` when the attempt has revision
    feedback (`LaneStart.feedback`). For a lane of a uid of its own (`uid`), `USER` and
    `LOGNAME` name that uid (`lane-<uid>`), not the tree's user."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if uid is not None:
        env["USER"] = env["LOGNAME"] = f"lane-{uid}"
    env.update(
        ORCHESTRA_LANE=lane.id,
        ORCHESTRA_PLAN=lane.start.plan,
        ORCHESTRA_TASK=lane.start.task.id,
        ORCHESTRA_ATTEMPT=str(lane.start.attempt),
        ORCHESTRA_PYTHON=sys.executable,
        ORCHESTRA_INBOX=os.path.realpath(inbox_path(node.paths.state_dir, lane.id)),
    )
    if lane.start.feedback is not None:
        env["ORCHESTRA_FEEDBACK"] = lane.start.feedback
    return env


@dataclass(frozen=True)
class LaneServices:
    """What every lane's `Host` uses of its shard generation, opened once by the shard
    (`ShardRole.open`): its node, the lanes' cgroups, limit cgroups and CPU class, the
    transcript (None: none kept), the outbox to the coordinator and the budget watch."""

    node: Node
    cgroups: LaneCgroups
    limits: LaneLimits
    cpu: LaneCpu
    transcript: Transcript | None
    outbox: Outbox
    budgets: BudgetWatch


class Host:
    """`program.LaneHost` for `lane`, on the shard's event loop, through `shard`'s services.
    `deadline` is the scope of the program's `timeout_s` (None: none), held while the lane waits
    for a human."""

    def __init__(
        self, lane: Lane, shard: LaneServices, *, deadline: asyncio.Timeout | None = None
    ) -> None:
        self._lane = lane
        self._shard = shard
        self.deadline = deadline
        self._deadline_left: float | None = None  # seconds of `deadline` left when held
        self.closed = False
        """The lane has ended (`close`): its program can start nothing more."""

    def close(self) -> None:
        """The lane's program has returned (or raised, or was cancelled): whatever it left
        running in tasks of its own ends with it. Its commands' processes are killed now (its
        cgroup, else its running command's group), a question it still waits on is abandoned,
        and every later call of its context raises `RuntimeError`, so nothing it started
        outlives its lane, unbudgeted."""
        self.closed = True
        lane = self._lane
        self._shard.cgroups.kill_now(lane.id)
        if lane.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(lane.pgid, signal.SIGKILL)
        if lane.questions is not None:
            lane.questions.abandon()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"lane {self._lane.id} has ended: its program can start no more")

    async def exec(self, command: str, timeout_s: float | None) -> ShellOutcome:
        """One command of the lane (`LaneContext.exec`), confined as `system.isolation` says
        (`ChildArgs.isolation`). It joins the lane's cgroups before exec; whatever is left in
        them (setsid'ed or double-forked daemons) is killed the moment the command ends or is
        stopped (its exit, its timeout, a cancel, a budget stop), before its pipes drain: what
        the cgroup spends stops there. Raises `CancelledError` when a drain stopped it to hand
        the lane over; `RuntimeError` once the lane has ended; `OSError` when the command cannot
        be spawned (its sandbox is gone, bwrap is missing, or the sandbox belongs to a uid
        neither the tree's nor a lane's: `PermissionError`, `lane_uid`)."""
        self._check_open()
        lane, cgroups = self._lane, self._shard.cgroups
        assert lane.sandbox is not None
        cgroup = cgroups.create(lane.id)
        if cgroup is not None:
            lane.meter.command(lambda: LaneCgroups.cpu_s(cgroup))
        try:
            preexec, wrap, uid = await asyncio.to_thread(self._confinement, cgroup)
            return await run_shell(
                command,
                cwd=Path(lane.sandbox),
                env=lane_env(self._shard.node, lane, uid),
                timeout_s=timeout_s,
                on_output=self.on_output,
                tail_bytes=TAIL_BYTES,
                preexec=preexec,
                on_spawn=self._spawned if cgroup is None else lane.spawned,
                on_stop=(lambda: cgroups.kill_now(lane.id)) if cgroup is not None else None,
                nice=self._shard.node.args.lane_nice,
                wrap=wrap,
            )
        finally:
            lane.pgid = None  # no command runs any more: a stop need not wait for this lane
            lane.meter.command_ended()  # before the kill: the cgroup's figure goes with it
            await cgroups.kill(lane.id)
            await asyncio.to_thread(self._shard.limits.remove, lane.id)
            if lane.moving:  # a drain stopped the command to hand the lane over
                raise asyncio.CancelledError

    def _confinement(self, cgroup: Path | None) -> tuple[Callable[[], None], list[str], int | None]:
        """What confines one command (off the loop: it makes cgroups and files): the function
        the child runs before exec (join the v2 cgroup, then the v1 limit cgroups, then take
        the lanes' CPU class, then set the rlimits, then, in mode "none", become the lane's
        uid), the argv prefix (bubblewrap, or nothing in mode "none"), and the lane's uid
        (None: the tree's; `lane_uid`)."""
        lane, node = self._lane, self._shard.node
        settings = node.args.isolation
        steps = [] if cgroup is None else [LaneCgroups.join_fn(cgroup)]
        limited = self._shard.limits.create(
            lane.id, memory_bytes=settings.max_memory_bytes, processes=settings.max_processes
        )
        if limited:
            steps.append(LaneLimits.join_fn(limited))
        if (cpu_class := self._shard.cpu.join_fn()) is not None:
            steps.append(cpu_class)
        grant = lane.start.budget.cpu_s if lane.start.budget is not None else None
        left = None if grant is None else grant - lane.meter.spent().cpu_s
        steps.append(set_rlimits_fn(rlimits(settings, left)))
        assert lane.sandbox is not None
        sandbox = Path(os.path.realpath(lane.sandbox))
        uid = lane_uid(sandbox)
        inbox = self._inbox(uid, passage=settings.mode == "none")
        if settings.mode == "none" and uid is not None:
            steps.append(as_uid_fn(uid))  # last: joining a cgroup takes root

        def preexec() -> None:
            for step in steps:
                step()

        if settings.mode == "none":
            return preexec, [], uid
        paths = node.paths
        workspace = paths.workspace or paths.state_dir / "workspace"
        # the keys of `start --keys`; the default ones (`keys init`) are in the state directory
        keys = [] if node.args.keys_dir is None else [Path(node.args.keys_dir)]
        home = Path(os.path.realpath(Path.home()))
        mounts = Mounts(
            sandbox=sandbox,
            scratch=(home,) if home != Path("/") else (),
            readable=tuple(python_paths()),
            secret=tuple(_existing([paths.state_dir, paths.run_dir, *keys])),
            stores=tuple(object_stores(workspace)),
            files=(inbox,),
        )
        if uid is not None:
            mounts = with_veils(mounts, uid)
        wrap = bwrap_argv(
            bwrap_binary() or "bwrap",
            mounts,
            tmpfs_bytes=settings.max_file_bytes,
            lane_uid=uid,
            setpriv=setpriv_binary() or "setpriv",
        )
        return preexec, wrap, uid

    def _inbox(self, uid: int | None, *, passage: bool) -> Path:
        """The lane's inbox file (resolved), made before its first command (it is bound into
        the sandbox, and read by name in mode "none"): 0600, or for a lane of a uid of its own
        0640 with that uid's group, in an `inboxes` directory it may pass through in mode
        "none" (`state.permissions`)."""
        inbox = inbox_path(self._shard.node.paths.state_dir, self._lane.id)
        private_dir(inbox.parent, PASSAGE if passage and uid is not None else PRIVATE_DIR)
        if uid is None:
            private_file(inbox)
        else:
            private_file(inbox, 0o640)
            os.chown(inbox, -1, uid, follow_symlinks=False)
        return Path(os.path.realpath(inbox))

    def _spawned(self, pgid: int) -> None:
        """A command with no cgroup runs as `pgid`: its tree's CPU is sampled, if it counts."""
        self._lane.spawned(pgid)
        sampler = self._shard.budgets.sample(self._lane.id, pgid)
        if sampler is not None:
            self._lane.meter.command(lambda: sampler.last)

    def emit(self, text: str) -> None:
        """`LaneContext.emit`: a line of the lane's own output, as if it printed it. Raises
        `CancelledError` when that line overspends the lane's grant (it is being stopped);
        `RuntimeError` once the lane has ended."""
        self._check_open()
        self.on_output("stdout", text.encode() + b"\n")
        if self._lane.exhausted is not None:
            raise asyncio.CancelledError

    def on_output(self, stream: str, chunk: bytes) -> None:
        """What `run_shell` calls with each chunk: the lane's tail and meter, one transcript
        row, and the check against an `output_bytes` grant."""
        self._lane.output(stream, chunk)
        if self._shard.transcript is not None:
            self._shard.transcript.output(self._lane.id, stream, chunk)
        self._shard.budgets.check_output(self._lane.id)

    def spent(self) -> f.Spend:
        return self._lane.meter.spent()

    async def record_pause(self, key: str, question: str) -> None:
        """Record a question through the outbox. Raises `RuntimeError` once the lane ended."""
        self._check_open()
        lane = self._lane
        pause = f.HitlPause(
            lane=lane.id,
            plan=lane.start.plan,
            task=lane.start.task.id,
            shard=self._shard.node.name,
            key=key,
            question=question,
            asked_at=time.time(),
        )
        await self._shard.outbox.deliver(f.InboxPut(msg_id=pause_id(lane.id, key), pause=pause))
        if self._shard.transcript is not None:
            self._shard.transcript.event(lane.id, f"awaiting approval ({key}): {question}")

    def waiting(self, question: str | None) -> None:
        """The lane waits for a human about `question` (None: no longer)."""
        if self.closed:  # an abandoned question's wait ends after its lane did
            return
        lane = self._lane
        loop = asyncio.get_running_loop()
        if question is not None:
            lane.question = (question, time.time())
            lane.enter(LaneState.AWAITING_APPROVAL)
            lane.meter.hold()
            when = self.deadline.when() if self.deadline is not None else None
            if self.deadline is not None and when is not None:
                self._deadline_left = when - loop.time()
                self.deadline.reschedule(None)
            return
        lane.question = None
        lane.enter(LaneState.RUNNING)
        lane.meter.release()
        if self.deadline is not None and self._deadline_left is not None:
            self.deadline.reschedule(loop.time() + self._deadline_left)
            self._deadline_left = None

    async def tell(self, text: str) -> None:
        """`LaneContext.tell_coordinator`: the note's bytes are counted as the lane's output
        first, so a note that overspends an `output_bytes` grant is not sent. Raises
        `RuntimeError` once the lane has sent `NOTES_MAX` notes (every generation counted),
        `CancelledError` when the note overspends the grant (the lane is being stopped),
        `RuntimeError` once the lane has ended."""
        self._check_open()
        lane = self._lane
        if lane.notes >= NOTES_MAX:
            raise RuntimeError(f"a lane sends at most {NOTES_MAX} notes to the coordinator")
        lane.meter.output_bytes += len(text.encode())
        self._shard.budgets.check_output(lane.id)
        if lane.exhausted is not None:
            raise asyncio.CancelledError
        lane.notes += 1
        note = f.LaneNote(
            lane=lane.id, plan=lane.start.plan, task=lane.start.task.id, text=text, at=time.time()
        )
        await self._shard.outbox.deliver(f.InboxPut(msg_id=note_id(lane.id, lane.notes), note=note))
        if self._shard.transcript is not None:
            self._shard.transcript.event(lane.id, f"note to the coordinator: {text}")
