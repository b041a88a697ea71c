"""The coordinator's relayed tools: each tool's name, its parameters as a Struct, and who answers
it (ARCHITECTURE.md §6).

On the wire a tool call is a name and named string parameters (`frames.ToolCall`,
`frames.CtlCall`: `params: dict[str, str]`); `Tool.parse` reads them as the tool's Struct, in
which every field is a `str` (or None when it may be left out): a parameter the tool does not
take is ignored, as it always was, and what a value must be is checked where the tool runs
(`coordinator.toolkit`, `custodian.role`), so each refusal keeps its words.

Read tools (`answered_by` "custodian") take `path` (or `path_b64`, its exact bytes:
`protocol.names`); the three that are a few syscalls each are `inline` (the custodian answers
them on its front thread). Lane tools ("shards") take `lane`, but for `start_lane`, which the
coordinator places as a one-task plan, and `list_lanes`, which asks every shard.

`call_params` turns `ctl call`'s KEY=VALUE arguments into a request's parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from orchestra_sup.protocol.names import is_text, request_param


class Params(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every tool's parameters."""


class PathParams(Params):
    """A read tool's path: `path_b64` (base64 of its bytes) wins over `path` (text); neither:
    the workspace root, where a tool allows it."""

    path: str | None = None
    path_b64: str | None = None


class ReadFile(PathParams):
    """`read_file path=`: a file's text (at most 8 MiB)."""


class ListDir(PathParams):
    """`list_dir [path=]`: a directory's entries (the workspace root without a path)."""


class Stat(PathParams):
    """`stat path=`: what a path is."""


class Search(PathParams):
    """`search pattern= [path=] [limit=]`: lines matching a regular expression."""

    pattern: str | None = None
    limit: str = ""


class Diff(PathParams):
    """`diff [path=] [rev=]`: the working tree against `rev` ("" : HEAD)."""

    rev: str = ""


class Log(PathParams):
    """`log [path=] [rev=] [limit=]`: commits reaching `rev` ("": HEAD)."""

    rev: str = ""
    limit: str = ""


class StartLane(Params):
    """`start_lane run=CMD [name=] [timeout_s=] [requires=CAP,CAP] [tenant=] [ticket=]
    [program=] [key=] [rev=] [commit=true|false] [feedback=]`: a one-task plan
    (`coordinator.role`'s `_start_lane` says each). `rev` is the workspace revision its sandbox
    is made at ("": the head), `commit` whether its changes are committed ("": false),
    `feedback` revision feedback for its first attempt ("": none)."""

    run: str = ""
    program: str = ""
    name: str = "start_lane"
    timeout_s: str | None = None
    requires: str = ""
    tenant: str | None = None
    ticket: str = ""
    key: str | None = None
    rev: str = ""
    commit: str = ""
    feedback: str = ""


class ListLanes(Params):
    """`list_lanes`: every shard's live lanes."""


class LaneParams(Params):
    """A lane tool's lane id ("" : missing)."""

    lane: str = ""


class LaneStatus(LaneParams):
    """`lane_status lane=`."""


class CancelLane(LaneParams):
    """`cancel_lane lane=`."""


class MessageLane(LaneParams):
    """`message_lane lane= text= [key=]`: `key` is the idempotency key ("": a new one)."""

    text: str = ""
    key: str = ""


class SnapshotLane(LaneParams):
    """`snapshot_lane lane=`: its status and its transcript's newest rows."""


InlineRead = ReadFile | ListDir | Stat
"""An `inline` read tool's parameters: what the custodian answers on its front thread."""
AwaitedRead = Search | Diff | Log
"""Any other read tool's parameters: what the custodian answers from its loop."""
ReadCall = InlineRead | AwaitedRead
"""A read tool's parameters: what the custodian is asked."""
LaneCall = StartLane | ListLanes | LaneStatus | CancelLane | MessageLane | SnapshotLane
"""A lane tool's parameters: what the coordinator's toolkit serves through the shards."""


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool: its `name` on the wire, its parameters' Struct, who answers it, and whether
    the custodian answers it on its front thread."""

    name: str
    params: type[Params]
    answered_by: Literal["custodian", "shards"]
    inline: bool = False

    def parse(self, params: dict[str, str]) -> Params:
        """`params` as this tool's Struct (what it does not take left out): a `ReadCall` of a
        tool answered by the custodian, else a `LaneCall`. Never raises on a wire's params
        (string values); a value of another type raises `msgspec.ValidationError`."""
        return msgspec.convert(params, self.params)


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool("read_file", ReadFile, "custodian", inline=True),
        Tool("list_dir", ListDir, "custodian", inline=True),
        Tool("stat", Stat, "custodian", inline=True),
        Tool("search", Search, "custodian"),
        Tool("diff", Diff, "custodian"),
        Tool("log", Log, "custodian"),
        Tool("start_lane", StartLane, "shards"),
        Tool("list_lanes", ListLanes, "shards"),
        Tool("lane_status", LaneStatus, "shards"),
        Tool("cancel_lane", CancelLane, "shards"),
        Tool("message_lane", MessageLane, "shards"),
        Tool("snapshot_lane", SnapshotLane, "shards"),
    )
}
"""Every tool by name."""

READ_TOOLS = frozenset(name for name, tool in TOOLS.items() if tool.answered_by == "custodian")
LANE_TOOLS = frozenset(name for name, tool in TOOLS.items() if tool.answered_by == "shards")
INLINE_TOOLS = frozenset(name for name, tool in TOOLS.items() if tool.inline)


def call_params(items: Iterable[str]) -> dict[str, str]:
    """`ctl call`'s KEY=VALUE arguments as a request's parameters: a `path` that is not UTF-8
    goes as `path_b64` (`names.request_param`). Raises `ValueError` saying which argument is
    not KEY=VALUE, or is not UTF-8 when it is not a path."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"parameter {item!r} is not KEY=VALUE")
        if key == "path":
            key, value = request_param(key, value)
        elif not (is_text(key) and is_text(value)):
            raise ValueError(f"parameter {item!a} is not UTF-8 (only path= may name any bytes)")
        pairs[key] = value
    return pairs
