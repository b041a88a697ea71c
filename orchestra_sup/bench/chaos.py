"""`orchestra-sup bench chaos`: run plans while random children are SIGKILLed, then count.

A private tree (`oneshot.private_tree`) runs plans of `tasks` short tasks (10 dependency chains)
back to back for `duration_s` seconds, while every 1-3 s (uniformly random) one child picked at
random (custodian, coordinator or a shard) is SIGKILLed. Then the killing stops, the last plan
is allowed to finish, the tree is stopped, and the run reports:

- `kills`, `restarts` (the children's `restarts` summed), `tasks`, `succeeded`, and `failed`
  by failure class (`worker_process_loss`: lost with its worker more than `max_worker_loss`
  times, which the chaos does on purpose; a task that fails is not lost);
- `lost`: tasks with no final status when their plan was reported done (or that never
  finished), the first `LOST_SHOWN` of them named in `lost_tasks` ("plan task status shard
  attempts");
- `duplicated`: tasks whose side effect happened again after their success was recorded. Each
  task appends `<plan> <task> <attempt>` to a ledger as its last act; a success recorded for
  attempt A is duplicated by a second line for attempt A or any line for an attempt after A;
- `unrecorded`: tasks reported succeeded whose ledger line for their last attempt is missing:
  their effect did not reach the ledger, so `duplicated` could not have seen a repeat either. A
  run with none succeeded, or any unrecorded, proves nothing and fails;
- `orphans`: processes of the tree still alive after it stopped. This process makes itself a
  child subreaper first, so nothing the tree started can escape the count by being reparented to
  PID 1;
- `supervisor_alive`: the supervisor answered `ctl status` when the killing stopped.

With `hosts` (issue 21), that many host agents join the tree (`bench.chaoshosts`: each in a
network namespace of its own, an etcd member for their leases), their shards take lanes as the
root's do, and half the harm is done to them, the first harm always (so a short run harms a
host): a host SIGKILLed whole (its agent started again 2 s later) or partitioned (its link down
for twice the lease). `host_kills` and `partitions`
count it; `network` says where the hosts ran.

The tree runs with a restart intensity high enough that the chaos itself cannot exhaust it
(the point is to see what the restarts lose, not to watch the root give up), and with
`[isolation] mode = "none"`, `lane_user = "tree"`: the ledger is an effect outside the lanes'
sandboxes on purpose, which confinement would hide (bubblewrap's private `/tmp`) or refuse (a
lane's own uid). What confinement costs is `bench isolation`'s to measure.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import msgspec
import psutil

from orchestra_sup.bench.chaoshosts import Hosts
from orchestra_sup.client.ctl import CtlClient, status_or_none
from orchestra_sup.client.oneshot import private_tree
from orchestra_sup.errors import OrchestraError, SupervisionError
from orchestra_sup.protocol import frames as f
from orchestra_sup.system import linux

CHAINS = 10
PLAN_TIMEOUT_S = 180.0
LOST_SHOWN = 10
JOIN_S = 60.0
"""Seconds the hosts have to join the chaos tree."""


class ChaosReport(msgspec.Struct, kw_only=True):
    """What `run_chaos` counted (the module docstring says what each figure means)."""

    duration_s: float
    plans: int
    kills: int
    restarts: int
    tasks: int
    succeeded: int
    failed: dict[str, int]
    unrecorded: int
    lost: int
    lost_tasks: list[str]
    duplicated: int
    orphans: int
    supervisor_alive: bool
    hosts: int = 0
    host_kills: int = 0
    partitions: int = 0
    network: str = ""

    @property
    def clean(self) -> bool:
        """Whether the run proves what it is for: something succeeded, every success left its
        one ledger line, nothing was lost or left behind, and the supervisor lived."""
        return (
            self.succeeded > 0
            and self.unrecorded == self.lost == self.duplicated == self.orphans == 0
            and self.supervisor_alive
        )


def chaos_plan(name: str, tasks: int, ledger: Path) -> f.PlanSpec:
    """`tasks` short tasks in `CHAINS` chains; each appends one ledger line as its last act."""
    specs = []
    for i in range(tasks):
        run = f'sleep 0.{random.randint(1, 4)}; echo "{name} t{i} $ORCHESTRA_ATTEMPT" >> {ledger}'
        needs = [f"t{i - CHAINS}"] if i >= CHAINS else []
        specs.append(f.TaskSpec(id=f"t{i}", run=run, needs=needs, timeout_s=60.0))
    return f.PlanSpec(name=name, tasks=specs)


def run_chaos(
    duration_s: float, *, tasks: int = 60, seed: int | None = None, hosts: int = 0
) -> ChaosReport:
    """Run the chaos benchmark; see the module docstring. `duration_s` is seconds of killing.
    Raises `ConfigError` for `hosts` without etcd installed, `SupervisionError` when the
    hosts do not join within `JOIN_S`."""
    rng = random.Random(seed)
    linux.set_child_subreaper()
    base = Path(tempfile.mkdtemp(prefix="osup-chaos-"))
    ledger = base / "ledger"
    ledger.touch()
    isolation = '[isolation]\nmode = "none"\nlane_user = "tree"\n'
    (base / "host.toml").write_text(isolation)
    joined = Hosts(base, hosts, base / "host.toml") if hosts else None
    config = base / "tree.toml"
    config.write_text(
        "[supervisor]\nmax_restarts = 1000\nmax_seconds = 10.0\nbackoff_max_s = 0.5\n"
        + isolation
        + (joined.config() if joined is not None else "")
    )
    reports: list[f.PlanReport] = []
    kills = restarts = 0
    alive = False
    started = time.monotonic()
    try:
        with private_tree(
            workspace=None, state_dir=base / "state", shards=2, lanes_per_shard=8, config=config
        ) as client:
            if joined is not None:
                joined.start()
                _wait_joined(client, joined)
            pending: list[str] = []
            next_kill = started + rng.uniform(1.0, 3.0)
            while time.monotonic() - started < duration_s:
                if not pending or _done(client, pending[-1]):
                    name = f"chaos{len(pending)}"
                    pending.append(_submit(client, chaos_plan(name, tasks, ledger)))
                now = time.monotonic()
                if joined is not None:
                    joined.tend(now)
                if now >= next_kill:
                    # half the harm goes to hosts, and the first: a short run harms one
                    to_host = joined is not None and (
                        rng.random() < 0.5 or not joined.kills + joined.partitions
                    )
                    harmed = to_host and joined is not None and joined.harm(rng, now)
                    if not harmed:
                        kills += _kill_one(client, rng)
                    next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
                time.sleep(0.05)
            alive = status_or_none(client) is not None
            if joined is not None:
                joined.heal()
            for plan_id in pending:
                reports.append(_wait(client, plan_id))
            status = status_or_none(client)
            if status is not None:
                restarts = sum(c.restarts for c in status.children)
    finally:
        if joined is not None:
            joined.close()
    orphans = _orphans()
    lines = Counter(tuple(line.split()) for line in ledger.read_text().splitlines() if line)
    shutil.rmtree(base, ignore_errors=True)
    total = sum(len(r.tasks) for r in reports)
    succeeded = unrecorded = lost = duplicated = 0
    failed: Counter[str] = Counter()
    lost_tasks: list[str] = []
    for report in reports:
        for t in report.tasks:
            if t.status == "failed":
                failed[t.failure or "unclassified"] += 1
            if t.status == "succeeded":
                succeeded += 1
                unrecorded += lines[(report.plan, t.id, str(t.attempts))] == 0
                duplicated += _duplicated(lines, report.plan, t)
            elif t.status not in ("failed", "skipped", "cancelled"):
                lost += 1
                if len(lost_tasks) < LOST_SHOWN:
                    lost_tasks.append(f"{report.plan} {t.id} {t.status} {t.shard} {t.attempts}")
    lost += sum(max(0, tasks - len(r.tasks)) for r in reports)
    return ChaosReport(
        duration_s=round(time.monotonic() - started, 2),
        plans=len(reports),
        kills=kills,
        restarts=restarts,
        tasks=total,
        succeeded=succeeded,
        failed=dict(sorted(failed.items())),
        unrecorded=unrecorded,
        lost=lost,
        lost_tasks=lost_tasks,
        duplicated=duplicated,
        orphans=orphans,
        supervisor_alive=alive,
        hosts=hosts,
        host_kills=joined.kills if joined is not None else 0,
        partitions=joined.partitions if joined is not None else 0,
        network=joined.network if joined is not None else "",
    )


def _wait_joined(client: CtlClient, joined: Hosts) -> None:
    """Until every host of `joined` shows "joined" in the tree's status; raises
    `SupervisionError` after `JOIN_S` seconds, with the end of each agent's log."""
    deadline = time.monotonic() + JOIN_S
    count = len(joined.hosts)
    while time.monotonic() < deadline:
        status = status_or_none(client)
        if status is not None and sum(h.state == "joined" for h in status.hosts) == count:
            return
        time.sleep(0.2)
    logs = "".join(f"\n{h.name}:\n{h.log_tail()}" for h in joined.hosts)
    raise SupervisionError(f"bench chaos: {count} hosts did not join within {JOIN_S:g} s{logs}")


