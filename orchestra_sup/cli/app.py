"""The `orchestra-sup` command: a thin adapter that parses, sends, and renders.

Exit statuses: 0 success; 1 a plan had a task that did not succeed, or a request failed;
2 bad input (a plan, a config, a path); 3 the tree is unreachable (ctl) or restart intensity was
exceeded (start). Bad input is one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console

from orchestra_sup import __version__, logformat
from orchestra_sup.cli import render
from orchestra_sup.cli.columns import WIDE
from orchestra_sup.cli.invocation import ctl_command
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.config import (
    default_run_dir,
    default_state_dir,
    load_settings,
    resolve_paths,
    with_metrics,
)
from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.errors import (
    ConfigError,
    DirBusy,
    ErrorCode,
    OrchestraError,
    RemoteError,
    TreeUnreachable,
    WorkspaceError,
)
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.keys import (
    DEFAULT_CLIENT,
    ClientKeys,
    default_keys_dir,
    init_keys,
    load_client_keys,
    load_server_keys,
)
from orchestra_sup.protocol.tools import call_params
from orchestra_sup.system.pathcheck import check_paths

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

app = typer.Typer(
    help="A supervisor that gives an agent platform's coordinator, tree custodian and worker "
    "shards their own OS processes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
ctl_app = typer.Typer(
    help="Talk to a running tree.\n\n"
    "Example: orchestra-sup ctl --run-dir /run/orchestra-sup status",
    no_args_is_help=True,
)
app.add_typer(ctl_app, name="ctl")
bench_app = typer.Typer(
    help="Measure the tree (see bench/README.md).\n\nExample: orchestra-sup bench all --quick",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
keys_app = typer.Typer(
    help="The tree's CURVE keys for tcp:// endpoints.\n\nExample: orchestra-sup keys init",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")

# Piped output is for reading whole, not for an 80-column guess: every column, no line wrapped.
_tty = sys.stdout is not None and sys.stdout.isatty()  # None: started with stdout closed
out = Console(width=None if _tty else WIDE, markup=False, highlight=False)
"""No markup: plan names, errors and output are the users' text, and "[/x]" in one must print as
itself, not be parsed (or refused) as rich markup."""


def screen(wide: bool = False) -> tuple[Console, int | None]:
    """Where a table is printed and the width it is fitted to (`columns.fit`): the terminal's,
    or unbounded with `--wide` or when stdout is not a terminal."""
    if not _tty:
        return out, None
    return (Console(width=WIDE, markup=False, highlight=False), None) if wide else (out, out.width)


T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for programs.")]
WideOpt = Annotated[
    bool, typer.Option("--wide", help="Every column, lines as long as they need (as piped).")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the tree to answer.")
]
WorkspaceOpt = Annotated[
    Path | None, typer.Option("--workspace", help="The git repository the custodian owns.")
]
StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="Durable state directory.")]
ShardsOpt = Annotated[int | None, typer.Option("--shards", help="Number of worker shards.")]
LanesOpt = Annotated[
    int | None, typer.Option("--lanes-per-shard", help="Lanes one shard hosts at most.")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file.")]


def fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"orchestra-sup: {message}", err=True)
    return typer.Exit(code)


def guarded(fn: Callable[[], T]) -> T:
    """Run `fn`, turning the product's errors into one line and the documented exit status."""
    try:
        return fn()
    except (ConfigError, WorkspaceError, DirBusy) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except TreeUnreachable as exc:
        raise fail(str(exc), EXIT_UNREACHABLE) from None
    except RemoteError as exc:
        bad_input = exc.code in (
            ErrorCode.BAD_REQUEST,
            ErrorCode.NOT_FOUND,
            ErrorCode.PATH_ESCAPE,
            ErrorCode.VERSION_SKEW,
            ErrorCode.TOO_LARGE,
        )
        raise fail(str(exc), EXIT_USAGE if bad_input else EXIT_FAILED) from None
    except OrchestraError as exc:
        raise fail(str(exc), EXIT_FAILED) from None


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


# --- start / run --------------------------------------------------------------------------------


@app.command()
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
) -> None:
    """Run the tree in the foreground until SIGTERM, SIGINT or `ctl stop`. SIGHUP (or
    `ctl reload`) reads --config again, these options still applied on top.

    Example: orchestra-sup start --workspace ~/src/project --shards 4 --metrics-port 9464
    """
    from orchestra_sup.supervisor.ctl import RemoteCtl
    from orchestra_sup.supervisor.reexec import resume
    from orchestra_sup.supervisor.reload import ConfigSource
    from orchestra_sup.supervisor.root import RootSupervisor
    from orchestra_sup.supervisor.runlock import refuse_owned

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
        settings = with_metrics(settings, metrics_port, metrics_on)
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


_interrupted = False
"""Set by `run`'s SIGINT/SIGTERM handler: an error that follows it (the tree it stopped going
away mid-call) is the interruption, not a failure of its own."""


