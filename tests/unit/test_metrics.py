"""The supervisor's Prometheus metrics: exit causes, families for a fixed tree, and serving."""

from __future__ import annotations

import asyncio
import io
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from orchestra_sup.cli import render
from orchestra_sup.config import settings_from_mapping
from orchestra_sup.errors import ConfigError
from orchestra_sup.histogram import BATCH_BOUNDS_ROWS, LOOP_LAG_BOUNDS_S, RELAY_BOUNDS_S, Buckets
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes
from orchestra_sup.supervisor.core import ExitCause, exit_cause
from orchestra_sup.supervisor.metrics import (
    ChildSample,
    LoopUnresponsive,
    MetricsServer,
    TreeCollector,
    TreeSample,
    ask_loop,
)

# --- exit causes ----------------------------------------------------------------------------------

W = ExitCause.WATCHDOG


@pytest.mark.parametrize(
    ("info", "stopping", "killed_for", "cause"),
    [
        (f.ExitInfo(status=0), False, None, ExitCause.CLEAN),
        (f.ExitInfo(status=3), False, None, ExitCause.EXIT_CODE),
        (f.ExitInfo(status=143), False, None, ExitCause.EXIT_CODE),
        (f.ExitInfo(signal=signal.SIGKILL), False, None, ExitCause.SIGNAL),
        (f.ExitInfo(signal=signal.SIGTERM), False, None, ExitCause.SIGNAL),
        (f.ExitInfo(signal=signal.SIGKILL), False, W, ExitCause.WATCHDOG),
        (f.ExitInfo(status=0), False, W, ExitCause.WATCHDOG),  # it beat us to it: still ours
        (f.ExitInfo(status=0), True, None, ExitCause.STOPPED),
        (f.ExitInfo(signal=signal.SIGKILL), True, None, ExitCause.STOPPED),
        (f.ExitInfo(), False, None, ExitCause.UNKNOWN),
    ],
)
def test_exit_cause_table(
    info: f.ExitInfo, stopping: bool, killed_for: ExitCause | None, cause: ExitCause
) -> None:
    """What the supervisor did comes first (watchdog, then stopping), then the status."""
    assert exit_cause(info, stopping=stopping, killed_for=killed_for) is cause


# --- families for a fixed tree -------------------------------------------------------------------


def frame(bounds: tuple[float, ...], *values: float) -> f.Histogram:
    b = Buckets(bounds)
    for v in values:
        b.observe(v)
    return b.frame()


def fixed_tree() -> TreeSample:
    shard_beat = f.Heartbeat(
        loop_lag=frame(LOOP_LAG_BOUNDS_S, 0.0001, 0.003),
        lanes={"starting": 0, "running": 2, "awaiting_approval": 1, "moving": 0},
        persist_depth=7,
        persist_batches=frame(BATCH_BOUNDS_ROWS, 1, 3, 3),
        bad_frames=4,
        stale_frames=1,
        internal_errors=6,
    )
    coordinator_beat = f.Heartbeat(
        loop_lag=frame(LOOP_LAG_BOUNDS_S, 0.0002),
        relay=frame(RELAY_BOUNDS_S, 0.0003, 0.0003, 0.2),
        inbox_depth=5,
        persist_depth=0,
    )
    exits = {str(c): 0 for c in ExitCause}
    return TreeSample(
        children=(
            ChildSample(
                name="coordinator",
                role="coordinator",
                generation=1,
                up=True,
                restarts=0,
                operator_restarts=1,
                exits=exits,
                beat=coordinator_beat,
            ),
            ChildSample(
                name="shard-0",
                role="shard",
                generation=3,
                up=True,
                restarts=2,
                operator_restarts=0,
                exits={**exits, "signal": 1, "watchdog": 1},
                beat=shard_beat,
            ),
            ChildSample(
                name="shard-1",
                role="shard",
                generation=2,
                up=False,
                restarts=1,
                operator_restarts=0,
                exits={**exits, "exit_code": 1},
                beat=None,
            ),
        ),
        loop_lag=frame(LOOP_LAG_BOUNDS_S, 0.0004, 0.0004, 7.0),
        ctl_refused=3,
        bad_frames=0,
        stale_frames=2,
        internal_errors=5,
    )


