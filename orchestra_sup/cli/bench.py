"""`orchestra-sup bench`: the benchmarks, each one command that runs it and prints its result
(`bench/README.md` says what each measures)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from orchestra_sup.cli.exits import EXIT_FAILED, EXIT_USAGE, fail, guarded
from orchestra_sup.cli.options import JsonOpt, dressed, option
from orchestra_sup.cli.output import out, print_json

bench_app = typer.Typer(
    help="Measure the tree (see bench/README.md).\n\nExample: orchestra-sup bench all --quick",
    no_args_is_help=True,
)


@dataclass(frozen=True)
class Measured:
    """What a benchmark command found: `value` (JSON-able), printed as JSON with --json, else
    by `text(value)` for a person; with `ok` False the command then exits 1."""

    value: Any
    text: Callable[[Any], object]
    ok: bool = True


def benchmark(
    name: str | None = None,
) -> Callable[[Callable[..., Measured]], Callable[..., Measured]]:
    """Make a `bench` command (named `name`, default the function's) of a function that runs a
    benchmark and returns it `Measured`, its own options followed by --json."""
    as_json = option("as_json", JsonOpt, False)

    def decorate(command: Callable[..., Measured]) -> Callable[..., Measured]:
        def run(as_json: bool, **kwargs: Any) -> None:
            measured = command(**kwargs)
            if as_json:
                print_json(measured.value)
            else:
                measured.text(measured.value)
            if not measured.ok:
                raise typer.Exit(EXIT_FAILED)

        bench_app.command(name)(dressed(run, command, after=[as_json]))
        return command

    return decorate


def _echo(table: Callable[[Any], str]) -> Callable[[Any], None]:
    """Print `table(value)` as it is, for a benchmark whose module formats its own table."""
    return lambda value: typer.echo(table(value))


HoldCpuLatencyOpt = Annotated[
    bool,
    typer.Option(
        "--hold-cpu-latency",
        help="Hold /dev/cpu_dma_latency at 0 for the whole run (no deep idle states).",
    ),
]


CpuConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--cpu-config",
        help="A TOML file whose \\[cpu] table the policy tree runs with (default: real time where "
        "allowed, the control plane on the lowest CPU).",
    ),
]


@benchmark()
def relay(
    iterations: Annotated[
        int, typer.Option("--iterations", min=10, help="Timed round trips per variant.")
    ] = 5000,
    hold_cpu_latency: HoldCpuLatencyOpt = False,
    cpu_config: Annotated[
        Path | None,
        typer.Option(
            "--cpu-config",
            help="A TOML file whose \\[cpu] table the bench's tree runs with (default: the "
            "default \\[cpu]; busy_poll_s = 0 there measures the relay without busy polling).",
        ),
    ] = None,
    remote: Annotated[
        bool,
        typer.Option(
            "--remote",
            help="Instead: a host's shard through its agent's data port (tcp+CURVE), beside "
            "the same shard over ipc and a raw pyzmq tcp+CURVE echo.",
        ),
    ] = False,
) -> Measured:
    """The relay's round trip next to raw pyzmq between two processes, in one run.

    Exits 2 before anything starts when --hold-cpu-latency cannot open /dev/cpu_dma_latency,
    or --cpu-config cannot be read or holds a bad \\[cpu] value.
    Example: orchestra-sup bench relay --iterations 2000 --json
    """
    from orchestra_sup.bench.relay import format_text, run_relay_bench

    if remote:
        from orchestra_sup.bench import remote as hop

        return Measured(
            guarded(lambda: hop.run_remote_bench(iterations, max(10, iterations // 10))),
            _echo(hop.format_text),
        )
    return Measured(
        guarded(
            lambda: run_relay_bench(
                iterations,
                max(10, iterations // 10),
                hold_cpu_latency=hold_cpu_latency,
                cpu_config=cpu_config,
            )
        ),
        _echo(format_text),
    )


@benchmark()
def isolation(
    quick: Annotated[bool, typer.Option("--quick", help="Fewer probes, under a minute.")] = False,
    probes: Annotated[
        int | None, typer.Option("--probes", min=2, help="Turns timed per phase (overrides).")
    ] = None,
    hold_cpu_latency: HoldCpuLatencyOpt = False,
    cpu_config: CpuConfigOpt = None,
) -> Measured:
    """Coordinator turn latency idle and under lane load, in one run: separated under the CPU
    policy, separated at the defaults, colocated; and the lanes' throughput under the policy
    against the defaults'.

    Exits 2 before any tree starts when --hold-cpu-latency cannot open /dev/cpu_dma_latency,
    or --cpu-config cannot be read.
    Example: orchestra-sup bench isolation --quick --json
    """
    from orchestra_sup.bench.isolation import format_table, run_isolation_bench

    return Measured(
        guarded(lambda: run_isolation_bench(quick, probes, hold_cpu_latency, cpu_config)),
        _echo(format_table),
    )


@benchmark()
def reaction(
    steps: Annotated[
        int, typer.Option("--steps", min=2, help="Lanes per session, one after the other.")
    ] = 20,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Sessions per phase.")] = 3,
    cpu_config: CpuConfigOpt = None,
) -> Measured:
    """A coordinator program's reaction time (a lane's result reaching the coordinator to its
    next start_lane reaching a shard), idle and under lane load: separated under the CPU
    policy, separated at the defaults, colocated.

    Example: orchestra-sup bench reaction --steps 20 --runs 2 --json
    """
    from orchestra_sup.bench.reaction import format_table, run_reaction_bench

    return Measured(
        guarded(lambda: run_reaction_bench(steps, runs, cpu_config)), _echo(format_table)
    )


@benchmark()
def scale(
    counts: Annotated[
        str, typer.Option("--counts", help="Comma-separated numbers of parked lanes, rising.")
    ] = "10,100,1000",
    iterations: Annotated[
        int, typer.Option("--iterations", min=10, help="Timed message_lane calls per count.")
    ] = 2000,
) -> Measured:
    """Relay latency and shard memory per lane as parked lanes pile up (8 shards), in one run.

    Example: orchestra-sup bench scale --counts 10,100,1000 --json
    """
    from orchestra_sup.bench.scale import MAX_PARKED, format_table, run_scale_bench

    try:
        steps = tuple(int(c) for c in counts.split(","))
    except ValueError:
        raise fail(f"--counts {counts!r}: expected comma-separated integers", EXIT_USAGE) from None
    if not steps or any(c < 1 for c in steps) or list(steps) != sorted(set(steps)):
        raise fail(f"--counts {counts!r}: expected rising positive integers", EXIT_USAGE)
    if steps[-1] > MAX_PARKED:
        raise fail(f"--counts {counts!r}: at most {MAX_PARKED} parked lanes", EXIT_USAGE)
    result = guarded(lambda: run_scale_bench(steps, iterations, max(10, iterations // 10)))
    return Measured(result, _echo(format_table))


@benchmark("plan")
def plan_bench(
    tasks: Annotated[
        str, typer.Option("--tasks", help="Comma-separated plan sizes (tasks), rising.")
    ] = "100,1000,10000",
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs per shape and size.")] = 3,
) -> Measured:
    """Submit-to-done and the coordinator's loop-lag p99 for a chain, a fan-out and a fan-in of
    each size, on one private tree (2 shards of 8 lanes), in one run.

    Example: orchestra-sup bench plan --tasks 100,1000 --runs 2 --json
    """
    from orchestra_sup.bench.plans import format_table, run_plan_bench
    from orchestra_sup.coordinator.plan import MAX_TASKS

    try:
        sizes = tuple(int(n) for n in tasks.split(","))
    except ValueError:
        raise fail(f"--tasks {tasks!r}: expected comma-separated integers", EXIT_USAGE) from None
    if not sizes or any(n < 2 for n in sizes) or list(sizes) != sorted(set(sizes)):
        raise fail(f"--tasks {tasks!r}: expected rising integers of at least 2", EXIT_USAGE)
    if sizes[-1] > MAX_TASKS:
        raise fail(f"--tasks {tasks!r}: a plan holds at most {MAX_TASKS:,} tasks", EXIT_USAGE)
    return Measured(guarded(lambda: run_plan_bench(sizes, runs)), _echo(format_table))


@benchmark("all")
def all_benches(
    quick: Annotated[
        bool, typer.Option("--quick", help="Short settings: about 80 s on 2 cores.")
    ] = False,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where the JSON files, summary.md and plots go.")
    ] = Path("bench-results"),
    only: Annotated[
        str | None, typer.Option("--only", help="Comma-separated benchmark names to run.")
    ] = None,
) -> Measured:
    """Every benchmark in one run: a JSON file each, summary.md, and plots with matplotlib.

    Exits 1 when a benchmark failed (the others still ran and wrote their files).
    Example: orchestra-sup bench all --quick --out /tmp/bench
    """
    from orchestra_sup.bench.suite import BENCHES, run_suite

    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    for name in names or []:
        if name not in BENCHES:
            raise fail(
                f"--only: unknown benchmark {name!r} (known: {', '.join(BENCHES)})", EXIT_USAGE
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"--out {out_dir}: {exc.strerror}", EXIT_USAGE) from None
    report = guarded(lambda: run_suite(quick, out_dir, names))
    failed = [n for n, b in report["benches"].items() if b["error"] is not None]
    return Measured(report, lambda r: typer.echo(Path(r["summary"]).read_text()), ok=not failed)


@benchmark()
def chaos(
    duration: Annotated[
        float, typer.Option("--duration", min=1.0, help="Seconds of random SIGKILLs.")
    ] = 30.0,
    tasks: Annotated[int, typer.Option("--tasks", min=50, help="Tasks per plan.")] = 60,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed.")] = None,
    hosts: Annotated[
        int,
        typer.Option(
            "--hosts",
            min=0,
            max=8,
            help="Host agents that join, each in a network namespace (root; needs etcd): "
            "half the harm is a host killed or partitioned.",
        ),
    ] = 0,
) -> Measured:
    """Run plans while a random child is SIGKILLed every 1-3 s; count what was lost.

    Exits 1 when nothing succeeded, a success left no ledger line, anything was lost or
    duplicated, an orphan was left, or the supervisor died.
    Example: orchestra-sup bench chaos --duration 20 --json
    """
    from orchestra_sup.bench.chaos import run_chaos

    report = guarded(lambda: run_chaos(duration, tasks=tasks, seed=seed, hosts=hosts))
    return Measured(msgspec.to_builtins(report), _fields_text, ok=report.clean)


@benchmark()
def soak(
    duration: Annotated[
        float,
        typer.Option("--duration", min=20.0, help="Seconds of submitting plans and sampling."),
    ] = 1800.0,
    bound: Annotated[
        float,
        typer.Option("--bound", min=1.0, help="Largest last/second-quarter ratio that is bounded."),
    ] = 1.1,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also write every figure over time to this SVG file."),
    ] = None,
) -> Measured:
    """Plans at a steady pace under short retention, sampling the state's size, the processes'
    memory and descriptors, sandboxes and the event log: is it all bounded?

    Exits 1 when a task failed or was lost, a child restarted, or a figure's last-quarter mean
    is over --bound times its second-quarter mean; 2 when --plot cannot be written.
    Example: orchestra-sup bench soak --duration 300 --plot soak.svg --json
    """
    from orchestra_sup.bench.soak import format_text, plot_report, run_soak

    if plot is not None and not plot.parent.is_dir():
        raise fail(f"--plot {plot}: no directory {plot.parent}", EXIT_USAGE)
    report = guarded(lambda: run_soak(duration, bound=bound))
    if plot is not None:
        try:
            plot_report(report, plot)
        except OSError as exc:
            raise fail(f"--plot {plot}: {exc.strerror}", EXIT_USAGE) from None
    return Measured(
        msgspec.to_builtins(report), lambda _: typer.echo(format_text(report)), ok=report.ok
    )


@benchmark()
def console(
    consoles: Annotated[
        int, typer.Option("--consoles", min=1, help="Console pages streaming at once.")
    ] = 20,
    duration: Annotated[
        float, typer.Option("--duration", min=2.0, help="Seconds of each phase.")
    ] = 30.0,
    runs: Annotated[
        int, typer.Option("--runs", min=1, help="Runs of both phases, in ABBA order.")
    ] = 3,
) -> Measured:
    """The supervisor's loop lag with console pages streaming the HTTP API's events, beside
    none, under a steady plan load, on one private tree (2 shards).

    Exits 1 when a task failed, a child restarted, or the consoles read no events or saw a seq
    missed or repeated.
    Example: orchestra-sup bench console --consoles 20 --duration 30 --runs 3 --json
    """
    from orchestra_sup.bench.console import format_table, run_console_bench

    result = guarded(lambda: run_console_bench(consoles, duration, runs))
    return Measured(result, _echo(format_table), ok=result["clean"])


def _fields_text(value: dict[str, Any]) -> None:
    for key, field in value.items():
        typer.echo(f"{key:>16}: {field}")


@benchmark()
def persist(
    events: Annotated[
        int, typer.Option("--events", min=100, help="Events in the write-behind passes.")
    ] = 20_000,
) -> Measured:
    """One synced transaction per event next to write-behind, on one event stream, in one run.

    Example: orchestra-sup bench persist --events 50000 --json
    """
    from orchestra_sup.bench.persist import format_table, run_persist

    return Measured(guarded(lambda: run_persist(events)), _echo(format_table))


@benchmark("restart")
def restart_bench(
    kills: Annotated[
        int,
        typer.Option("--kills", min=1, help="SIGKILLs of shard-0 per spawn mode (20+ for p90)."),
    ] = 20,
) -> Measured:
    """Restart after SIGKILL of a shard, forked from the template and exec'd, next to the cost
    of a fresh interpreter, in one run.

    Example: orchestra-sup bench restart --kills 30 --json
    """
    from orchestra_sup.bench.restart import run_restart_bench

    return Measured(guarded(lambda: run_restart_bench(kills)), _restart_text)


def _restart_text(result: dict[str, Any]) -> None:
    base = result["baseline"]
    out.print(
        f"fresh interpreter to READY: p50 {base['interpreter_p50_ms']} ms, "
        f"p90 {base['interpreter_p90_ms']} ms ({base['n']} starts)"
    )
    for key, label in (("restart", "fork template"), ("restart_exec", "fresh interpreter")):
        stats = result[key]
        out.print(
            f"restart, {label}: p50 {stats['p50_ms']} ms, p90 {stats['p90_ms']} ms "
            f"({stats['n']} kills; spawned {stats['spawned']})"
        )
    target = result["target"]
    met = "met" if target["met"] else "not met"
    out.print(f"ratio p50 {result['ratio_p50']}; target p50 <= {target['p50_ms']} ms: {met}")
