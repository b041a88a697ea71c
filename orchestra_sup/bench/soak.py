"""`orchestra-sup bench soak`: plans at a steady pace under short retention; is state bounded?

Issue 22 ("running for months: bounded state"). A private tree (`oneshot.private_tree`, 2
shards of 4 lanes) runs with the short retention of `RETENTION` written into its config file,
and for `duration_s` seconds keeps `PLANS_IN_FLIGHT` slots busy with plans of `TASKS` short
tasks (`CHAINS` dependency chains; the first `COMMITS` of each plan write a file in their
sandbox and commit it: each slot writes files of its own, so no two commits in flight touch one
path), and one with keyed lanes (`start_lane key=`, a fresh key each time, so pruned plans leave
kept keys behind for `[retention] keys_s`). A slot whose plan is done is given the next once
`PLAN_EVERY_S` (keyed: `KEYED_EVERY_S`) seconds have passed since it was given the last: a
steady load below what the tree can take (about 9 lanes a second), so that what is kept
depends on retention, not on how fast the machine happens to be at the time. The workspace is
a git repository beside the state directory, not in it: the history the commits leave is the
product, not state that retention bounds.

Every `interval_s` seconds (`duration_s / SAMPLES`, at most `MAX_INTERVAL_S`), this process
reads the figures of `bench.footprint` (bytes, counts; see there) on its own thread, between
two ctl polls: nothing asks the tree's loops for them (`ctl status`, which names the
processes, the supervisor answers from its own record). Then submitting stops and the plans in
flight are waited for (at most `PLAN_TIMEOUT_S` seconds in all).

The run reports `plans`, `tasks` (done), `failed` (tasks that ended other than succeeded, the
first `SHOWN` named in `failed_tasks`: "plan task status error"), `lost` (tasks of plans not
done within `PLAN_TIMEOUT_S`), `restarts` (the children's, summed: a restart would reset what a
process holds, so it is a failure here), and for every figure `second_quarter` and
`last_quarter` (its mean over the samples taken in [D/4, D/2) and [3D/4, D] of the sampled
`D = duration_s`), and `ratio` = last / second (1.0 when both are 0; None when the figure was
never read in one of them, e.g. `events` before the event log exists: not judged). `bounded`:
every judged ratio is at most `bound` (a figure that grew from 0 is not). `samples`: the time
of each sample (`t_s`, seconds since the first) and every figure's value at it (None where not
read), and `tasks` done by then, for plots (`bench.svgplot`); `pace`: tasks done within the
second and within the last quarter (a ratio of kept state is to be read against theirs).

Raises `SupervisionError` when the tree does not start (see `private_tree`), `OrchestraError`
(`TreeUnreachable`, a `RemoteError`) when it stops answering ctl or refuses a plan.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from orchestra_sup.bench import footprint
from orchestra_sup.client.ctl import CtlClient, status_or_none
from orchestra_sup.client.oneshot import private_tree
from orchestra_sup.protocol import frames as f

RETENTION: dict[str, dict[str, float]] = {
    "retention": {
        "plans_s": 20,
        "keys_s": 40,
        "sandboxes_s": 10,
        "transcripts_s": 20,
        "events_s": 30,
        "every_s": 2,
    },
}
"""The tree's config, table -> key -> seconds: short enough that what a run of minutes leaves
behind is pruned many times over within it. The one place to change them."""

DEFAULT_BOUND = 1.1
"""Largest last-quarter / second-quarter ratio of a figure that still counts as bounded."""
SAMPLES = 60
"""Samples over a run, at least (`MAX_INTERVAL_S` sets more for a long one)."""
MAX_INTERVAL_S = 2.0
"""Seconds between two samples, at most."""
PLANS_IN_FLIGHT = 2
TASKS = 12
CHAINS = 4
COMMITS = 2
SHARDS = 2
LANES_PER_SHARD = 4
PLAN_EVERY_S = 3.0
"""Seconds from one plan of a slot to its next, at least."""
KEYED_EVERY_S = 1.5
"""Seconds from one keyed lane to the next, at least."""
TICK_S = 0.1
"""Seconds between two polls of the plans in flight."""
PLAN_TIMEOUT_S = 120.0
SHOWN = 10


class Figure(msgspec.Struct, kw_only=True):
    """One figure's means over the second and the last quarter of the run, and their ratio;
    `bounded` None when it is not judged (`ratio` None: no sample in one of the quarters)."""

    second_quarter: float | None
    last_quarter: float | None
    ratio: float | None
    bounded: bool | None


class SoakReport(msgspec.Struct, kw_only=True):
    """What `run_soak` found (the module docstring says what each figure means)."""

    duration_s: float
    interval_s: float
    retention: dict[str, dict[str, float]]
    plans: int
    tasks: int
    pace: dict[str, int]
    failed: int
    failed_tasks: list[str]
    lost: int
    restarts: int
    bound: float
    bounded: bool
    unbounded: list[str]
    figures: dict[str, Figure]
    samples: dict[str, list[float | None]]

    @property
    def clean(self) -> bool:
        """Plans were done, and no task failed or was lost, and no child restarted."""
        return self.plans > 0 and self.failed == self.lost == self.restarts == 0

    @property
    def ok(self) -> bool:
        """Clean, and bounded."""
        return self.clean and self.bounded


def run_soak(
    duration_s: float,
    *,
    bound: float = DEFAULT_BOUND,
    retention: dict[str, dict[str, float]] | None = None,
) -> SoakReport:
    """Run the soak for `duration_s` seconds of submitting and sampling; see the module
    docstring. `retention` replaces `RETENTION` (tables -> keys -> values, as TOML takes them).
    Raises what the module docstring says."""
    retention = RETENTION if retention is None else retention
    interval_s = min(duration_s / SAMPLES, MAX_INTERVAL_S)
    base = Path(tempfile.mkdtemp(prefix="osup-soak-"))
    try:
        workspace = _workspace(base / "workspace")
        config = base / "tree.toml"
        config.write_text(_toml(retention))
        state = base / "state"
        with private_tree(
            workspace=workspace,
            state_dir=state,
            shards=SHARDS,
            lanes_per_shard=LANES_PER_SHARD,
            config=config,
        ) as client:
            run = _Run(client, state)
            run.soak(duration_s, interval_s)
            run.finish()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    times = [t for t, _, _ in run.samples]
    names = sorted({name for _, figures, _ in run.samples for name in figures})
    series = {name: [figures.get(name) for _, figures, _ in run.samples] for name in names}
    judged = {name: judge(times, values, duration_s, bound) for name, values in series.items()}
    done = [tasks for _, _, tasks in run.samples]
    over = [name for name, figure in judged.items() if figure.bounded is False]
    return SoakReport(
        duration_s=round(time.monotonic() - run.started, 2),
        interval_s=round(interval_s, 3),
        retention=retention,
        plans=run.plans,
        tasks=run.tasks,
        pace=_pace(times, done, duration_s),
        failed=len(run.failed),
        failed_tasks=run.failed[:SHOWN],
        lost=run.lost,
        restarts=run.restarts,
        bound=bound,
        bounded=not over and any(fig.bounded for fig in judged.values()),
        unbounded=over,
        figures=judged,
        samples={"t_s": [round(t, 3) for t in times], "tasks": [*done], **series},
    )


def judge(
    times: Sequence[float], values: Sequence[float | None], span_s: float, bound: float
) -> Figure:
    """The `Figure` of one series: `values[i]` read at `times[i]` seconds, over a run of
    `span_s` seconds; None values are left out of the means."""

    def mean(lo: float, hi: float) -> float | None:
        got = [v for t, v in zip(times, values, strict=True) if lo <= t < hi and v is not None]
        return sum(got) / len(got) if got else None

    second = mean(span_s / 4, span_s / 2)
    last = mean(3 * span_s / 4, float("inf"))
    if second is None or last is None:
        return Figure(second_quarter=second, last_quarter=last, ratio=None, bounded=None)
    # grown from nothing: no ratio, and not bounded
    ratio = round(last / second, 4) if second else (1.0 if last == 0 else None)
    return Figure(
        second_quarter=round(second, 1),
        last_quarter=round(last, 1),
        ratio=ratio,
        bounded=ratio is not None and ratio <= bound,
    )


def _pace(times: list[float], done: list[int], span_s: float) -> dict[str, int]:
    """Tasks done within the second and within the last quarter (`done[i]`: done by
    `times[i]`), from the samples: what the figures' ratios are to be read against."""

    def between(lo: float, hi: float) -> int:
        inside = [n for t, n in zip(times, done, strict=True) if lo <= t < hi]
        return inside[-1] - inside[0] if inside else 0

    return {
        "second_quarter": between(span_s / 4, span_s / 2),
        "last_quarter": between(3 * span_s / 4, float("inf")),
    }


