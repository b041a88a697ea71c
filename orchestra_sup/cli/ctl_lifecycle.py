"""`ctl restart`, `ctl stop`, `ctl stop-host`, `ctl rollover` and `ctl reload`: a child, the
tree, a host, its release and its config changed while it runs."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import msgspec
import typer

from orchestra_sup.cli import render
from orchestra_sup.cli.ctlcontext import CtlCommand, ctl_options
from orchestra_sup.cli.exits import EXIT_FAILED, EXIT_USAGE, fail, guarded
from orchestra_sup.cli.output import out, print_json
from orchestra_sup.config import SupervisorSettings
from orchestra_sup.errors import ConfigError, ErrorCode, RemoteError, TreeUnreachable
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import shapes

DRAIN_DEFAULT_S = SupervisorSettings().drain_timeout_s
"""`[supervisor] drain_timeout_s`'s default: what `stop-host` waits beyond --timeout, unless
--drain-timeout says (a root configured longer answers late, and the ask says so)."""
ROLLOVER_POLL_S = 5.0
"""Seconds one `ctl rollover` progress poll is held by the supervisor (a long poll)."""
REEXEC_POLL_S = 0.05
"""Seconds between progress polls while the supervisor re-executes itself."""
POLL_MARGIN_S = 0.5
"""Seconds a progress poll may take beyond its hold before it is asked again."""


@ctl_options()
def restart(
    ctl: CtlCommand,
    name: Annotated[
        str, typer.Argument(help="coordinator, custodian, shard-K, or a host's HOST/shard-K.")
    ],
) -> None:
    """Restart one child gracefully: new pid, generation + 1; the others keep theirs. A host's
    shard (host-a/shard-0) is restarted by that host's agent, asked by the root.

    Example: orchestra-sup ctl restart shard-1
    """
    ctl.ask(f.CtlRestart(name=name))
    ctl.done({"restarted": name}, f"restarted {name}")


@ctl_options()
def stop_host(
    ctl: CtlCommand,
    name: Annotated[str, typer.Argument(help="The host, as ctl status lists it (host-a).")],
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            "--drain-timeout",
            help="Seconds its lanes have to end (default: \\[supervisor] drain_timeout_s).",
        ),
    ] = None,
) -> None:
    """Drain a host, then let it leave: its shards take no new lane, its lanes end (or, after
    --drain-timeout, stop and run again elsewhere), then its agent stops and revokes its lease.
    --timeout is added to the drain.

    Example: orchestra-sup ctl stop-host host-a
    """
    drain = drain_timeout if drain_timeout is not None else DRAIN_DEFAULT_S
    waiting = dataclasses.replace(ctl, timeout=ctl.timeout + drain)
    waiting.ask(f.CtlStopHost(name=name, drain_timeout_s=drain_timeout))
    ctl.done({"stopped_host": name}, f"{name} drained and stopping")


@ctl_options()
def stop(ctl: CtlCommand) -> None:
    """Stop the tree as SIGTERM does (children in reverse start order) and wait, up to
    --timeout, until it has exited (its run directory is free for the next start).

    Example: orchestra-sup ctl stop
    """
    from orchestra_sup.supervisor.runlock import is_owned

    deadline = time.monotonic() + ctl.timeout  # one --timeout for the ask and the wait together
    ctl.ask(f.CtlStop())
    if ctl.context.connect is not None:  # a remote tree's run directory is not ours to watch
        ctl.done({"stopped": False}, "stopping")
        return
    where = ctl.where()
    while is_owned(where):
        if time.monotonic() > deadline:
            ctl.done({"stopped": False}, f"stopping; still running after {ctl.timeout:g} s")
            return
        time.sleep(0.05)
    ctl.done({"stopped": True}, "stopped")


@ctl_options(
    60.0,
    json_option=Annotated[
        bool, typer.Option("--json", help="Print the whole report as one JSON object at the end.")
    ],
)
def rollover(
    ctl: CtlCommand,
    name: Annotated[
        str,
        typer.Argument(
            help="coordinator, custodian, shard-K, shards (one at a time), supervisor or all; "
            "a host's: host-a (each of its shards) or host-a/shard-K."
        ),
    ],
    release: Annotated[
        Path | None,
        typer.Option(
            "--release",
            help="The interpreter of the release to move to (a virtualenv's bin/python; for a "
            "host's target, a path on that host); default: the supervisor's own.",
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
        with ctl.client() as client:
            report = client.request(ask, timeout_s=ctl.timeout)
            assert isinstance(report, f.RolloverReport)
            events = list(report.events)
            for event in report.events:
                _rollover_event(event, ctl.as_json)
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
                    if time.monotonic() - unreachable_since <= ctl.timeout:
                        continue
                    if report.reexecuting:
                        raise TreeUnreachable(
                            f"the supervisor did not come back from re-executing itself on "
                            f"{report.release.python} within {ctl.timeout:g} s; the tree may be "
                            "down (see the supervisor's log)"
                        ) from None
                    raise exc
                unreachable_since = None
                assert isinstance(report, f.RolloverReport)
                for event in report.events:
                    _rollover_event(event, ctl.as_json)
                events.extend(report.events)
            return msgspec.structs.replace(report, events=events)

    final = guarded(go)
    if ctl.as_json:
        print_json(shapes.rollover_json(final))
    elif final.ok:
        out.print(f"rollover {final.id} of {name} done: orchestra-sup {final.release.version}")
    if not final.ok:
        raise fail(f"rollover {final.id} of {name}: {final.error}", EXIT_FAILED)


@ctl_options(
    120.0,
    timeout_option=Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="Seconds to wait for the reload to be applied (retiring shards drain for up "
            "to the config's drain_timeout_s); the reload goes on if this runs out.",
        ),
    ],
)
def reload(ctl: CtlCommand) -> None:
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
            with ctl.client() as client:
                return client.request(f.CtlReload(), timeout_s=ctl.timeout)
        except RemoteError as exc:
            if exc.code is ErrorCode.BUSY:
                raise ConfigError(f"config reload refused: busy: {exc.message}") from None
            raise

    report = guarded(go)
    assert isinstance(report, f.ReloadReport)
    if ctl.as_json:
        print_json(shapes.reload_json(report))
    if report.refused:
        raise fail(f"config reload refused: {report.error}", EXIT_USAGE)
    if not ctl.as_json:
        for line in render.reload_lines(report):
            out.print(line)
    if report.error is not None:
        raise fail(f"config reload: {report.error}", EXIT_FAILED)


def _rollover_event(event: f.RolloverEvent, as_json: bool) -> None:
    if not as_json:
        out.print(render.rollover_line(event))
