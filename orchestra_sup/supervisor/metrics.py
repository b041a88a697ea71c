"""Prometheus metrics of the tree, served over HTTP by the supervisor (`start --metrics-port`).

What is exposed (every name `orchestra_sup_*`, units in the names):

- per child (label `child`): `child_restarts_total` (restarts by its supervisor after an exit),
  `child_operator_restarts_total` (`ctl restart`), `child_exits_total` (label `cause`:
  `core.ExitCause`, every cause listed from zero), `child_generation`, `child_up` (1 while
  running);
- per process (label `process`: a child's name, or `supervisor` for this process's own figures):
  `loop_lag_seconds` (histogram of every event-loop lag sample since the process started),
  `persist_queue_rows` and `persist_batch_rows` (the write-behind queue's depth, and a histogram
  of writes per transaction; processes with a store only), `bad_frames_total`,
  `stale_frames_total`, `internal_errors_total` (requests answered `internal`), `fenced_total`
  (hosts' lane results and commits refused as fenced, ADR 0021), `open_fds` and
  `max_fds` (descriptors in use, and the soft open-file limit), `connections_refused_total`
  (connections refused beyond a bound or near that limit, `protocol.connections`);
- `relay_seconds`: histogram of the coordinator's relay round trips (its calls to the custodian
  and the shards), send to answer;
- `lanes` (labels `shard`, `state`): each shard's live lanes by state;
- `inbox_depth`: the coordinator's inbox messages not yet acted on;
- `ctl_refused_total`: ctl requests refused `forbidden` and remote peers refused at the handshake;
- `ctl_connections`: ctl connections served now;
- `state_disk_free_bytes`, `state_disk_min_free_bytes` and `state_disk_short` (1 while new
  plans and lanes are refused for want of space, `system.reserve`).

Child figures come from each child's last heartbeat (`Liveness.beat`); a child's histograms
restart from zero with each new generation, which Prometheus reads as a counter reset. A child
that has not beaten since it (re)started has no process-level series until it does.

Threads (the decision, and why): the HTTP server is prometheus-client's WSGI stack on a thread of
its own (a thread per request), so a slow or stuck scraper never touches the event loop. The
supervisor's state belongs to the loop, so the collector never reads it from the HTTP thread: it
asks the loop for an immutable `TreeSample` (`sample`, a few microseconds of work there) and
waits at most `SAMPLE_DEADLINE_S`. A wedged loop therefore makes a scrape fail fast with HTTP 503
(and Prometheus's `up` 0 for the target) instead of hanging it, and the families are built from
the sample off the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from orchestra_sup.errors import ConfigError, OrchestraError
from orchestra_sup.protocol import frames as f
from orchestra_sup.supervisor.core import ExitCause
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.views import MetricsHost
from orchestra_sup.system.reserve import DiskSpace

log = logging.getLogger("orchestra_sup.supervisor")

SAMPLE_DEADLINE_S = 2.0
"""How long a scrape waits for the supervisor's loop to hand over its figures before it is
answered 503 (well inside Prometheus's default 10 s scrape timeout)."""
SUPERVISOR = "supervisor"
"""The `process` label of the supervisor's own figures."""


@dataclass(frozen=True, slots=True)
class ChildSample:
    """One worker as the metrics show it: its control record and its last heartbeat (None
    before the first from its current process)."""

    name: str
    role: str
    generation: int
    up: bool
    restarts: int
    operator_restarts: int
    exits: dict[str, int]
    beat: f.Heartbeat | None


@dataclass(frozen=True, slots=True)
class TreeSample:
    """The whole tree at one moment, taken on the loop, read on the HTTP thread."""

    children: tuple[ChildSample, ...]
    loop_lag: f.Histogram
    """The supervisor's own event-loop lag, seconds."""
    ctl_refused: int
    bad_frames: int
    stale_frames: int
    internal_errors: int = 0
    descriptors: f.Descriptors | None = None
    """The supervisor's own."""
    ctl_connections: int = 0
    state_disk: DiskSpace | None = None


def sample(sup: MetricsHost) -> TreeSample:
    """What `families` needs from `sup`, copied. On the supervisor's loop only."""
    children, sockets = sup.children, sup.sockets
    return TreeSample(
        children=tuple(
            ChildSample(
                name=w.name,
                role=w.spec.role,
                generation=w.generation,
                up=w.state is ChildState.RUNNING,
                restarts=w.restarts,
                operator_restarts=w.operator_restarts,
                exits={str(cause): n for cause, n in w.exits.items()},
                beat=children.liveness[w.name].beat,
            )
            for w in children.workers
        ),
        loop_lag=sup.lag.buckets.frame(),
        ctl_refused=sup.ctl_refused(),
        bad_frames=sockets.bad_frames(),
        stale_frames=sockets.stale_frames(),
        internal_errors=sockets.internal_errors(),
        descriptors=sockets.descriptors(),
        ctl_connections=sockets.ctl_connections(),
        state_disk=sup.state_disk(),
    )


def families(tree: TreeSample) -> list[Metric]:
    """The metric families of `tree` (pure: the same sample gives the same families)."""
    child, process = ["child"], ["process"]
    restarts = CounterMetricFamily(
        "orchestra_sup_child_restarts",
        "Restarts of a child by its supervisor after its process exited.",
        labels=child,
    )
    operator = CounterMetricFamily(
        "orchestra_sup_child_operator_restarts",
        "Restarts of a child asked for with ctl restart.",
        labels=child,
    )
    exits = CounterMetricFamily(
        "orchestra_sup_child_exits",
        "Exits of a child's processes by cause (clean, exit_code, signal, watchdog, stopped, "
        "unknown).",
        labels=["child", "cause"],
    )
    generation = GaugeMetricFamily(
        "orchestra_sup_child_generation",
        "The child's current generation (bumped by every restart and rollover).",
        labels=child,
    )
    up = GaugeMetricFamily(
        "orchestra_sup_child_up", "1 while the child is running, else 0.", labels=child
    )
    loop_lag = HistogramMetricFamily(
        "orchestra_sup_loop_lag_seconds",
        "How late each process's event loop ran a timer, every sample since it started.",
        labels=process,
    )
    relay = HistogramMetricFamily(
        "orchestra_sup_relay_seconds",
        "The coordinator's relay round trips (calls to the custodian and shards), send to answer.",
    )
    lanes = GaugeMetricFamily(
        "orchestra_sup_lanes", "Each shard's live lanes by state.", labels=["shard", "state"]
    )
    inbox = GaugeMetricFamily(
        "orchestra_sup_inbox_depth", "The coordinator's inbox messages not yet acted on."
    )
    queue = GaugeMetricFamily(
        "orchestra_sup_persist_queue_rows",
        "Writes queued for a process's write-behind thread, not yet committed.",
        labels=process,
    )
    batches = HistogramMetricFamily(
        "orchestra_sup_persist_batch_rows",
        "Writes per write-behind transaction of a process.",
        labels=process,
    )
    bad = CounterMetricFamily(
        "orchestra_sup_bad_frames", "Frames a process refused as undecodable.", labels=process
    )
    stale = CounterMetricFamily(
        "orchestra_sup_stale_frames",
        "Frames a process refused as meant for, or sent by, another generation.",
        labels=process,
    )
    internal = CounterMetricFamily(
        "orchestra_sup_internal_errors",
        "Requests a process answered internal: an unexpected exception serving them.",
        labels=process,
    )
    fenced = CounterMetricFamily(
        "orchestra_sup_fenced",
        "Hosts' lane results and commits a process refused as coming from a fenced attempt.",
        labels=process,
    )
    ctl_refused = CounterMetricFamily(
        "orchestra_sup_ctl_refused",
        "Ctl requests refused as forbidden, and remote peers refused at the CURVE handshake.",
    )
    open_fds = GaugeMetricFamily(
        "orchestra_sup_open_fds", "File descriptors a process has open.", labels=process
    )
    max_fds = GaugeMetricFamily(
        "orchestra_sup_max_fds",
        "A process's soft open-file limit (new descriptors fail with EMFILE there).",
        labels=process,
    )
    conn_refused = CounterMetricFamily(
        "orchestra_sup_connections_refused",
        "Connections a process refused beyond a bound (ctl_connections) or near its open-file "
        "limit.",
        labels=process,
    )
    ctl_connections = GaugeMetricFamily(
        "orchestra_sup_ctl_connections", "Ctl connections the supervisor serves now."
    )

    disk = [
        GaugeMetricFamily(
            "orchestra_sup_state_disk_free_bytes",
            "Free space on the state directory's file system, bytes.",
        ),
        GaugeMetricFamily(
            "orchestra_sup_state_disk_min_free_bytes",
            "The state disk's reserve ([state] min_free), bytes.",
        ),
        GaugeMetricFamily(
            "orchestra_sup_state_disk_short",
            "1 while free space is below the reserve: new plans and lanes are refused.",
        ),
    ]
    if tree.state_disk is not None:
        space = tree.state_disk
        figures = (space.free, space.min_free, int(space.short))
        for family, value in zip(disk, figures, strict=True):
            family.add_metric([], value)

    def add_fds(name: str, d: f.Descriptors | None) -> None:
        if d is not None:
            open_fds.add_metric([name], d.open)
            max_fds.add_metric([name], d.limit)
            conn_refused.add_metric([name], d.refused)

    _histogram(loop_lag, [SUPERVISOR], tree.loop_lag)
    bad.add_metric([SUPERVISOR], tree.bad_frames)
    stale.add_metric([SUPERVISOR], tree.stale_frames)
    internal.add_metric([SUPERVISOR], tree.internal_errors)
    ctl_refused.add_metric([], tree.ctl_refused)
    add_fds(SUPERVISOR, tree.descriptors)
    ctl_connections.add_metric([], tree.ctl_connections)
    for c in tree.children:
        restarts.add_metric([c.name], c.restarts)
        operator.add_metric([c.name], c.operator_restarts)
        for cause in ExitCause:
            exits.add_metric([c.name, str(cause)], c.exits.get(str(cause), 0))
        generation.add_metric([c.name], c.generation)
        up.add_metric([c.name], 1 if c.up else 0)
        beat = c.beat
        if beat is None:
            continue
        _histogram(loop_lag, [c.name], beat.loop_lag)
        _histogram(relay, [], beat.relay)
        for state, n in sorted(beat.lanes.items()):
            lanes.add_metric([c.name, state], n)
        if beat.inbox_depth is not None:
            inbox.add_metric([], beat.inbox_depth)
        if c.role != "custodian":  # the roles with a write-behind store
            queue.add_metric([c.name], beat.persist_depth)
        _histogram(batches, [c.name], beat.persist_batches)
        bad.add_metric([c.name], beat.bad_frames)
        stale.add_metric([c.name], beat.stale_frames)
        internal.add_metric([c.name], beat.internal_errors)
        fenced.add_metric([c.name], beat.fenced)
        add_fds(c.name, beat.descriptors)
    return [
        restarts,
        operator,
        exits,
        generation,
        up,
        loop_lag,
        relay,
        lanes,
        inbox,
        queue,
        batches,
        bad,
        stale,
        internal,
        fenced,
        ctl_refused,
        open_fds,
        max_fds,
        conn_refused,
        ctl_connections,
        *disk,
    ]


def _histogram(family: HistogramMetricFamily, labels: list[str], hist: f.Histogram | None) -> None:
    """Add `hist` to `family` under `labels`; a histogram whose counts do not match its bounds
    (one more, the +Inf bucket) is left out rather than fail the whole scrape."""
    if hist is None or len(hist.counts) != len(hist.bounds) + 1:
        return
    pairs = zip(hist.bounds, hist.counts, strict=False)
    buckets = [(floatToGoString(bound), float(n)) for bound, n in pairs]
    buckets.append(("+Inf", float(hist.counts[-1])))
    family.add_metric(labels, buckets, sum_value=hist.total)


class LoopUnresponsive(OrchestraError):
    """The supervisor's loop did not hand over a sample in time (or has stopped); the scrape is
    answered 503. Never leaves this module."""


class TreeCollector(Collector):
    """Builds the families at scrape time from a sample `take()` returns (on the HTTP thread;
    `take` raises `LoopUnresponsive` when there is none to be had)."""

    def __init__(self, take: Callable[[], TreeSample]):
        self.take = take

    def collect(self) -> Iterable[Metric]:
        return families(self.take())


def ask_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run `fn` on `loop` from another thread and return its result, waiting at most
    `timeout_s` seconds. Raises `LoopUnresponsive` when the loop does not run it in time (it is
    then never run) or is closed; whatever `fn` raises otherwise."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        if not done.set_running_or_notify_cancel():
            return  # the scrape gave up waiting: nobody wants it any more
        try:
            done.set_result(fn())
        except BaseException as exc:
            done.set_exception(exc)

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError as exc:
        raise LoopUnresponsive("the supervisor's event loop has stopped") from exc
    try:
        return done.result(timeout_s)
    except concurrent.futures.TimeoutError:
        if done.cancel():
            raise LoopUnresponsive(
                f"the supervisor's event loop did not answer within {timeout_s:g} s"
            ) from None
        return done.result()  # it started just now: it finishes at once


CONNECTIONS_MAX = 8
"""Scrapes served at once; a connection beyond them is closed at once (Prometheus scrapes a
target one request at a time: more means a misconfiguration or an attack)."""
REQUEST_TIMEOUT_S = 10.0
"""Seconds a connection may take to send its request and take the answer; a slower one (a
slowloris) is dropped, so it cannot hold a thread for ever."""


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per scrape, at most `CONNECTIONS_MAX` at once; a failed request is one log
    line, never socketserver's traceback on stderr."""

    daemon_threads = True  # a scrape in flight never holds up the supervisor's exit

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("metrics: a request from %s failed: %r", client_address, sys.exc_info()[1])


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # one line per scrape is noise
        pass


class MetricsServer:
    """Serves `registry`'s metrics over HTTP at `host`:`port` (0: a free port, see `port`),
    any path (conventionally /metrics). Construction binds, on the caller's thread, and raises
    `ConfigError` naming the address when `host` does not resolve or the port cannot be bound
    (in use, privileged); `start()` starts serving on a daemon thread; `close()` stops it (it
    returns within the server's 0.5 s poll interval) and releases the port.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (socket.gaierror, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
            raise ConfigError(f"metrics host {host!r}: {reason}") from exc
        server = type("_FamilyServer", (_Server,), {"address_family": family})
        app = make_wsgi_app(registry)

        def answer(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            try:
                return app(environ, start_response)
            except LoopUnresponsive as exc:
                log.warning("metrics scrape refused: %s", exc)
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [f"orchestra-sup: {exc}\n".encode()]

        try:
            self.httpd = make_server(host, port, answer, server, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(
                f"metrics {_netloc(host, port)}: cannot listen: {exc.strerror or exc}"
            ) from exc
        self.host = host
        self.port: int = self.httpd.server_address[1]
        """The port bound (the one picked when 0 was asked for)."""
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics-http", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{_netloc(self.host, self.port)}/metrics"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def start_server(sup: MetricsHost, host: str, port: int) -> MetricsServer:
    """Bind and start the metrics of `sup` at `host`:`port`, on its running loop: a registry of
    its own (never prometheus-client's global one, which would add this process's Python
    collectors and outlive the tree) with one `TreeCollector`. Raises `ConfigError` as
    `MetricsServer` does, before anything is served."""
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TreeCollector(lambda: ask_loop(loop, lambda: sample(sup), SAMPLE_DEADLINE_S)))
    server = MetricsServer(registry, host, port)
    server.start()
    return server