def _interrupt(signum: int, frame: object) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def _check_workspace(path: Path, state_dir: Path) -> None:
    from orchestra_sup.custodian.workspace import open_workspace

    asyncio.run(open_workspace(path, state_dir))


@app.command()
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
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)

    def go() -> f.PlanReport:
        with private_tree(
            workspace=ws,
            state_dir=state,
            shards=shards,
            lanes_per_shard=lanes_per_shard,
            config=config,
        ) as client:
            if any(t.approve or t.program != "shell" for t in spec.tasks):
                # A human may be asked (an approval, a program's question) while this waits
                # silently: say where the private tree answers.
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
            if _interrupted:  # Ctrl-C reached the tree too, and it went away mid-call
                raise KeyboardInterrupt from None
            raise

    try:
        report = guarded(go_unless_interrupted)
    except KeyboardInterrupt:
        raise fail("interrupted; the tree was stopped", 130) from None
    if as_json:
        print_json({**render.plan_json(report), "state_dir": str(state)})
    else:
        render.plan_table(report, *screen())
        out.print(f"state: {state}")
    raise typer.Exit(0 if report.ok else EXIT_FAILED)


# --- ctl ------------------------------------------------------------------------------------------


RunDirOpt = Annotated[
    Path | None,
    typer.Option("--run-dir", help="The tree's run directory (also accepted before the command)."),
]


class CtlContext:
    """What every ctl command shares: where the tree is, and for a remote one (`connect`, a
    `tcp://` address) the CURVE client keys to reach it with."""

    def __init__(
        self,
        run_dir: Path | None,
        connect: str | None,
        keys: ClientKeys | None,
        keys_dir: Path | None,
    ):
        self.group_run_dir = run_dir
        self.connect = connect
        self.keys = keys
        self.keys_dir = keys_dir

    def command(self, run_dir: Path | None) -> str:
        """The ctl command that reaches this tree, as a hint to paste (`invocation`)."""
        key = self.keys.name if self.keys is not None and self.keys.name != DEFAULT_CLIENT else None
        return ctl_command(run_dir or self.group_run_dir, self.connect, self.keys_dir, key)

    def run_dir(self, override: Path | None) -> Path:
        return (override or self.group_run_dir or default_run_dir()).absolute()

    def client(self, run_dir: Path | None) -> CtlClient:
        """A client of the tree; raises `TreeUnreachable` when no tree runs at the run dir."""
        return CtlClient(self.run_dir(run_dir), connect=self.connect, keys=self.keys)

    def ask(self, body: f.Body, timeout: float, run_dir: Path | None) -> f.Body:
        def go() -> f.Body:
            with self.client(run_dir) as client:
                return client.request(body, timeout_s=timeout)

        return guarded(go)


@ctl_app.callback()
def ctl_main(
    ctx: typer.Context,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="The tree's run directory.")
    ] = None,
    connect: Annotated[
        str | None,
        typer.Option(
            "--connect",
            help="A remote tree's ctl endpoint, tcp://HOST:PORT (its start --ctl-tcp), reached "
            "with CURVE keys from --keys.",
        ),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option(
            "--keys",
            help="Directory with server.public and KEY.secret (from keys init) for --connect.",
        ),
    ] = None,
    key: Annotated[
        str, typer.Option("--key", help="The client key's name in --keys.")
    ] = DEFAULT_CLIENT,
) -> None:
    """Talk to the tree whose run directory is RUN_DIR (default: as `start` picks it), or with
    --connect to a remote tree over CURVE."""

    def client_keys() -> ClientKeys | None:
        if connect is None:
            if keys is not None:
                raise ConfigError("--keys is for --connect; give both or neither")
            return None
        if not connect.startswith("tcp://"):
            raise ConfigError(f"--connect {connect}: give a tcp://HOST:PORT address")
        if keys is None:
            raise ConfigError(f"--connect {connect}: a tcp:// endpoint needs --keys DIR")
        return load_client_keys(keys, key)

    ctx.obj = CtlContext(run_dir, connect, guarded(client_keys), keys)


