"""`bench chaos --hosts 2` (issue 21): host agents join the chaos tree, each in a network
namespace of its own, and half the harm is a host SIGKILLed whole or partitioned. Nothing may
be lost, duplicated or left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.etcd_cluster import needs_etcd
from tests.integration.test_role_loss import default_isolation

pytestmark = [pytest.mark.integration, needs_etcd]


@pytest.mark.timeout(300)
def test_a_short_chaos_run_with_two_hosts_loses_nothing(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "orchestra_sup", "bench", "chaos", "--hosts", "2"]
    proc = subprocess.Popen(
        [*argv, "--duration", "20", "--seed", "5", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=default_isolation(TMPDIR=str(tmp_path)),
        start_new_session=True,  # its etcd and agents go with it if it has to be killed
    )
    try:
        out, err = proc.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"bench chaos --hosts 2 still running after 280 s:\n{err[-3000:]}"
        ) from None
    assert out.startswith("{"), err[-3000:]
    report = json.loads(out)
    print({k: report[k] for k in ("kills", "host_kills", "partitions", "tasks", "network")})
    assert report["hosts"] == 2 and report["host_kills"] + report["partitions"] >= 1, report
    assert report["tasks"] >= 60 and report["succeeded"] > 0 and report["unrecorded"] == 0
    assert report["lost"] == 0 and report["duplicated"] == 0 and report["orphans"] == 0, report
    assert report["supervisor_alive"] is True
    assert proc.returncode == 0, err
