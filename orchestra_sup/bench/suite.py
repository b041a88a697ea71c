"""`orchestra-sup bench all`: every benchmark in one run, one JSON file each, and a summary.

Each benchmark runs as its own command would (`bench relay`, `bench isolation`, ...), one after
the other in this process, with the settings `--quick` picks (`QUICK`) or the full ones (`FULL`).
The output directory gets:

- `<name>.json`: that benchmark's full JSON, as `bench <name> --json` prints it, plus
  `"elapsed_s"`, the wall seconds it took;
- `summary.md`: one table per benchmark with its headline figures and their same-run baselines;
- `<name>.png`: latency distributions (empirical CDFs) of the benchmarks that keep their samples,
  when matplotlib is installed (`pip install 'orchestra-sup[plots]'`); otherwise `summary.md`
  says why there are none.

A benchmark that raises is recorded in the summary with its one-line error, and the others still
run; `run_suite` reports which failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestra_sup.bench import machine

Runner = Callable[[bool], dict[str, Any]]


def _relay(quick: bool) -> dict[str, Any]:
    from orchestra_sup.bench.relay import run_relay_bench

    iterations = 1000 if quick else 5000
    return run_relay_bench(iterations, iterations // 10)


def _isolation(quick: bool) -> dict[str, Any]:
    from orchestra_sup.bench.isolation import run_isolation_bench

    return run_isolation_bench(quick)


def _reaction(quick: bool) -> dict[str, Any]:
    from orchestra_sup.bench.reaction import run_reaction_bench

    return run_reaction_bench(3, 2) if quick else run_reaction_bench()


def _restart(quick: bool) -> dict[str, Any]:
    from orchestra_sup.bench.restart import run_restart_bench

    return run_restart_bench(20)


def _scale(quick: bool) -> dict[str, Any]:
    from orchestra_sup.bench.scale import run_scale_bench

    iterations = 500 if quick else 2000
    return run_scale_bench(iterations=iterations, warmup=iterations // 10)


def _persist(quick: bool) -> dict[str, Any]:
    from orchestra_sup.bench.persist import run_persist

    return run_persist(5000 if quick else 20_000)


def _chaos(quick: bool) -> dict[str, Any]:
    import msgspec

    from orchestra_sup.bench.chaos import run_chaos

    return msgspec.to_builtins(run_chaos(10.0 if quick else 30.0))


BENCHES: dict[str, Runner] = {
    "relay": _relay,
    "isolation": _isolation,
    "reaction": _reaction,
    "restart": _restart,
    "scale": _scale,
    "persist": _persist,
    "chaos": _chaos,
}
"""In the order they run: the latency benchmarks first, on a machine nothing else has warmed."""
UNITS = {"relay": "us", "isolation": "ms", "reaction": "ms", "scale": "us"}
"""The unit of each benchmark's plotted samples."""


