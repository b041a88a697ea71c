"""The fork template refuses to fork while it is not clean (real template code, run in a fresh
process of its own, since the check is about the whole process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, os, sys, threading
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.node.template import Template
from orchestra_sup.protocol.forkpipe import Fork
cmd_r, cmd_w = os.pipe()
reply_r, reply_w = os.pipe()
template = Template(cmd_r, reply_w)
os.close(cmd_w)  # the supervisor's ends, not the template's
os.close(reply_r)
clean = template.problems()
mode, tmp = sys.argv[1], sys.argv[2]
if mode == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
elif mode == "zmq":
    import zmq
    ctx = zmq.Context()
elif mode == "lmdb":
    import lmdb
    env = lmdb.open(tmp)
args = ChildArgs(role="shard", name="shard-0", generation=1, run_dir=tmp, state_dir=tmp,
                 workspace=None, lanes_per_shard=1, supervisor_pid=os.getppid())
reply = template.handle(Fork(args=args))
print(json.dumps({"clean": clean, "reply": type(reply).__name__,
                  "reason": getattr(reply, "reason", ""), "held": len(template.held),
                  "children": open(f"/proc/self/task/{os.getpid()}/children").read().split()}))
if mode == "thread":
    stop.set()
"""


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("thread", "2 threads alive"),
        ("zmq", "eventfd (a ZeroMQ context holds one)"),
        ("lmdb", "LMDB environment"),
    ],
)
def test_fork_is_refused_while_the_template_is_not_clean(
    tmp_path: Path, mode: str, needle: str
) -> None:
    """Clean at first; then a live thread, a ZeroMQ context or an LMDB environment makes the
    next `Fork` answer `Refused` naming it, and nothing is forked or held."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    result = json.loads(out)
    assert result["clean"] == []
    assert result["reply"] == "Refused"
    assert needle in result["reason"]
    assert result["held"] == 0 and result["children"] == []
