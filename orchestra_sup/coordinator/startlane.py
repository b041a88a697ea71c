"""The `start_lane` tool: a one-task plan of the command asked, submitted and placed like any
(`Coordinator._submit`); its idempotency key makes a start sent again harmless."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.protocol.patterns import SHELL


class Submit(Protocol):
    """`Coordinator._submit`: a plan accepted (or the one its key holds), as `PlanAccepted`."""

    def __call__(
        self, spec: f.PlanSpec, key: str | None = ..., ticket: str | None = ...
    ) -> Awaitable[f.Body]: ...


async def start_lane(
    book: PlanBook, submit: Submit, params: tools.StartLane, grant: f.Budget | None = None
) -> dict[str, Any]:
    """`start_lane run=CMD [name=] [timeout_s=] [requires=CAP,CAP] [tenant=] [ticket=]
    [program=] [key=] [rev=] [commit=true|false] [feedback=]`: a one-task plan, placed like
    any. The key makes a re-sent start harmless (the same plan and lane are answered); a
    `ticket` from an earlier answer sends the lane back to that shard while its generation
    lives (`placement.AffinityTicket`).

    `rev` (default: none) makes its sandbox at that revision of the workspace (a sha, a
    short sha, a branch, `HEAD~3`, resolved when the sandbox is made) instead of the head;
    one that names no commit fails the lane with "unknown rev 'X': no such commit", and the
    task's report says in `rev` the full sha a sandbox was made at. `commit=true` (default
    false) commits the sandbox's changes when the lane succeeds, as a plan task's
    `commit = true`: the lane's `commit` is the new head of the workspace's branch. A
    sandbox at an older `rev` is one that fell behind: its change against that revision is
    cherry-picked onto the branch's head (`Workspace.commit_sandbox`), and one that
    conflicts fails the lane, landing nothing. `feedback` is revision feedback for its first
    attempt (`$ORCHESTRA_FEEDBACK`, `LaneContext.feedback`), at most 64 KiB of UTF-8. An
    empty `rev` or `feedback` is none.

    Answers {"plan", "lane", "status", "shard", "ticket", "duplicate"}; lane, shard and
    ticket are null while the lane waits for a shard, and for a key whose plan was pruned
    (status "pruned": it finished longer ago than `[retention] plans_s`). A session starts
    its lanes here with `grant`, what its budget leaves them (the one-task plan's budget).
    Raises
    `RemoteError(bad_request)` for a bad parameter (naming it: a `commit` that is not true
    or false, a `rev` with whitespace or over 256 characters, a `feedback` over 64 KiB) or a
    need no shard could meet."""
    run = params.run
    program = params.program or SHELL
    if not run and program == SHELL:
        raise RemoteError(ErrorCode.BAD_REQUEST, "missing parameter 'run'")
    try:
        timeout = float(params.timeout_s) if params.timeout_s is not None else None
    except ValueError as exc:
        raise RemoteError(ErrorCode.BAD_REQUEST, f"timeout_s: {exc}") from exc
    if params.ticket:
        try:
            AffinityTicket.parse(params.ticket)
        except ValueError as exc:
            raise RemoteError(ErrorCode.BAD_REQUEST, str(exc)) from exc
    commit = _flag(params.commit, "commit")
    requires = [c for c in params.requires.split(",") if c]
    task = f.TaskSpec(
        id="lane",
        run=run,
        timeout_s=timeout,
        requires=requires,
        program=program,
        commit=commit,
        rev=params.rev or None,
        feedback=params.feedback or None,
    )
    spec = f.PlanSpec(name=params.name, tasks=[task], tenant=params.tenant, budget=grant)
    key = params.key
    duplicate = key is not None and key in book.keys
    accepted = await submit(spec, key=key, ticket=params.ticket or None)
    assert isinstance(accepted, f.PlanAccepted)
    plan = book.plans.get(accepted.id)
    if plan is None:  # its key outlived it (`coordinator.retention`): nothing starts again
        return {
            "plan": accepted.id,
            "lane": None,
            "status": "pruned",
            "shard": None,
            "ticket": None,
            "duplicate": True,
        }
    rec = plan.tasks["lane"]
    return {
        "plan": accepted.id,
        "lane": rec.lane,
        "status": str(rec.status),
        "shard": rec.shard,
        "ticket": rec.ticket,
        "duplicate": duplicate,
    }


def _flag(value: str, name: str) -> bool:
    """Tool parameter `name`'s boolean: "true" or "false" in any case, "" (left out) false.
    Raises `RemoteError(bad_request)` naming the parameter for anything else."""
    if value.lower() in ("", "false"):
        return False
    if value.lower() == "true":
        return True
    raise RemoteError(
        ErrorCode.BAD_REQUEST, f"parameter {name!r} must be true or false, got {value!r}"
    )