@ctl_app.command()
def status(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Show the supervisor and every child. Answered by the supervisor itself. A narrow
    terminal leaves the least needed columns out (and says which); --wide shows them all.

    Example: orchestra-sup ctl status --json
    """
    reply = ctx.obj.ask(f.CtlStatus(), timeout, run_dir)
    assert isinstance(reply, f.StatusReply)
    if as_json:
        print_json(render.status_json(reply))
    else:
        render.status_table(reply, *screen(wide))


@ctl_app.command()
def tree(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Print the supervision tree: supervisors with their strategy and intensity, and children.

    Example: orchestra-sup ctl tree
    """
    reply = ctx.obj.ask(f.CtlStatus(), timeout, run_dir)
    assert isinstance(reply, f.StatusReply)
    if as_json:
        print_json(render.tree_json(reply))
    else:
        render.tree_text(reply, out)


@ctl_app.command()
def restart(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="coordinator, custodian or shard-K.")],
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Restart one child gracefully: new pid, generation + 1; the others keep theirs.

    Example: orchestra-sup ctl restart shard-1
    """
    ctx.obj.ask(f.CtlRestart(name=name), timeout, run_dir)
    _done(as_json, {"restarted": name}, f"restarted {name}")


@ctl_app.command()
def stop(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Stop the tree as SIGTERM does (children in reverse start order) and wait, up to
    --timeout, until it has exited (its run directory is free for the next start).

    Example: orchestra-sup ctl stop
    """
    from orchestra_sup.supervisor.runlock import is_owned

    deadline = time.monotonic() + timeout  # one --timeout for the ask and the wait together
    ctx.obj.ask(f.CtlStop(), timeout, run_dir)
    if ctx.obj.connect is not None:  # a remote tree's run directory is not ours to watch
        _done(as_json, {"stopped": False}, "stopping")
        return
    where = ctx.obj.run_dir(run_dir)
    while is_owned(where):
        if time.monotonic() > deadline:
            _done(as_json, {"stopped": False}, f"stopping; still running after {timeout:g} s")
            return
        time.sleep(0.05)
    _done(as_json, {"stopped": True}, "stopped")


