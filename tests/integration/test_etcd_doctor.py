"""`orchestra-sup doctor --config` on a real three-member etcd cluster (issue 21, ADR 0021;
`cluster.health`): every member and the quorum, one member down, two down, and a config that
names no etcd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.etcd_cluster import EtcdCluster, needs_etcd

pytestmark = pytest.mark.integration


def doctor(config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "orchestra_sup", "doctor", "--config", str(config), *options]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def cluster_of(config: Path) -> dict[str, Any]:
    done = doctor(config, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["cluster"]


@needs_etcd
def test_doctor_says_which_members_answer_and_whether_there_is_a_quorum(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    config = tmp_path / "tree.toml"
    config.write_text(f"[cluster]\netcd = {json.dumps(etcd_cluster.endpoints)}\n")
    seen = cluster_of(config)
    assert [m["ok"] for m in seen["members"]] == [True, True, True]
    assert all(
        "etcd 3." in m["detail"] and "follows leader" in m["detail"] for m in seen["members"]
    )
    assert seen["quorum"] is True
    etcd_cluster.kill("m0")
    seen = cluster_of(config)
    assert [m["ok"] for m in seen["members"]] == [False, True, True]
    assert seen["quorum"] is True
    etcd_cluster.kill("m1")
    done = doctor(config)
    assert done.returncode == 1, done.stderr  # no quorum: a preflight check fails
    lines = done.stdout.splitlines()
    assert any(line.startswith("no  etcd quorum") for line in lines), lines
    assert [line[:3] for line in lines if " etcd http" in line] == ["no ", "no ", "yes"]


def test_doctor_without_a_cluster_table_says_nothing_of_etcd(tmp_path: Path) -> None:
    config = tmp_path / "tree.toml"
    config.write_text("[shards]\ncount = 1\n")
    assert cluster_of(config) is None
    assert "etcd" not in doctor(config).stdout


def test_doctor_refuses_a_bad_cluster_table_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "tree.toml"
    config.write_text('[cluster]\netcd = ["10.0.0.5:2379"]\n')
    done = doctor(config)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"orchestra-sup: config {config}: [cluster] etcd: '10.0.0.5:2379' is not an http:// or "
        "https:// URL"
    ]
