"""Tests for `orchestra_sup.supervisor.reload`'s diff: which settings touch which children."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.config import Settings, settings_from_mapping
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f
from orchestra_sup.supervisor.reload import changed_settings, plan, quiet
from orchestra_sup.supervisor.source import ConfigSource
from orchestra_sup.system.cpupolicy import machine_cpus

SHARDS3 = ["shard-0", "shard-1", "shard-2"]


def settings(**sections: dict[str, Any]) -> Settings:
    return settings_from_mapping({"shards": {"count": 3}, **sections})


def test_nothing_changed_touches_no_child() -> None:
    """The same settings again: no setting changed, every child unchanged."""
    step = plan(settings(), settings())
    assert step.changed == []
    assert step.unchanged == ["custodian", "coordinator", *SHARDS3]
    assert step.restart == step.update == step.add == step.retire == []
    assert step.refusal is None


def test_more_shards_adds_the_new_ones_and_keeps_the_rest() -> None:
    """count 3 -> 5 adds shard-3 and shard-4 in order; every existing child is unchanged."""
    step = plan(settings(), settings(shards={"count": 5}))
    assert step.changed == ["[shards] count"]
    assert step.add == ["shard-3", "shard-4"]
    assert step.unchanged == ["custodian", "coordinator", *SHARDS3]
    assert step.restart == step.retire == []


def test_fewer_shards_retires_the_highest_first() -> None:
    """count 3 -> 1 retires shard-2 then shard-1; shard-0 and the rest are unchanged."""
    step = plan(settings(), settings(shards={"count": 1}))
    assert step.retire == ["shard-2", "shard-1"]
    assert step.unchanged == ["custodian", "coordinator", "shard-0"]
    assert step.add == step.restart == []


def test_lanes_per_shard_restarts_the_shards_only() -> None:
    """A shard's capacity is in its args: each shard restarts; custodian and coordinator
    (which place by the roster, not by their args) keep their pids."""
    step = plan(settings(), settings(shards={"count": 3, "lanes_per_shard": 2}))
    assert step.changed == ["[shards] lanes_per_shard"]
    assert step.restart == SHARDS3
    assert step.unchanged == ["custodian", "coordinator"]


EVERY = ["custodian", "coordinator", *SHARDS3]


@pytest.mark.parametrize(
    ("section", "restarted", "updated"),
    [
        ({"quotas": {"acme": {"rate": 5}}}, ["coordinator"], []),
        ({"relay": {"deadline_s": 10.0}}, ["coordinator"], []),
        ({"lanes": {"max_worker_loss": 1}}, ["coordinator"], []),
        ({"lanes": {"nice": 3}}, SHARDS3, []),
        ({"retention": {"transcripts_s": 60.0}}, ["custodian", "coordinator", *SHARDS3], []),
        ({"lanes": {"programs": ["a.b:C"]}}, ["coordinator", *SHARDS3], []),
        ({"isolation": {"max_open_files": 100}}, SHARDS3, []),
        ({"supervisor": {"shutdown_timeout_s": 9.0}}, SHARDS3, ["custodian", "coordinator"]),
        ({"supervisor": {"watchdog_s": 1.0}}, EVERY, []),
    ],
)
def test_settings_in_a_childs_args_restart_it(
    section: dict[str, Any], restarted: list[str], updated: list[str]
) -> None:
    """A setting restarts exactly the children that read it: quotas, the relay deadline and
    the worker-loss cap the coordinator; lane settings and isolation the shards; the lane
    grace the shards (the others only get the new shutdown grace, in place); a watchdog short
    enough to change the heartbeat interval every child."""
    step = plan(settings(), settings(**section))
    assert step.restart == restarted
    assert step.update == updated
    assert step.unchanged == [n for n in EVERY if n not in restarted + updated]


@pytest.mark.parametrize(
    "supervisor",
    [
        {"max_restarts": 9},
        {"max_seconds": 5.0},
        {"backoff_initial_s": 0.5, "backoff_max_s": 9.0},
        {"drain_timeout_s": 4.0},
        {"watchdog_s": 30.0},  # the heartbeat stays 0.5 s: no child sees it
    ],
)
def test_supervisor_only_settings_restart_no_child(supervisor: dict[str, Any]) -> None:
    """Intensity, backoff, drain timeout and a watchdog of 2 s or more are the supervisor's
    alone: applied in place, every child unchanged."""
    step = plan(settings(), settings(supervisor=supervisor))
    assert step.changed and step.refusal is None
    assert step.unchanged == ["custodian", "coordinator", *SHARDS3]


def test_a_shards_placement_offer_is_updated_in_place() -> None:
    """A shard's own capabilities reach only the roster: that shard is updated, not
    restarted; the others are unchanged."""
    new = settings(shards={"count": 3, "shard-1": {"capabilities": ["gpu"]}})
    step = plan(settings(), new)
    assert step.changed == ["[shards.shard-1] capabilities"]
    assert step.update == ["shard-1"]
    assert step.restart == []
    assert step.unchanged == ["custodian", "coordinator", "shard-0", "shard-2"]


def test_a_key_that_cannot_change_live_is_refused() -> None:
    """`[supervisor] spawn` (the fork template) is refused in one line naming the key."""
    step = plan(settings(), settings(supervisor={"spawn": "exec"}))
    assert step.refusal is not None
    assert step.refusal.startswith("[supervisor] spawn cannot change while the tree runs")
    assert "\n" not in step.refusal


@pytest.mark.parametrize(
    ("key", "value"),
    [("realtime", "on"), ("rt_priority", 20), ("rttime_s", 0.5), ("reserved_cpus", "0")],
)
def test_the_supervisors_own_cpu_class_cannot_change_live(key: str, value: object) -> None:
    """The supervisor takes its class, its affinity and its RLIMIT_RTTIME once, as it starts:
    a reload that moved only its children (real time on under a SCHED_OTHER supervisor with no
    guard; a coordinator at rt_priority 19 above a supervisor and a guard at 5 and 6) is refused.
    `[cpu] lanes` restarts only the shards."""
    step = plan(settings(), settings(cpu={key: value}))
    assert step.refusal is not None
    assert step.refusal.startswith(f"[cpu] {key} cannot change while the tree runs")
    lanes = plan(settings(), settings(cpu={"lanes": "idle"}))
    assert lanes.refusal is None and lanes.restart == SHARDS3


@pytest.mark.skipif(len(machine_cpus()) < 2, reason="on one CPU nothing busy-polls")
def test_a_new_busy_poll_window_restarts_only_the_custodian() -> None:
    """`[cpu] busy_poll_s` is the custodian's front's alone: a reload restarts the custodian,
    whose next generation busy-polls for the new window, and no other child."""
    step = plan(settings(), settings(cpu={"busy_poll_s": 0.001}))
    assert step.refusal is None and step.changed == ["[cpu] busy_poll_s"]
    assert step.restart == ["custodian"]


def test_changed_settings_name_nested_tables() -> None:
    """Quotas and per-shard tables are named as the TOML file spells them."""
    old = settings()
    new = settings(quotas={"acme": {"rate": 5}}, shards={"count": 3, "shard-2": {"tenants": ["a"]}})
    changed = changed_settings(old, new)
    assert "[quotas.acme] rate" in changed
    assert "[shards.shard-2] tenants" in changed


def test_config_source_applies_the_start_overrides_on_top(tmp_path: Path) -> None:
    """The re-read file is overridden by `start`'s --shards, as at start; a bad file raises
    `ConfigError` naming it."""
    path = tmp_path / "tree.toml"
    path.write_text("[shards]\ncount = 5\nlanes_per_shard = 3\n")
    loaded = ConfigSource(path=str(path), shards=2).load()
    assert (loaded.shards.count, loaded.shards.lanes_per_shard) == (2, 3)
    path.write_text("[shards]\ncount = 0\n")
    with pytest.raises(ConfigError, match=f"config {path}: \\[shards\\] count = 0"):
        ConfigSource(path=str(path)).load()


def test_metrics_flags_stay_on_top_and_the_endpoint_cannot_move_live(tmp_path: Path) -> None:
    """`--metrics-port`/`--metrics-host` win over the re-read file as at start, so a reload of
    an untouched file changes nothing; the file's own metrics_port moving is refused (the
    endpoint is bound once), not reported as applied while the old port goes on serving."""
    path = tmp_path / "tree.toml"
    path.write_text("[shards]\ncount = 2\n")
    source = ConfigSource(path=str(path), metrics_port=0, metrics_host="127.0.0.1")
    first = source.load()
    assert (first.supervisor.metrics_port, first.supervisor.metrics_host) == (0, "127.0.0.1")
    assert changed_settings(first, source.load()) == []
    path.write_text("[supervisor]\nmetrics_port = 9464\n")
    at_start = ConfigSource(path=str(path)).load()
    path.write_text("[supervisor]\nmetrics_port = 9465\n")
    step = plan(at_start, ConfigSource(path=str(path)).load())
    assert step.refusal is not None
    assert step.refusal.startswith("[supervisor] metrics_port cannot change while the tree runs")


def test_a_retiring_shard_is_quiet_only_with_no_lane_and_nothing_unsent() -> None:
    """A lane running, or a result not yet acknowledged in its outbox, keeps the drain
    waiting; only both at zero let the shard go."""
    assert quiet(f.Heartbeat(load=0, outbox_depth=0))
    assert not quiet(f.Heartbeat(load=1, outbox_depth=0))
    assert not quiet(f.Heartbeat(load=0, outbox_depth=1))