@ctl_app.command()
def submit(
    ctx: typer.Context,
    plan: Annotated[Path, typer.Argument(help="The plan (TOML).")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the plan is done.")] = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Submit PLAN to the running tree; print its id, or with --wait its outcome.

    Example: orchestra-sup ctl submit examples/selfcheck.toml --wait
    """
    spec = guarded(lambda: load_plan(plan))
    accepted = ctx.obj.ask(f.CtlSubmit(plan=spec), timeout, run_dir)
    assert isinstance(accepted, f.PlanAccepted)
    if not wait:
        _done(as_json, {"id": accepted.id}, accepted.id)
        return
    _show_plan(ctx, accepted.id, True, as_json, timeout, run_dir)


@ctl_app.command("plans")
def plans_cmd(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """List every plan the coordinator holds, newest first, with its tasks counted by status.

    Example: orchestra-sup ctl plans --json
    """
    reply = ctx.obj.ask(f.CtlPlans(), timeout, run_dir)
    assert isinstance(reply, f.PlanList)
    if as_json:
        print_json({"plans": msgspec.to_builtins(reply.plans)})
    else:
        render.plans_table(reply, *screen())


@ctl_app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    plan_id: Annotated[str, typer.Argument(metavar="ID", help="The plan id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the plan is done.")] = False,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Show one plan and its tasks.

    Example: orchestra-sup ctl plan 3f2a9c1b7d44 --wait --json
    """
    _show_plan(ctx, plan_id, wait, as_json, timeout, run_dir)


def _show_plan(
    ctx: typer.Context,
    plan_id: str,
    wait: bool,
    as_json: bool,
    timeout: float,
    run_dir: Path | None,
) -> None:
    from orchestra_sup.client.oneshot import wait_plan

    if wait:

        def go() -> f.PlanReport:
            with ctx.obj.client(run_dir) as client:
                return wait_plan(client, plan_id, timeout_s=timeout)

        report = guarded(go)
    else:
        reply = ctx.obj.ask(f.CtlPlan(id=plan_id), timeout, run_dir)
        assert isinstance(reply, f.PlanReport)
        report = reply
    if as_json:
        print_json(render.plan_json(report))
    else:
        render.plan_table(report, *screen(), ctx.obj.command(run_dir))
    if wait:
        raise typer.Exit(0 if report.ok else EXIT_FAILED)


@ctl_app.command()
def call(
    ctx: typer.Context,
    tool: Annotated[str, typer.Argument(help="read_file, list_dir, stat, list_lanes, ...")],
    params: Annotated[
        list[str] | None, typer.Argument(metavar="[KEY=VALUE]...", help="Tool parameters.")
    ] = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 60.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Call one of the coordinator's tools through the real relay.

    Read tools (answered by the custodian) take `path` (and `pattern` for search, `rev` for diff
    and log); lane tools take `lane`. A path whose bytes are not UTF-8 is sent as `path_b64`, as
    are names in the answers. Example: orchestra-sup ctl call read_file path=README.md
    """
    try:
        pairs = call_params(params or [])
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    reply = ctx.obj.ask(f.CtlCall(tool=tool, params=pairs), timeout, run_dir)
    assert isinstance(reply, f.ToolResult)
    value = reply.value
    if not as_json and tool == "read_file" and isinstance(value, dict) and "text" in value:
        sys.stdout.write(value["text"])
    else:
        print_json(value)


@ctl_app.command()
def lanes(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """List live lanes on every shard, and every task that waits for a human (state
    awaiting_approval: how long it has waited and its question; --json has the whole question
    and `since`, Unix seconds). --wide adds what a narrow terminal leaves out (the sandbox).

    Example: orchestra-sup ctl lanes --json
    """
    reply = ctx.obj.ask(f.CtlLanes(), timeout, run_dir)
    assert isinstance(reply, f.LaneList)
    if as_json:
        print_json(render.lanes_json(reply))
    else:
        console, width = screen(wide)
        render.lanes_table(reply, console, width=width, command=ctx.obj.command(run_dir))


@ctl_app.command()
def top(
    ctx: typer.Context,
    interval: Annotated[
        float,
        typer.Option("--interval", min=0.1, max=3600, help="Seconds between refreshes."),
    ] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (also when piped).")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="With --once (or piped): every column, lines unwrapped.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='One {"status", "lanes", "error"} object per refresh, one per line (ndjson); '
            "with --once just one.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.1, help="Seconds one refresh waits for the tree (status and lanes)."
        ),
    ] = 2.0,
    run_dir: RunDirOpt = None,
) -> None:
    """A live view of the tree: every child's pid, generation, state, uptime, restarts, loop lag
    and relay latency (p50/p99 ms), lanes by state, inbox and persistence queue depths; the
    supervisor's loop lag, isolation, rollover and metrics URL; the live lanes.

    q or Ctrl-C quits (exit 0), the terminal restored. Piped, or with --once, one frame is
    printed. With --json, one JSON object per refresh on a line of its own until Ctrl-C (or q
    at a terminal); with --json --once, one. No tree at the first refresh: exit 3 and one line.
    Once shown, a tree that stops answering is shown as unreachable and asked again every
    interval (in --json: a line with "error" set and "status" and "lanes" null).
    Example: orchestra-sup ctl top --interval 0.5
    """
    from orchestra_sup.cli.top import Keys, Watcher, frame_json, run_json, run_live, view

    def ask(body: f.Body, seconds: float) -> f.Body:
        with ctx.obj.client(run_dir) as client:
            return client.request(body, timeout_s=seconds)

    watcher = Watcher(ask, timeout)
    first = guarded(watcher.poll_or_raise)  # no tree at all: one line, exit 3, like status
    if once or (not as_json and not _tty):
        if as_json:
            sys.stdout.write(json.dumps(frame_json(first)) + "\n")
        else:
            console, width = screen(wide)
            console.print(view(first, time.time(), "", width, ctx.obj.command(run_dir)))
        return
    # SIGTERM (a closing terminal, `kill`) unwinds like Ctrl-C: the terminal is given back
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with Keys(sys.stdin.fileno() if sys.stdin is not None else -1) as keys:
            if as_json:
                run_json(watcher, first, sys.stdout, keys, interval)
            else:
                run_live(watcher, first, out, keys, interval, ctx.obj.command(run_dir))
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `ctl top --json | head -3`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@ctl_app.command()
def cancel(
    ctx: typer.Context,
    lane: Annotated[str, typer.Argument(help="The lane id (see `ctl lanes`).")],
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Stop a lane now, its whole process group with it; its task becomes cancelled.

    Example: orchestra-sup ctl cancel 3f2a9c1b7d44-build-1
    """
    ctx.obj.ask(f.CtlCancel(lane=lane), timeout, run_dir)
    _done(as_json, {"cancelled": lane}, f"cancelled {lane}")


LaneArg = Annotated[str, typer.Argument(help="The lane id (see `ctl lanes`).")]
GRANT_KEYS = {"wall_s": float, "cpu_s": float, "output_bytes": int}
"""What `--grant` may add to, in `frames.Budget`'s units: seconds, seconds, bytes."""


def parse_grant(text: str) -> f.Budget:
    """`wall_s=60,cpu_s=10,output_bytes=1000000` -> `Budget`: each key of `GRANT_KEYS` at most
    once, each value a positive finite number (an integer for `output_bytes`).
    Raises `ConfigError` naming the item and what is wrong with it."""
    values: dict[str, float | int] = {}
    for item in text.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ConfigError(f"--grant {item.strip()!r}: expected KEY=VALUE")
        kind = GRANT_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"--grant: unknown key {key!r} (known: {', '.join(GRANT_KEYS)})")
        if key in values:
            raise ConfigError(f"--grant: {key} given twice")
        unit = "an integer" if kind is int else "a number"
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"--grant {key}={raw!r}: expected {unit}") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--grant {key}={raw}: must be positive and finite")
        values[key] = value
    return f.Budget(**values)


def _required_text(option: str, text: str) -> str:
    if not text.strip():
        raise fail(f"{option} must not be empty", EXIT_USAGE)
    return text


def _respond(
    ctx: typer.Context, ask: f.CtlRespond, as_json: bool, timeout: float, run_dir: Path | None
) -> None:
    reply = ctx.obj.ask(ask, timeout, run_dir)
    assert isinstance(reply, f.HitlRecorded)
    if as_json:
        print_json(render.recorded_json(reply))
    else:
        out.print(render.recorded_line(reply))


@ctl_app.command()
def approve(
    ctx: typer.Context,
    lane: LaneArg,
    grant: Annotated[
        str | None,
        typer.Option(
            "--grant",
            metavar="KEY=VALUE,...",
            help="Add to the task's budget: wall_s and cpu_s (seconds), output_bytes (bytes).",
        ),
    ] = None,
    retries: Annotated[
        int,
        typer.Option("--retries", min=0, max=100, help="Add to the task's retry cap (0 to 100)."),
    ] = 0,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Let a task that waits for a human go on, optionally with more budget or retries.

    Prints what was recorded. Exits 2 on a bad --grant (nothing is sent) or when no task waits
    on LANE. Your identity is taken from your connection to the tree.
    Example: orchestra-sup ctl approve 3f2a9c1b7d44-deploy-1 --grant wall_s=60,cpu_s=10
    """
    budget = None if grant is None else guarded(lambda: parse_grant(grant))
    ask = f.CtlRespond(lane=lane, verdict="approve", grant=budget, retries=retries)
    _respond(ctx, ask, as_json, timeout, run_dir)


@ctl_app.command()
def reject(
    ctx: typer.Context,
    lane: LaneArg,
    reason: Annotated[
        str, typer.Option("--reason", help="Why: the task's next attempt gets it as feedback.")
    ],
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Reject what a task waits for a human about; the reason becomes revision feedback.

    Example: orchestra-sup ctl reject 3f2a9c1b7d44-deploy-1 --reason "not on a Friday"
    """
    ask = f.CtlRespond(lane=lane, verdict="reject", text=_required_text("--reason", reason))
    _respond(ctx, ask, as_json, timeout, run_dir)


@ctl_app.command()
def redirect(
    ctx: typer.Context,
    lane: LaneArg,
    to: Annotated[str, typer.Option("--to", help="What the task should do instead.")],
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Tell a task that waits for a human to do something else instead.

    Example: orchestra-sup ctl redirect 3f2a9c1b7d44-deploy-1 --to "deploy to staging only"
    """
    ask = f.CtlRespond(lane=lane, verdict="redirect", text=_required_text("--to", to))
    _respond(ctx, ask, as_json, timeout, run_dir)


@ctl_app.command("accept-partial")
def accept_partial(
    ctx: typer.Context,
    lane: LaneArg,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Take what a task that waits for a human has done so far and end its step.

    Example: orchestra-sup ctl accept-partial 3f2a9c1b7d44-deploy-1
    """
    _respond(ctx, f.CtlRespond(lane=lane, verdict="accept_partial"), as_json, timeout, run_dir)


@ctl_app.command()
def logs(
    ctx: typer.Context,
    lane: Annotated[str, typer.Argument(help="The lane id (see `ctl lanes`, `ctl plan --json`).")],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Print rows as they come until the lane (or its task) ends."
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='One object per row: {"seq", "ts", "stream", "data", "lane"}.'),
    ] = False,
    timeout: TimeoutOpt = 10.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Print a lane's transcript: its output (stdout to stdout, stderr to stderr) and its events
    (`# event: ...` lines on stderr), or with --json one object per row on stdout.

    Works for running and finished lanes (kept for \\[lanes] transcript_retention_s). --follow
    goes on to the task's next lane when its shard was restarted or lost, exits 0 when the
    lane ends otherwise, 3 when the tree goes away first; Ctrl-C exits 130; an unknown lane
    exits 2.
    Example: orchestra-sup ctl logs 3f2a9c1b7d44-build-1 --follow
    """
    from orchestra_sup.cli.follow import LogSink, show_logs

    sink = LogSink(as_json, sys.stdout, sys.stderr)

    def go() -> None:
        with ctx.obj.client(run_dir) as client:
            show_logs(client, lane, sink, follow=follow, timeout_s=timeout)

    try:
        guarded(go)
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
    except BrokenPipeError:  # `ctl logs LANE | head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None


ROLLOVER_POLL_S = 5.0
"""Seconds one `ctl rollover` progress poll is held by the supervisor (a long poll)."""
REEXEC_POLL_S = 0.05
"""Seconds between progress polls while the supervisor re-executes itself."""
POLL_MARGIN_S = 0.5
"""Seconds a progress poll may take beyond its hold before it is asked again."""


@ctl_app.command()
def rollover(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(
            help="coordinator, custodian, shard-K, shards (one at a time), supervisor or all."
        ),
    ],
    release: Annotated[
        Path | None,
        typer.Option(
            "--release",
            help="The interpreter of the release to move to (a virtualenv's bin/python); "
            "default: the supervisor's own.",
        ),
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            "--drain-timeout",
            min=0.1,
            max=3600,
            help="Seconds (0.1 to 3600) lanes, or the coordinator or the custodian, have to "
            "reach a quiet point; default \\[supervisor] drain_timeout_s.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole report as one JSON object at the end.")
    ] = False,
    timeout: TimeoutOpt = 60.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Move running children onto another release, one process at a time, and print each step
    as it happens. Shards start their next generation beside the old one and hand their lanes
    over at quiet points; the coordinator and the custodian are replaced at a quiet point; the
    supervisor re-executes itself in place (same pid) and re-adopts its children.

    Exits 0 when everything moved; 1 when a step rolled back or failed (the report says why);
    2 when the release or the target is refused before anything moved (for example a release
    whose protocol range does not overlap the tree's).
    Example: orchestra-sup ctl rollover all --release /opt/orchestra-sup-0.2/bin/python
    """
    python = "" if release is None else str(release.absolute())
    ask = f.CtlRollover(name=name, release=python, drain_timeout_s=drain_timeout)

    def go() -> f.RolloverReport:
        with ctx.obj.client(run_dir) as client:
            report = client.request(ask, timeout_s=timeout)
            assert isinstance(report, f.RolloverReport)
            events = list(report.events)
            for event in report.events:
                _rollover_event(event, as_json)
            unreachable_since: float | None = None
            while not report.done:
                # While the supervisor re-executes itself a poll may be lost in the exec: ask
                # without a hold, briefly, and again, until its new image answers.
                hold = 0.0 if report.reexecuting else ROLLOVER_POLL_S
                if report.reexecuting:
                    time.sleep(REEXEC_POLL_S)
                poll = f.CtlRolloverStatus(
                    id=report.id, after_seq=events[-1].seq if events else -1, wait_s=hold
                )
                try:
                    report = client.request(poll, timeout_s=hold + POLL_MARGIN_S)
                except TreeUnreachable as exc:
                    unreachable_since = unreachable_since or time.monotonic()
                    if time.monotonic() - unreachable_since <= timeout:
                        continue
                    if report.reexecuting:
                        raise TreeUnreachable(
                            f"the supervisor did not come back from re-executing itself on "
                            f"{report.release.python} within {timeout:g} s; the tree may be "
                            "down (see the supervisor's log)"
                        ) from None
                    raise exc
                unreachable_since = None
                assert isinstance(report, f.RolloverReport)
                for event in report.events:
                    _rollover_event(event, as_json)
                events.extend(report.events)
            return msgspec.structs.replace(report, events=events)

    final = guarded(go)
    if as_json:
        print_json(render.rollover_json(final))
    elif final.ok:
        out.print(f"rollover {final.id} of {name} done: orchestra-sup {final.release.version}")
    if not final.ok:
        raise fail(f"rollover {final.id} of {name}: {final.error}", EXIT_FAILED)


@ctl_app.command()
def reload(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="Seconds to wait for the reload to be applied (retiring shards drain for up "
            "to the config's drain_timeout_s); the reload goes on if this runs out.",
        ),
    ] = 120.0,
    run_dir: RunDirOpt = None,
) -> None:
    """Re-read the config file the tree was started with (as SIGHUP and `systemctl reload`
    do) and apply what changed: children whose settings changed are restarted one at a time,
    shards are added or drained and retired, the rest keep their pids. The command-line
    options `start` was given (--shards, --lanes-per-shard) still win over the file.

    Exits 0 once applied (or when nothing changed); 2 when the reload is refused and nothing
    changed: a config that cannot be read or has a bad value, a setting that cannot change
    while the tree runs, or another reload, a rollover or a stop in progress; 1 when a child
    did not start under the new settings.
    Example: orchestra-sup ctl reload --json
    """

    def go() -> f.Body:
        try:
            with ctx.obj.client(run_dir) as client:
                return client.request(f.CtlReload(), timeout_s=timeout)
        except RemoteError as exc:
            if exc.code is ErrorCode.BUSY:
                raise ConfigError(f"config reload refused: busy: {exc.message}") from None
            raise

    report = guarded(go)
    assert isinstance(report, f.ReloadReport)
    if as_json:
        value = msgspec.to_builtins(report)
        del value["t"]
        print_json(value)
    if report.refused:
        raise fail(f"config reload refused: {report.error}", EXIT_USAGE)
    if not as_json:
        for line in render.reload_lines(report):
            out.print(line)
    if report.error is not None:
        raise fail(f"config reload: {report.error}", EXIT_FAILED)


