"""`orchestra-sup start` (a tree in the foreground) and `orchestra-sup run` (a private tree that
runs one plan and stops)."""

from __future__ import annotations

import asyncio
import signal
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestra_sup import logformat
from orchestra_sup.cli import interrupt, render
from orchestra_sup.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, fail, guarded
from orchestra_sup.cli.options import (
    ConfigOpt,
    JsonOpt,
    LanesOpt,
    ShardsOpt,
    StateOpt,
    TimeoutOpt,
    WorkspaceOpt,
)
from orchestra_sup.cli.output import out, print_json, screen
from orchestra_sup.config import load_settings, with_http, with_metrics
from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.errors import ConfigError, OrchestraError
from orchestra_sup.paths import resolve_paths
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes
from orchestra_sup.protocol.keys import default_keys_dir, load_server_keys
from orchestra_sup.system.pathcheck import check_paths


def start(
    config: ConfigOpt = None,
    workspace: WorkspaceOpt = None,
    state_dir: StateOpt = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Sockets and lock.")] = None,
    shards: ShardsOpt = None,
    lanes_per_shard: LanesOpt = None,
    colocated: Annotated[
        bool,
        typer.Option(
            "--colocated",
            help="Run every role in this one process and event loop (the 'before' picture of "
            "bench isolation; not for production).",
        ),
    ] = False,
    adopt: Annotated[
        int | None,
        typer.Option(
            "--adopt",
            hidden=True,
            help="Internal: the hand-off descriptor of a supervisor re-executing itself "
            "(supervisor/reexec.py); it carries every other option.",
        ),
    ] = None,
    preflight: Annotated[
        bool,
        typer.Option(
            "--preflight",
            hidden=True,
            help="Internal: exit 0 once what `start` needs is imported (a rollover checks a "
            "release this way before the supervisor re-executes itself onto it).",
        ),
    ] = False,
    ctl_tcp: Annotated[
        str | None,
        typer.Option(
            "--ctl-tcp",
            help="Also serve ctl on this tcp://HOST:PORT, with CURVE: only client keys allowed "
            "in --keys get through (for a remote operator: ctl --connect).",
        ),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option("--keys", help="CURVE keys directory for --ctl-tcp (default: STATE/keys)."),
    ] = None,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            help="Log lines on stderr, every process's: text (logfmt, no timestamps, <N> "
            "priority prefixes under journald) or json (one object per line).",
        ),
    ] = "text",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve Prometheus metrics over HTTP on this port (0: any free one; `ctl "
            "status` shows the URL). Default: \\[supervisor] metrics_port, else not served.",
        ),
    ] = None,
    metrics_on: Annotated[
        str | None,
        typer.Option(
            "--metrics-host",
            help="The address to serve metrics on "
            "(default: \\[supervisor] metrics_host, 127.0.0.1).",
        ),
    ] = None,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            help="Serve the HTTP API on HOST:PORT: a loopback address, or any with \\[http] "
            "cert and key (port 0: any free one; `ctl status` shows the URL). Default: "
            "\\[http] listen, else not served.",
        ),
    ] = None,
) -> None:
    """Run the tree in the foreground until SIGTERM, SIGINT or `ctl stop`. SIGHUP (or
    `ctl reload`) reads --config again, these options still applied on top.

    Example: orchestra-sup start --workspace ~/src/project --shards 4 --metrics-port 9464
    """
    from orchestra_sup.supervisor.root import RootSupervisor, resume
    from orchestra_sup.supervisor.runlock import refuse_owned
    from orchestra_sup.supervisor.sockets import RemoteCtl
    from orchestra_sup.supervisor.source import ConfigSource

    if preflight:
        raise typer.Exit(0)
    # Until the supervisor's handler is in place (`RootSupervisor.run`), a SIGHUP (a reload
    # asked too early) is held pending instead of killing the process with its default action.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    if adopt is not None:  # the format and generation are in the hand-off: `resume` reads them
        logformat.configure(logformat.SUPERVISOR, None)
        raise typer.Exit(resume(adopt))
    fmt = guarded(lambda: logformat.parse_format(log_format))
    logformat.configure(logformat.SUPERVISOR, 1, fmt)

    def prepare() -> tuple[Any, Any, RemoteCtl | None]:
        check_paths(
            {
                "--config": config,
                "--workspace": workspace,
                "--state-dir": state_dir,
                "--run-dir": run_dir,
                "--keys": keys,
            }
        )
        settings = load_settings(config, shards=shards, lanes_per_shard=lanes_per_shard)
        settings = with_http(with_metrics(settings, metrics_port, metrics_on), http)
        paths = resolve_paths(state_dir, run_dir, workspace)
        remote = None
        if ctl_tcp is not None:
            if not ctl_tcp.startswith("tcp://"):
                raise ConfigError(f"--ctl-tcp {ctl_tcp}: give a tcp://HOST:PORT address")
            where = (keys or default_keys_dir(paths.state_dir)).absolute()
            load_server_keys(where)  # unreadable or missing keys: one line, before anything
            remote = RemoteCtl(endpoint=ctl_tcp, keys_dir=str(where))
        elif keys is not None:
            raise ConfigError("--keys is for --ctl-tcp; give both or neither")
        if paths.workspace is not None:
            _check_workspace(paths.workspace, paths.state_dir)
        refuse_owned(paths.state_dir, paths.run_dir)  # before anything is started or made
        return settings, paths, remote

    settings, paths, remote = guarded(prepare)
    source = ConfigSource(
        path=str(config.absolute()) if config is not None else None,
        shards=shards,
        lanes_per_shard=lanes_per_shard,
        metrics_port=metrics_port,
        metrics_host=metrics_on,
        http=http,
    )
    code = guarded(
        lambda: asyncio.run(
            RootSupervisor(
                paths,
                settings,
                colocated=colocated,
                remote_ctl=remote,
                config=source,
                log_format=fmt,
            ).run()
        )
    )
    raise typer.Exit(code)