@pytest.fixture
def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The fixed tree as Prometheus text, parsed back: (sample name, sorted labels) -> value."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TreeCollector(fixed_tree))
    text = generate_latest(registry).decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_child_counters_and_gauges(scraped: dict) -> None:
    """Restarts, operator restarts, exits by cause (every cause present), generation and up."""
    assert scraped[("orchestra_sup_child_restarts_total", (("child", "shard-0"),))] == 2
    operator = ("orchestra_sup_child_operator_restarts_total", (("child", "coordinator"),))
    assert scraped[operator] == 1
    exits = "orchestra_sup_child_exits_total"
    assert scraped[(exits, (("cause", "signal"), ("child", "shard-0")))] == 1
    assert scraped[(exits, (("cause", "watchdog"), ("child", "shard-0")))] == 1
    assert scraped[(exits, (("cause", "exit_code"), ("child", "shard-1")))] == 1
    assert scraped[(exits, (("cause", "clean"), ("child", "shard-1")))] == 0
    assert len([k for k in scraped if k[0] == exits]) == 3 * len(ExitCause)
    assert scraped[("orchestra_sup_child_generation", (("child", "shard-0"),))] == 3
    assert scraped[("orchestra_sup_child_up", (("child", "shard-0"),))] == 1
    assert scraped[("orchestra_sup_child_up", (("child", "shard-1"),))] == 0


def test_loop_lag_histograms_per_process(scraped: dict) -> None:
    """Supervisor and every child that has beaten: cumulative buckets, count and sum; a child
    with no heartbeat from its current process has no series."""
    lag = "orchestra_sup_loop_lag_seconds"
    sup = (("process", "supervisor"),)
    assert scraped[(lag + "_count", sup)] == 3
    assert scraped[(lag + "_sum", sup)] == pytest.approx(7.0008)
    assert scraped[(lag + "_bucket", (("le", "0.0005"), ("process", "supervisor")))] == 2
    assert scraped[(lag + "_bucket", (("le", "5.0"), ("process", "supervisor")))] == 2
    assert scraped[(lag + "_bucket", (("le", "+Inf"), ("process", "supervisor")))] == 3
    assert scraped[(lag + "_count", (("process", "shard-0"),))] == 2
    assert scraped[(lag + "_count", (("process", "coordinator"),))] == 1
    assert (lag + "_count", (("process", "shard-1"),)) not in scraped


def test_relay_histogram(scraped: dict) -> None:
    """The coordinator's relay round trips, bucketed as sent."""
    relay = "orchestra_sup_relay_seconds"
    assert scraped[(relay + "_count", ())] == 3
    assert scraped[(relay + "_bucket", (("le", "0.0005"),))] == 2
    assert scraped[(relay + "_bucket", (("le", "0.1"),))] == 2
    assert scraped[(relay + "_bucket", (("le", "0.25"),))] == 3
    assert scraped[(relay + "_sum", ())] == pytest.approx(0.2006)


def test_lanes_inbox_and_persistence(scraped: dict) -> None:
    """Lanes by shard and state, the coordinator's inbox, queue depths and batch sizes."""
    assert scraped[("orchestra_sup_lanes", (("shard", "shard-0"), ("state", "running")))] == 2
    key = ("orchestra_sup_lanes", (("shard", "shard-0"), ("state", "awaiting_approval")))
    assert scraped[key] == 1
    assert scraped[("orchestra_sup_inbox_depth", ())] == 5
    assert scraped[("orchestra_sup_persist_queue_rows", (("process", "shard-0"),))] == 7
    assert scraped[("orchestra_sup_persist_queue_rows", (("process", "coordinator"),))] == 0
    batches = "orchestra_sup_persist_batch_rows"
    assert scraped[(batches + "_count", (("process", "shard-0"),))] == 3
    assert scraped[(batches + "_bucket", (("le", "2.0"), ("process", "shard-0")))] == 1
    assert scraped[(batches + "_sum", (("process", "shard-0"),))] == 7


def test_refusal_counters(scraped: dict) -> None:
    """ctl refusals, bad and stale frames and internal errors per process (the supervisor's
    own included)."""
    assert scraped[("orchestra_sup_ctl_refused_total", ())] == 3
    assert scraped[("orchestra_sup_bad_frames_total", (("process", "shard-0"),))] == 4
    assert scraped[("orchestra_sup_stale_frames_total", (("process", "supervisor"),))] == 2
    assert scraped[("orchestra_sup_stale_frames_total", (("process", "shard-0"),))] == 1
    assert scraped[("orchestra_sup_internal_errors_total", (("process", "supervisor"),))] == 5
    assert scraped[("orchestra_sup_internal_errors_total", (("process", "shard-0"),))] == 6


# --- asking the loop, and serving ---------------------------------------------------------------


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own, as the supervisor's runs beside the HTTP
    thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def test_ask_loop_runs_on_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The function runs on the loop's thread and its result comes back."""
    assert ask_loop(loop, threading.get_ident, 5.0) != threading.get_ident()