def _duplicated(lines: Counter[tuple[str, ...]], plan: str, t: f.TaskReport) -> int:
    """1 when the task's effect happened again after its success (attempt `t.attempts`)."""
    mine = {k: n for k, n in lines.items() if k[:2] == (plan, t.id)}
    again = mine.get((plan, t.id, str(t.attempts)), 0) > 1
    later = any(int(k[2]) > t.attempts for k in mine)
    return int(again or later)


def _submit(client: CtlClient, spec: f.PlanSpec) -> str:
    while True:
        try:
            reply = client.request(f.CtlSubmit(plan=spec), timeout_s=10.0)
            assert isinstance(reply, f.PlanAccepted)
            return reply.id
        except OrchestraError:
            time.sleep(0.1)  # the coordinator is restarting; a submit is never half-done


def _done(client: CtlClient, plan_id: str) -> bool:
    try:
        reply = client.request(f.CtlPlan(id=plan_id), timeout_s=5.0)
    except OrchestraError:
        return False
    return isinstance(reply, f.PlanReport) and reply.done


def _wait(client: CtlClient, plan_id: str) -> f.PlanReport:
    deadline = time.monotonic() + PLAN_TIMEOUT_S
    last: f.PlanReport | None = None
    while time.monotonic() < deadline:
        try:
            reply = client.request(f.CtlPlan(id=plan_id, wait_s=5.0), timeout_s=10.0)
        except OrchestraError:
            time.sleep(0.1)
            continue
        assert isinstance(reply, f.PlanReport)
        last = reply
        if reply.done:
            return reply
    return last or f.PlanReport(plan="?", id=plan_id, done=False, ok=False, tasks=[])


def _kill_one(client: CtlClient, rng: random.Random) -> int:
    """SIGKILL one running child picked at random; 1 if a process was killed."""
    status = status_or_none(client)
    if status is None:
        return 0
    running = [c for c in status.children if c.state == "running" and c.pid]
    if not running:
        return 0
    victim = rng.choice(running)
    try:
        proc = psutil.Process(victim.pid)  # type: ignore[arg-type]
        if proc.ppid() != status.supervisor_pid:  # still the child we were told about
            return 0
        proc.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        return 0
    return 1


def _orphans() -> int:
    """Live descendants of this (subreaping) process once the tree has stopped."""
    deadline = time.monotonic() + 5.0
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        try:
            alive = [
                p
                for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE
            ]
        except (psutil.Error, OSError):
            continue
        if not alive or time.monotonic() > deadline:
            return len(alive)
        time.sleep(0.05)