def _rollover_event(event: f.RolloverEvent, as_json: bool) -> None:
    if not as_json:
        out.print(render.rollover_line(event))


def _done(as_json: bool, value: dict[str, Any], text: str) -> None:
    if as_json:
        print_json(value)
    else:
        typer.echo(text)


@bench_app.command()
def relay(
    iterations: Annotated[
        int, typer.Option("--iterations", min=10, help="Timed round trips per variant.")
    ] = 5000,
    as_json: JsonOpt = False,
) -> None:
    """The relay's round trip next to raw pyzmq between two processes, in one run.

    Example: orchestra-sup bench relay --iterations 2000 --json
    """
    from orchestra_sup.bench.relay import run_relay_bench

    result = guarded(lambda: run_relay_bench(iterations, max(10, iterations // 10)))
    if as_json:
        print_json(result)
        return
    base = result["baseline"]
    out.print(
        f"raw pyzmq floor: p50 {base['p50_us']} us, p99 {base['p99_us']} us "
        f"({base['n']} round trips)"
    )
    for tool, stats in result["relays"].items():
        out.print(
            f"relay {tool}: p50 {stats['p50_us']} us ({stats['ratio_p50']}x), "
            f"p99 {stats['p99_us']} us ({stats['ratio_p99']}x)"
        )


@bench_app.command()
def isolation(
    quick: Annotated[bool, typer.Option("--quick", help="Fewer probes, under a minute.")] = False,
    probes: Annotated[
        int | None, typer.Option("--probes", min=2, help="Turns timed per phase (overrides).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Coordinator turn latency idle and under lane load, separated and colocated, in one run.

    Example: orchestra-sup bench isolation --quick --json
    """
    from orchestra_sup.bench.isolation import format_table, run_isolation_bench

    result = guarded(lambda: run_isolation_bench(quick, probes))
    if as_json:
        print_json(result)
    else:
        typer.echo(format_table(result))


@bench_app.command()
def scale(
    counts: Annotated[
        str, typer.Option("--counts", help="Comma-separated numbers of parked lanes, rising.")
    ] = "10,100,1000",
    iterations: Annotated[
        int, typer.Option("--iterations", min=10, help="Timed message_lane calls per count.")
    ] = 2000,
    as_json: JsonOpt = False,
) -> None:
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
    if as_json:
        print_json(result)
    else:
        typer.echo(format_table(result))


@bench_app.command("plan")
def plan_bench(
    tasks: Annotated[
        str, typer.Option("--tasks", help="Comma-separated plan sizes (tasks), rising.")
    ] = "100,1000,10000",
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs per shape and size.")] = 3,
    as_json: JsonOpt = False,
) -> None:
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
    result = guarded(lambda: run_plan_bench(sizes, runs))
    if as_json:
        print_json(result)
    else:
        typer.echo(format_table(result))


@bench_app.command(name="all")
def all_benches(
    quick: Annotated[
        bool, typer.Option("--quick", help="Short settings: about 70 s on 2 cores.")
    ] = False,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where the JSON files, summary.md and plots go.")
    ] = Path("bench-results"),
    only: Annotated[
        str | None, typer.Option("--only", help="Comma-separated benchmark names to run.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
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
    if as_json:
        print_json(report)
    else:
        typer.echo(Path(report["summary"]).read_text())
    failed = [n for n, b in report["benches"].items() if b["error"] is not None]
    raise typer.Exit(EXIT_FAILED if failed else 0)


@bench_app.command()
def chaos(
    duration: Annotated[
        float, typer.Option("--duration", min=1.0, help="Seconds of random SIGKILLs.")
    ] = 30.0,
    tasks: Annotated[int, typer.Option("--tasks", min=50, help="Tasks per plan.")] = 60,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run plans while a random child is SIGKILLed every 1-3 s; count what was lost.

    Exits 1 when nothing succeeded, a success left no ledger line, anything was lost or
    duplicated, an orphan was left, or the supervisor died.
    Example: orchestra-sup bench chaos --duration 20 --json
    """
    from orchestra_sup.bench.chaos import run_chaos

    report = guarded(lambda: run_chaos(duration, tasks=tasks, seed=seed))
    if as_json:
        print_json(msgspec.to_builtins(report))
    else:
        for key, value in msgspec.to_builtins(report).items():
            typer.echo(f"{key:>16}: {value}")
    raise typer.Exit(0 if report.clean else EXIT_FAILED)


@bench_app.command()
def persist(
    events: Annotated[
        int, typer.Option("--events", min=100, help="Events in the write-behind passes.")
    ] = 20_000,
    as_json: JsonOpt = False,
) -> None:
    """One synced transaction per event next to write-behind, on one event stream, in one run.

    Example: orchestra-sup bench persist --events 50000 --json
    """
    from orchestra_sup.bench.persist import format_table, run_persist

    report = guarded(lambda: run_persist(events))
    if as_json:
        print_json(report)
    else:
        typer.echo(format_table(report))


@bench_app.command("restart")
def restart_bench(
    kills: Annotated[
        int,
        typer.Option("--kills", min=1, help="SIGKILLs of shard-0 per spawn mode (20+ for p90)."),
    ] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Restart after SIGKILL of a shard, forked from the template and exec'd, next to the cost
    of a fresh interpreter, in one run.

    Example: orchestra-sup bench restart --kills 30 --json
    """
    from orchestra_sup.bench.restart import run_restart_bench

    result = guarded(lambda: run_restart_bench(kills))
    if as_json:
        print_json(result)
        return
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


# --- keys ---------------------------------------------------------------------------------------


@keys_app.command("init")
def keys_init(
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Where to put them (default: STATE/keys).")
    ] = None,
    state_dir: StateOpt = None,
    clients: Annotated[
        list[str] | None,
        typer.Option("--client", help="A client keypair to make and allow (repeatable)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the tree's CURVE keys: the server keypair and client keypairs it allows
    (default: one, "operator"). Files 0600 in a 0700 directory; never overwrites a key. On a
    directory that has the server key already, only the clients are added (restart the tree to
    admit them). A remote operator needs server.public and their NAME.secret.

    Example: orchestra-sup keys init --client alice --client ci
    """
    guarded(lambda: check_paths({"--dir": directory, "--state-dir": state_dir}))
    where = (directory or default_keys_dir(state_dir or default_state_dir())).absolute()
    written = guarded(lambda: init_keys(where, clients or [DEFAULT_CLIENT]))
    if as_json:
        print_json({"dir": str(where), "files": [str(p) for p in written]})
        return
    for path in written:
        out.print(str(path))


@app.command("systemd-unit")
def systemd_unit(
    user: Annotated[
        bool, typer.Option("--user", help="A user unit (systemctl --user), not a system one.")
    ] = False,
    template: Annotated[
        bool,
        typer.Option(
            "--template",
            help="orchestra-sup@.service: one tree per instance, config %E/orchestra-sup/%i.toml.",
        ),
    ] = False,
    workspace: Annotated[
        str | None,
        typer.Option(
            "--workspace",
            help="The git repository the custodian owns (systemd specifiers allowed: a "
            "literal % is written %%).",
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="The TOML config the unit starts with; it also sizes TimeoutStopSec= and "
            "WatchdogSec= (systemd specifiers allowed: then the defaults size them; a literal % "
            "is written %%).",
        ),
    ] = None,
) -> None:
    """Print a systemd unit that runs `start` with this installation (Type=notify, watchdog,
    reload on SIGHUP, hardening); every directive carries a comment saying why.

    Example: orchestra-sup systemd-unit --workspace /srv/project > orchestra-sup.service
    """
    from orchestra_sup.cli.unit import UnitSpec, installed_command, render

    def spec() -> UnitSpec:
        check_paths({"--config": config, "--workspace": workspace})
        settings = load_settings(None)
        if config is not None and "%" not in config:
            settings = load_settings(Path(config))
        if workspace is not None and "%" not in workspace and not Path(workspace).is_dir():
            raise ConfigError(f"workspace {workspace} is not a directory")
        return UnitSpec(
            command=installed_command(),
            user=user,
            template=template,
            workspace=_unit_path(workspace),
            config=_unit_path(config),
            settings=settings,
        )

    sys.stdout.write(guarded(lambda: render(spec())))


def _unit_path(path: str | None) -> str | None:
    """`path` made absolute for a unit file (systemd has no working directory to resolve a
    relative one against); one that starts with a specifier (`%h/...`) is left as it is."""
    if path is None or path.startswith("%"):
        return path
    return str(Path(path).absolute())


@app.command()
def doctor(as_json: JsonOpt = False) -> None:
    """Say which isolation layers lanes get on this machine, why not, and what mode auto picks.

    Example: orchestra-sup doctor --json
    """
    from orchestra_sup.shards.doctor import diagnose

    report = diagnose()
    if as_json:
        print_json(msgspec.to_builtins(report))
        return
    for layer in report.layers:
        mark = "yes" if layer.available else "no "
        used = " (used)" if layer.used else ""
        typer.echo(f"{mark} {layer.name:<20} {layer.detail}{used}")
    typer.echo(f'[isolation] mode = "auto" runs lanes with: {report.auto_mode}')


@app.command()
def version(as_json: JsonOpt = False) -> None:
    """Print the version (with --json: {"version"}).

    Example: orchestra-sup version --json
    """
    if as_json:
        print_json({"version": __version__})
    else:
        typer.echo(__version__)


def main() -> None:
    """Run the CLI. Usage errors are one line and exit 2, like every other bad input."""
    try:
        code = app(standalone_mode=False)
    except _ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        typer.echo(f"orchestra-sup: {exc.format_message()}{hint}", err=True)
        sys.exit(EXIT_USAGE)
    except typer.Abort:
        typer.echo("orchestra-sup: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


# typer vendors click in recent releases and re-exports only some of it; BadParameter's bases
# give its ClickException (usage errors and bad values) whichever click is underneath.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