def test_ask_loop_gives_up_on_a_wedged_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A loop that does not get to the request in time: LoopUnresponsive, and the request is
    never run afterwards."""
    release, wedged = threading.Event(), threading.Event()

    def wedge() -> None:
        wedged.set()
        release.wait()

    ran: list[int] = []
    loop.call_soon_threadsafe(wedge)
    assert wedged.wait(5.0)
    with pytest.raises(LoopUnresponsive, match="did not answer"):
        ask_loop(loop, lambda: ran.append(1), 0.05)
    release.set()
    assert ask_loop(loop, lambda: len(ran), 5.0) == 0


def test_scrape_of_a_wedged_loop_is_answered_503(loop: asyncio.AbstractEventLoop) -> None:
    """Over real HTTP: a healthy loop answers 200 with the families, a wedged one 503 with one
    line, instead of hanging the scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TreeCollector(lambda: ask_loop(loop, fixed_tree, 0.2)))
    server = MetricsServer(registry, "127.0.0.1", 0)
    server.start()
    try:
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            assert answer.status == 200
            assert b"orchestra_sup_child_up" in answer.read()
        release, wedged = threading.Event(), threading.Event()
        loop.call_soon_threadsafe(lambda: (wedged.set(), release.wait()))
        assert wedged.wait(5.0)
        try:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(server.url, timeout=10)
            with refused.value as answer:
                assert answer.code == 503
                assert b"did not answer within 0.2 s" in answer.read()
        finally:
            release.set()
    finally:
        server.close()


def test_a_port_in_use_is_a_config_error() -> None:
    """Binding a taken port fails at construction, one line naming the address."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"metrics 127.0.0.1:{port}: cannot listen"):
            MetricsServer(CollectorRegistry(), "127.0.0.1", port)


def test_an_unresolvable_host_is_a_config_error() -> None:
    """A host that does not resolve fails at construction, naming it."""
    with pytest.raises(ConfigError, match=r"metrics host 'no-such-host\.invalid'"):
        MetricsServer(CollectorRegistry(), "no-such-host.invalid", 0)


def test_url_brackets_an_ipv6_host() -> None:
    """An IPv6 address is bracketed in the URL (served on ::1 where the machine has it)."""
    try:
        server = MetricsServer(CollectorRegistry(), "::1", 0)
    except ConfigError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert server.url == f"http://[::1]:{server.port}/metrics"
    finally:
        server.close()


# --- configuration ------------------------------------------------------------------------------


def test_config_keys_for_the_metrics() -> None:
    """`[supervisor] metrics_port` / `metrics_host` are read; the default serves nothing."""
    assert settings_from_mapping({}).supervisor.metrics_port is None
    sup = settings_from_mapping(
        {"supervisor": {"metrics_port": 0, "metrics_host": "::1"}}
    ).supervisor
    assert (sup.metrics_port, sup.metrics_host) == (0, "::1")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"metrics_port": 65536}, "metrics_port = 65536: must be between 0 and 65535"),
        ({"metrics_port": "9464"}, 'metrics_port = "9464": expected an integer'),
        ({"metrics_host": ""}, 'metrics_host = "": expected a host name or address'),
        ({"metrics_host": 7}, "metrics_host = 7: expected a host name or address"),
    ],
)
def test_bad_metrics_config_is_refused(table: dict[str, object], message: str) -> None:
    """A bad port or host is refused naming the key and the value."""
    with pytest.raises(ConfigError) as refused:
        settings_from_mapping({"supervisor": table})
    assert str(refused.value) == f"[supervisor] {message}"


# --- ctl status ---------------------------------------------------------------------------------


def status(metrics_url: str) -> f.StatusReply:
    return f.StatusReply(
        supervisor_pid=10,
        version="0.1.0",
        run_dir="/run/x",
        state_dir="/state",
        workspace="/ws",
        children=[],
        metrics_url=metrics_url,
    )


def test_status_shows_the_metrics_url() -> None:
    """`ctl status --json` carries the URL ("" when off); the table prints it only when on."""
    url = "http://127.0.0.1:9464/metrics"
    assert shapes.status_json(status(url))["supervisor"]["metrics_url"] == url
    assert shapes.status_json(status(""))["supervisor"]["metrics_url"] == ""
    console = Console(file=io.StringIO(), width=200)
    render.status_table(status(url), console)
    assert f"metrics {url}" in console.file.getvalue()  # type: ignore[attr-defined]
    console = Console(file=io.StringIO(), width=200)
    render.status_table(status(""), console)
    assert "metrics" not in console.file.getvalue()  # type: ignore[attr-defined]