def soak_plan(name: str, slot: int) -> f.PlanSpec:
    """`TASKS` short tasks in `CHAINS` chains; the first `COMMITS` write `soak/s<slot>-c<i>`
    in their sandbox and commit it (a later task of their chain sees it), the others write a
    file their commit=false sandbox keeps until it is removed."""
    specs = []
    for i in range(TASKS):
        needs = [f"t{i - CHAINS}"] if i >= CHAINS else []
        if i < COMMITS:
            path = f"soak/s{slot}-c{i}"
            run = f'mkdir -p soak && echo "{name} t{i} $ORCHESTRA_ATTEMPT" > {path}'
        else:
            run = f"echo {name} t{i} > out.txt && sleep 0.2"
        specs.append(f.TaskSpec(id=f"t{i}", run=run, needs=needs, commit=i < COMMITS))
    return f.PlanSpec(name=name, tasks=specs)


class _Run:
    """The plans in flight on one tree, what came of those done, and the samples so far."""

    def __init__(self, client: CtlClient, state: Path) -> None:
        self.client = client
        self.state = state
        self.slots: list[str | None] = [None] * (PLANS_IN_FLIGHT + 1)  # the last: keyed lanes
        self.given = [0.0] * len(self.slots)  # when each slot was given its plan (monotonic)
        self.every = [PLAN_EVERY_S] * PLANS_IN_FLIGHT + [KEYED_EVERY_S]
        self.submitted = 0
        self.plans = self.tasks = self.lost = self.restarts = 0
        self.failed: list[str] = []
        self.samples: list[tuple[float, footprint.Figures, int]] = []  # (t, figures, tasks)
        self.started = time.monotonic()

    def soak(self, duration_s: float, interval_s: float) -> None:
        """Keep every slot busy and sample every `interval_s` for `duration_s` seconds."""
        self.started = time.monotonic()
        next_sample = self.started
        while (now := time.monotonic()) - self.started < duration_s:
            self._poll()
            for slot, plan_id in enumerate(self.slots):
                if plan_id is None and now - self.given[slot] >= self.every[slot]:
                    self.slots[slot], self.given[slot] = self._next(slot), now
            if now >= next_sample:
                self.samples.append((now - self.started, self._sample(), self.tasks))
                while next_sample <= time.monotonic():  # a late sample delays, never bunches
                    next_sample += interval_s
            time.sleep(TICK_S)

    def finish(self) -> None:
        """Wait for the plans in flight (at most `PLAN_TIMEOUT_S`), all polled in turn, so
        none is pruned before it is seen done; read the restarts."""
        deadline = time.monotonic() + PLAN_TIMEOUT_S
        while any(self.slots) and time.monotonic() < deadline:
            self._poll()
            time.sleep(TICK_S)
        for plan_id in filter(None, self.slots):
            self._lost(plan_id)
        status = status_or_none(self.client)
        self.restarts = sum(c.restarts for c in status.children) if status else 0

    def _poll(self) -> None:
        """Empty the slots whose plans are done."""
        for slot, plan_id in enumerate(self.slots):
            if plan_id is not None and self._took(plan_id):
                self.slots[slot] = None

    def _next(self, slot: int) -> str:
        """Submit slot `slot`'s next plan; its id."""
        self.submitted += 1
        if slot < PLANS_IN_FLIGHT:
            spec = soak_plan(f"soak{self.submitted}", slot)
            reply = self.client.request(f.CtlSubmit(plan=spec), timeout_s=10.0)
            assert isinstance(reply, f.PlanAccepted)
            return reply.id
        params = {"run": "echo keyed", "key": f"soak-key-{self.submitted}"}
        answer = self.client.request(f.CtlCall(tool="start_lane", params=params), timeout_s=30.0)
        assert isinstance(answer, f.ToolResult)
        return str(answer.value["plan"])

    def _took(self, plan_id: str) -> bool:
        """Whether plan `plan_id` is done; a done one is counted, its tasks that did not
        succeed named."""
        reply = self.client.request(f.CtlPlan(id=plan_id), timeout_s=10.0)
        assert isinstance(reply, f.PlanReport)
        if not reply.done:
            return False
        self.plans += 1
        self.tasks += len(reply.tasks)
        for t in reply.tasks:
            if t.status != "succeeded":
                self.failed.append(f"{reply.plan} {t.id} {t.status} {t.error or t.failure}")
        return True

    def _lost(self, plan_id: str) -> None:
        reply = self.client.request(f.CtlPlan(id=plan_id), timeout_s=10.0)
        assert isinstance(reply, f.PlanReport)
        self.lost += sum(t.status != "succeeded" for t in reply.tasks) or 1

    def _sample(self) -> footprint.Figures:
        return footprint.sample(self.state, status_or_none(self.client))


