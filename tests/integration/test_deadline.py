"""The relay's deadline (`[relay] deadline_s`): a call nobody answers in time is outcome-unknown."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree

pytestmark = pytest.mark.integration


def test_a_lane_tool_past_the_configured_deadline_says_the_outcome_is_unknown(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """With deadline_s = 1, a cancel sent to a shard whose loop is wedged for 20 s fails as a
    typed `timeout` well before the wedge ends, naming how to check before sending again."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text("[relay]\ndeadline_s = 1.0\n")
    tree = tree_factory(workspace=repo, config=cfg, extra_env={"ORCHESTRA_SUP_DEBUG_HOOKS": "1"})
    started = tree.ctl(f.CtlCall(tool="start_lane", params={"run": "sleep 300"}), timeout_s=30)
    assert isinstance(started, f.ToolResult) and started.value["shard"] == "shard-0"
    lane = started.value["lane"]
    running = tree.ctl(f.CtlCall(tool="lane_status", params={"lane": lane}), timeout_s=30)
    assert isinstance(running, f.ToolResult) and running.value["state"] in ("starting", "running")
    assert tree.ctl(f.CtlDebug(name="shard-0", action="block_loop", seconds=20)) == f.Ack()
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as info:
        tree.ctl(f.CtlCall(tool="cancel_lane", params={"lane": lane}), timeout_s=15)
    assert time.monotonic() - t0 < 15  # the relay's deadline, not the client's, ended it
    assert info.value.code is ErrorCode.TIMEOUT
    assert "check with lane_status before sending again" in str(info.value)