def _rows(name: str, r: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures of benchmark `name` as (figure, value) rows for the summary, and
    the machine it ran on when it records one (`bench.machine`)."""
    rows = _headlines(name, r)
    if "machine" in r:
        rows.append(("machine", machine.one_line(r["machine"])))
    return rows


def _headlines(name: str, r: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures of benchmark `name` as (figure, value) rows."""
    if name == "relay":
        base = r["baseline"]
        rows = [("raw pyzmq round trip p50 / p99", f"{base['p50_us']} / {base['p99_us']} us")]
        for rung, s in r["python_floors"].items():
            rows.append(
                (
                    f"python floor {rung} p50 / p99",
                    f"{s['p50_us']} / {s['p99_us']} us "
                    f"({s['ratio_p50']}x / {s['ratio_p99']}x the floor)",
                )
            )
        for tool, s in r["relays"].items():
            rows.append(
                (
                    f"relay {tool} p50 / p99",
                    f"{s['p50_us']} / {s['p99_us']} us "
                    f"({s['ratio_p50']}x / {s['ratio_p99']}x the floor)",
                )
            )
        return rows
    if name == "isolation":
        rows = []
        for mode in ("separated", "default", "colocated"):
            m = r[mode]
            rows.append(
                (
                    f"{mode}: turn p99 idle -> loaded",
                    f"{m['idle_turn_p99_ms']} -> {m['loaded_turn_p99_ms']} ms "
                    f"({m['ratio']}x); shard loop p99 {m['host_loop_p99_ms']} ms; "
                    f"lanes {m['lane_cpu_s_per_s']} CPU s/s",
                )
            )
        rows.append(("lanes' throughput under the policy", f"{r['throughput_ratio']}x"))
        return rows
    if name == "reaction":
        return [
            (
                f"{mode}: reaction p50 / p99 idle -> loaded",
                f"{r[mode]['idle']['p50_ms']} / {r[mode]['idle']['p99_ms']} -> "
                f"{r[mode]['loaded']['p50_ms']} / {r[mode]['loaded']['p99_ms']} ms "
                f"({r[mode]['ratio']}x p99)",
            )
            for mode in ("separated", "default", "colocated")
        ]
    if name == "restart":
        fork, exe, base = r["restart"], r["restart_exec"], r["baseline"]
        return [
            (
                "shard SIGKILL to its replacement's handshake, p50 / p90",
                f"{fork['p50_ms']} / {fork['p90_ms']} ms forked from the template; "
                f"{exe['p50_ms']} / {exe['p90_ms']} ms exec'ing an interpreter",
            ),
            (
                "bare interpreter with the same imports, p50",
                f"{base['interpreter_p50_ms']} ms (restart is {r['ratio_p50']}x of it)",
            ),
        ]
    if name == "scale":
        return [
            (
                f"{step['lanes']} parked lanes: message_lane p50 / p99",
                f"{step['relay']['p50_us']} / {step['relay']['p99_us']} us "
                f"({step['relay']['ratio_p50']}x the first); "
                f"{step['shard_bytes_per_lane'] / 1024:.1f} KiB of shard memory per added lane",
            )
            for step in r["steps"].values()
        ]
    if name == "persist":
        wb = r["write_behind"]
        return [
            ("write-behind vs one synced commit per event", f"{r['ratio']}x events/s"),
            ("enqueue p99", f"{wb['enqueue_p99_us']} us"),
            ("enqueue to durable p99", f"{wb['durable_p99_ms']} ms"),
        ]
    if name == "chaos":
        return [
            ("kills / restarts / tasks", f"{r['kills']} / {r['restarts']} / {r['tasks']}"),
            ("succeeded / unrecorded", f"{r['succeeded']} / {r['unrecorded']}"),
            ("lost / duplicated / orphans", f"{r['lost']} / {r['duplicated']} / {r['orphans']}"),
        ]
    return []


def _distributions(name: str, r: dict[str, Any]) -> dict[str, list[float]]:
    """Named latency samples of benchmark `name` to plot (empty when it keeps none)."""
    if name == "relay":
        return {f"{k} round trip": v for k, v in r["samples_us"].items()}
    if name == "scale":
        return {f"{k} parked lanes": v["samples_us"] for k, v in r["steps"].items()}
    if name in ("isolation", "reaction"):
        return {
            f"{mode} {phase}": r[mode]["samples_ms"][phase]
            for mode in ("separated", "default", "colocated")
            for phase in ("idle", "loaded")
        }
    return {}


def plot_cdf(path: Path, title: str, unit: str, series: dict[str, list[float]]) -> None:
    """Write a PNG at `path`: the empirical CDF of each named series of samples (in `unit`), on
    a log x axis. Raises `ImportError` without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, samples in series.items():
        ordered = sorted(samples)
        n = len(ordered)
        ax.plot(ordered, [(i + 1) / n for i in range(n)], label=label)
    ax.set_xscale("log")
    ax.set_xlabel(unit)
    ax.set_ylabel("fraction of samples")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_suite(quick: bool, out: Path, only: list[str] | None = None) -> dict[str, Any]:
    """Run `only` (default: every benchmark in `BENCHES`) and write `out` (created).

    Returns {"benches": {name: {"elapsed_s": float, "error": str | None}}, "plots": [file names],
    "summary": path of summary.md}. Raises `ValueError` for an unknown name in `only`.
    """
    names = only or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r} (known: {', '.join(BENCHES)})")
    out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401

        plots_why_not = None
    except ImportError:
        plots_why_not = "matplotlib is not installed (pip install 'orchestra-sup[plots]')"
    lines = [f"# orchestra-sup bench all{' --quick' if quick else ''}", ""]
    report: dict[str, Any] = {"benches": {}, "plots": []}
    for name in names:
        t0 = time.monotonic()
        try:
            result = BENCHES[name](quick)
            error = None
        except Exception as exc:  # one benchmark failing must not lose the others' figures
            result, error = {}, f"{type(exc).__name__}: {exc}"
        elapsed = round(time.monotonic() - t0, 1)
        report["benches"][name] = {"elapsed_s": elapsed, "error": error}
        lines += [f"## {name} ({elapsed} s)", ""]
        if error is not None:
            lines += [f"failed: {error}", ""]
            continue
        (out / f"{name}.json").write_text(json.dumps({**result, "elapsed_s": elapsed}, indent=2))
        lines += ["| figure | value |", "| --- | --- |"]
        lines += [f"| {label} | {value} |" for label, value in _rows(name, result)]
        lines.append("")
        series = _distributions(name, result)
        if series and plots_why_not is None:
            plot_cdf(out / f"{name}.png", f"bench {name}", UNITS[name], series)
            report["plots"].append(f"{name}.png")
            lines += [f"![{name}]({name}.png)", ""]
    if plots_why_not is not None:
        lines += [f"No plots: {plots_why_not}.", ""]
    summary = out / "summary.md"
    summary.write_text("\n".join(lines))
    report["summary"] = str(summary)
    return report
