"""The relay: coordinator -> custodian (`Relay`): one tool call and its answer. Which tools
there are, and their parameters, is `protocol.tools`."""

from __future__ import annotations

from typing import Any

from orchestra_sup.protocol.frames.frame import Frame


class ToolCall(Frame, tag="tool_call"):
    """One coordinator tool call. `params` are the tool's named string parameters; `key` is the
    idempotency key of a send (None for reads)."""

    tool: str
    params: dict[str, str] = {}
    key: str | None = None


class ToolResult(Frame, tag="tool_result"):
    """A tool's answer: a JSON-shaped value whose shape each tool documents."""

    value: Any


Relay = ToolCall | ToolResult
