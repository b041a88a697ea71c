"""`CtlCommand.show`, the routine of most ctl commands: one request, its answer checked to be
the one expected, printed as JSON (--json) or for a person; the tree's errors end the command
with one line and the documented exit status."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer

from orchestra_sup.cli.ctlcontext import CtlCommand, CtlContext, ctl_options
from orchestra_sup.cli.options import LaneArg
from orchestra_sup.errors import ErrorCode, RemoteError, TreeUnreachable
from orchestra_sup.protocol import frames as f


class FakeClient:
    """Answers every request with `answer` (raised, when it is an exception)."""

    def __init__(self, answer: f.Body | Exception):
        self.answer = answer
        self.asked: list[tuple[f.Body, float]] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def request(self, body: f.Body, timeout_s: float) -> f.Body:
        self.asked.append((body, timeout_s))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def context(client: FakeClient) -> CtlContext:
    ctx = CtlContext(Path("/nonexistent/run"), None, None, None)
    ctx.client = lambda run_dir: client  # type: ignore[method-assign]
    return ctx


def show(ctx: CtlContext, as_json: bool, shown: list[Any]) -> None:
    CtlCommand(ctx, as_json=as_json, timeout=2.5, run_dir=None).show(
        f.Ack,
        f.CtlStop(),
        json=lambda reply: {"answer": type(reply).__name__},
        table=shown.append,
    )


def test_the_answer_is_printed_as_json_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient(f.Ack())
    shown: list[Any] = []
    show(context(client), True, shown)
    assert json.loads(capsys.readouterr().out) == {"answer": "Ack"}
    assert shown == []
    assert client.asked == [(f.CtlStop(), 2.5)]


def test_the_answer_is_rendered_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    shown: list[Any] = []
    show(context(FakeClient(f.Ack())), False, shown)
    assert shown == [f.Ack()]
    assert capsys.readouterr().out == ""


def test_an_unexpected_answer_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """An answer of another type is neither printed nor a traceback."""
    shown: list[Any] = []
    with pytest.raises(typer.Exit) as exit_:
        show(context(FakeClient(f.PlanList(plans=[]))), True, shown)
    assert exit_.value.exit_code == 1
    out, err = capsys.readouterr()
    assert (out, shown) == ("", [])
    assert err == "orchestra-sup: the tree answered CtlStop with PlanList, not Ack\n"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RemoteError(ErrorCode.NOT_FOUND, "no such plan"), 2),
        (TreeUnreachable("no tree is running at /nonexistent/run"), 3),
        (RemoteError(ErrorCode.INTERNAL, "it broke"), 1),
    ],
)
def test_the_trees_errors_end_the_command(
    error: Exception, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as exit_:
        show(context(FakeClient(error)), False, [])
    assert exit_.value.exit_code == code
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"orchestra-sup: {error}\n"


def test_ctl_options_follow_the_commands_own_and_reach_it_as_one_ctl_command() -> None:
    """typer reads the signature `ctl_options` writes: the typer context first, the command's
    own parameters, then --json, --wide (when asked for), --timeout with the command's default
    and --run-dir; a call hands those four to the command as its `CtlCommand`."""
    called: list[tuple[CtlCommand, str]] = []

    @ctl_options(60.0, wide=True)
    def command(ctl: CtlCommand, lane: LaneArg) -> None:
        called.append((ctl, lane))

    params = inspect.signature(command).parameters
    assert list(params) == ["ctx", "lane", "as_json", "wide", "timeout", "run_dir"]
    assert params["ctx"].annotation is typer.Context
    assert params["timeout"].default == 60.0
    group = CtlContext(None, None, None, None)
    command(
        SimpleNamespace(obj=group), lane="l-1", as_json=True, wide=False, timeout=2.0, run_dir=None
    )
    assert called == [(CtlCommand(group, as_json=True, timeout=2.0, run_dir=None), "l-1")]
