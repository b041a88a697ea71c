"""The tool registry (`protocol.tools`): every tool's parameters, who answers it, and how
`ctl call` makes its parameters."""

from __future__ import annotations

import os
import typing

import pytest

from orchestra_sup.custodian import role as custodian
from orchestra_sup.protocol import tools


def test_each_tool_parses_as_the_union_its_answerer_dispatches() -> None:
    read, lane = typing.get_args(tools.ReadCall), typing.get_args(tools.LaneCall)
    for tool in tools.TOOLS.values():
        assert tool.params in (read if tool.answered_by == "custodian" else lane), tool.name
    assert {t.params for t in tools.TOOLS.values()} == {*read, *lane}


def test_the_custodian_answers_the_inline_tools_on_its_front() -> None:
    assert set(custodian.INLINE_TOOLS) == tools.INLINE_TOOLS
    for tool in tools.TOOLS.values():
        if tool.answered_by == "custodian":
            union = tools.InlineRead if tool.inline else tools.AwaitedRead
            assert tool.params in typing.get_args(union), tool.name
    assert tools.INLINE_TOOLS < tools.READ_TOOLS
    assert set(tools.TOOLS) == tools.READ_TOOLS | tools.LANE_TOOLS


def test_parse_takes_what_a_tool_takes_and_leaves_the_rest() -> None:
    start = tools.TOOLS["start_lane"].parse({"run": "true", "timeout_s": "2", "other": "x"})
    assert start == tools.StartLane(run="true", timeout_s="2")
    assert start.name == "start_lane" and start.tenant is None and start.key is None
    message = tools.TOOLS["message_lane"].parse({"lane": "l", "text": "hi"})
    assert message == tools.MessageLane(lane="l", text="hi", key="")


def test_call_params() -> None:
    assert tools.call_params(["path=README.md", "limit=3", "text=a=b"]) == {
        "path": "README.md",
        "limit": "3",
        "text": "a=b",
    }
    odd = os.fsdecode(b"caf\xe9")
    assert tools.call_params([f"path={odd}"]) == {"path_b64": "Y2Fm6Q=="}
    with pytest.raises(ValueError, match="parameter 'nope' is not KEY=VALUE"):
        tools.call_params(["nope"])
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        tools.call_params(["=x"])
    with pytest.raises(ValueError, match=r"is not UTF-8 \(only path= may name any bytes\)"):
        tools.call_params([f"text={odd}"])