def _toml(tables: dict[str, dict[str, float]]) -> str:
    """`tables` as TOML: a `[table]` line, then `key = value` lines, for each."""
    lines: list[str] = []
    for table, keys in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {value!r}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def _workspace(path: Path) -> Path:
    """A git repository of one commit at `path`, for the tree's custodian."""
    path.mkdir(parents=True)
    for args in (["init", "-q", "-b", "main"], ["add", "README"], ["commit", "-q", "-m", "seed"]):
        if args[0] == "add":
            (path / "README").write_text("bench soak\n")
        subprocess.run(
            ["git", "-c", "user.name=soak", "-c", "user.email=soak@localhost", *args],
            cwd=path,
            check=True,
            capture_output=True,
        )
    return path


def format_text(report: SoakReport) -> str:
    """A person's summary: the counts, then one line per figure (bytes in MiB)."""
    lines = [
        f"plans {report.plans}  tasks {report.tasks}  failed {report.failed}  lost "
        f"{report.lost}  restarts {report.restarts}  ({report.duration_s:g} s, a sample every "
        f"{report.interval_s:g} s)",
        f"tasks done in the second quarter {report.pace['second_quarter']}, in the last "
        f"{report.pace['last_quarter']}",
        *(f"  {line}" for line in report.failed_tasks),
        f"{'figure':<36} {'2nd quarter':>12} {'last quarter':>13} {'ratio':>7}",
    ]
    for name, fig in report.figures.items():
        scale = 1 / 2**20 if name.endswith("bytes") or name.startswith("rss.") else 1.0
        unit = " MiB" if scale != 1.0 else ""

        def shown(value: float | None, scale: float = scale, unit: str = unit) -> str:
            return "-" if value is None else f"{value * scale:.2f}{unit}"

        ratio = "-" if fig.ratio is None else f"{fig.ratio:.3f}"
        mark = {True: "", False: "  over", None: "  not judged"}[fig.bounded]
        lines.append(
            f"{name:<36} {shown(fig.second_quarter):>12} {shown(fig.last_quarter):>13} "
            f"{ratio:>7}{mark}"
        )
    verdict = "bounded" if report.bounded else f"NOT bounded ({', '.join(report.unbounded)})"
    lines.append(f"{verdict}: every ratio <= {report.bound:g}")
    return "\n".join(lines)


def plot_report(report: SoakReport, path: Path) -> None:
    """Write `path`: every figure over the run (`svgplot`), its ratio in its caption, dashed
    lines at the quarters. Raises `OSError` when `path` cannot be written."""
    from orchestra_sup.bench import svgplot

    times = [t or 0.0 for t in report.samples["t_s"]]
    series = {name: values for name, values in report.samples.items() if name != "t_s"}
    captions = {"tasks": "tasks done (not judged)"}
    span = max(times, default=0.0)
    for name, fig in report.figures.items():
        ratio = "not judged" if fig.ratio is None else f"last/second quarter {fig.ratio:.3f}"
        captions[name] = ratio + ("" if fig.bounded is not False else f" > {report.bound:g}")
    verdict = "bounded" if report.bounded else "NOT bounded"
    title = f"bench soak: {report.plans} plans, {report.tasks} tasks, {verdict}"
    svgplot.write_panels(
        path, title, times, series, captions=captions, marks=(span / 4, span / 2, 3 * span / 4)
    )