def _check_workspace(path: Path, state_dir: Path) -> None:
    from orchestra_sup.custodian.workspace import open_workspace

    asyncio.run(open_workspace(path, state_dir))


def run(
    plan: Annotated[Path, typer.Argument(help="The plan (TOML).")],
    workspace: WorkspaceOpt = None,
    shards: ShardsOpt = None,
    lanes_per_shard: LanesOpt = None,
    state_dir: StateOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
) -> None:
    """Start a tree, run PLAN on it, print the outcome, stop the tree.

    Exits 0 when every task succeeded, 1 when any did not, 2 on bad input.
    Example: orchestra-sup run examples/selfcheck.toml --workspace .
    """
    from orchestra_sup.client.oneshot import private_tree, wait_plan
    from orchestra_sup.supervisor.runlock import refuse_owned

    def prepare() -> tuple[f.PlanSpec, Path, Path | None]:
        tmp = None if state_dir else tempfile.gettempdir()  # where the state directory goes
        check_paths(
            {
                "PLAN": plan,
                "--workspace": workspace,
                "--state-dir": state_dir,
                "--config": config,
                "temporary directory ($TMPDIR)": tmp,
            }
        )
        spec = load_plan(plan)
        load_settings(config, shards=shards, lanes_per_shard=lanes_per_shard)
        paths = resolve_paths(state_dir or Path(tempfile.gettempdir()), None, workspace)
        if paths.workspace is not None:
            _check_workspace(paths.workspace, paths.state_dir)
        if state_dir is not None:  # a live tree's: refused, its log and directories untouched
            refuse_owned(paths.state_dir)
        state = paths.state_dir if state_dir else Path(tempfile.mkdtemp(prefix="osup-run-"))
        return spec, state, paths.workspace

    spec, state, ws = guarded(prepare)
    # SIGTERM unwinds like Ctrl-C, so the private tree is stopped, not orphaned
    signal.signal(signal.SIGTERM, interrupt.unwind)
    signal.signal(signal.SIGINT, interrupt.unwind)

    def go() -> f.PlanReport:
        with private_tree(
            workspace=ws,
            state_dir=state,
            shards=shards,
            lanes_per_shard=lanes_per_shard,
            config=config,
        ) as client:
            if spec.coordinator != "dag" or any(
                t.approve or t.program != "shell" for t in spec.tasks
            ):
                # A human may be asked (an approval, a lane program's or a coordinator
                # program's question) while this waits silently: say where the tree answers.
                typer.echo(
                    f"run: the tree's run directory is {client.where}: "
                    f"`orchestra-sup ctl --run-dir {client.where} lanes` shows what waits for "
                    "a human",
                    err=True,
                )
            accepted = client.request(f.CtlSubmit(plan=spec), timeout_s=timeout)
            assert isinstance(accepted, f.PlanAccepted)
            return wait_plan(client, accepted.id, timeout_s=timeout)

    def go_unless_interrupted() -> f.PlanReport:
        try:
            return go()
        except OrchestraError:
            if interrupt.interrupted():  # Ctrl-C reached the tree too, and it went away mid-call
                raise KeyboardInterrupt from None
            raise

    try:
        report = guarded(go_unless_interrupted)
    except KeyboardInterrupt:
        raise fail("interrupted; the tree was stopped", EXIT_INTERRUPTED) from None
    if as_json:
        print_json({**shapes.plan_json(report), "state_dir": str(state)})
    else:
        render.plan_table(report, *screen())
        out.print(f"state: {state}")
    raise typer.Exit(0 if report.ok else EXIT_FAILED)
