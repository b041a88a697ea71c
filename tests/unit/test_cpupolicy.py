"""The CPU policy's pure parts (`system.cpupolicy`): CPU lists, each role's plan, `[cpu]`."""

from __future__ import annotations

import os

import pytest

from orchestra_sup.config import settings_from_mapping
from orchestra_sup.errors import ConfigError
from orchestra_sup.system.cpudoctor import LANE_LAYERS, cpu_layers
from orchestra_sup.system.cpupolicy import (
    CpuPlan,
    CpuSettings,
    format_cpus,
    in_force,
    machine_cpus,
    parse_cpus,
    realtime_refusal,
    role_plans,
)
from orchestra_sup.system.lanecpu import layer_here


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("", set()), ("0", {0}), ("0,2-3", {0, 2, 3}), (" 1 , 3-4 ", {1, 3, 4}), ("0-0", {0})],
)
def test_cpu_lists_read_as_taskset_writes_them(text: str, cpus: set[int]) -> None:
    assert parse_cpus(text) == cpus
    assert parse_cpus(format_cpus(frozenset(cpus))) == cpus


@pytest.mark.parametrize("text", ["x", "1-", "-1", "3-1", "0,a", "1-9999", "²", "0-²", "٣"])
def test_a_cpu_list_that_is_not_one_is_refused_naming_the_part(text: str) -> None:
    with pytest.raises(ValueError, match="is not a CPU"):
        parse_cpus(text)


def test_ranges_are_written_compactly() -> None:
    assert format_cpus(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"


def test_off_keeps_every_role_as_it_was_but_the_custodians_busy_polling() -> None:
    plans = role_plans(CpuSettings(), realtime=False, machine=frozenset({0, 1}))
    assert plans.pop("custodian") == CpuPlan(busy_poll_s=CpuSettings().busy_poll_s)
    assert set(plans.values()) == {CpuPlan()}


@pytest.mark.parametrize(
    ("settings", "realtime", "machine", "busy_poll_s"),
    [
        (CpuSettings(busy_poll_s=0.001), False, {0, 1}, 0.001),
        (CpuSettings(busy_poll_s=0), False, {0, 1}, 0.0),
        (CpuSettings(), False, {0}, 0.0),  # one CPU: nothing else could send the frame
        (CpuSettings(reserved_cpus="0"), False, {0, 1}, 0.0),  # the control plane on one
        (CpuSettings(reserved_cpus="0-1"), False, {0, 1, 2}, 0.0002),
        (CpuSettings(realtime="auto"), True, {0, 1}, 0.0),  # a spinning FIFO thread starves
        (CpuSettings(realtime="auto"), False, {0, 1}, 0.0002),  # "auto" refused: SCHED_OTHER
    ],
)
def test_only_an_ordinary_custodian_on_more_than_one_cpu_busy_polls(
    settings: CpuSettings, realtime: bool, machine: set[int], busy_poll_s: float
) -> None:
    plans = role_plans(settings, realtime=realtime, machine=frozenset(machine))
    assert plans["custodian"].busy_poll_s == busy_poll_s
    assert {plan.busy_poll_s for role, plan in plans.items() if role != "custodian"} == {0.0}


def test_real_time_ranks_the_supervisor_above_its_control_plane_children() -> None:
    settings = CpuSettings(realtime="on", rt_priority=7, rttime_s=0.5, reserved_cpus="1")
    plans = role_plans(settings, realtime=True, machine=frozenset({0, 1, 2, 3}))
    assert plans["supervisor"] == CpuPlan(priority=7, rttime_us=500_000, cpus=(1,))
    assert plans["coordinator"] == CpuPlan(priority=6, rttime_us=500_000, cpus=(1,))
    assert plans["custodian"] == CpuPlan(priority=6, loop=False, rttime_us=500_000, cpus=(1,))
    assert plans["shard"] == CpuPlan(cpus=(0, 1, 2, 3))  # widened back from the pinned parent


def test_auto_where_real_time_is_refused_still_pins_but_takes_no_class() -> None:
    settings = CpuSettings(realtime="auto", reserved_cpus="0")
    plans = role_plans(settings, realtime=False, machine=frozenset({0, 1}))
    assert plans["supervisor"] == CpuPlan(cpus=(0,))
    assert plans["shard"] == CpuPlan(cpus=(0, 1))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"realtime": "yes"}, '[cpu] realtime = "yes": expected one of "off", "auto", "on"'),
        ({"rt_priority": 98}, "[cpu] rt_priority = 98: must be between 2 and 97"),
        ({"rttime_s": 0}, "[cpu] rttime_s = 0: must be between 0.05 and 60"),
        ({"busy_poll_s": 0.5}, "[cpu] busy_poll_s = 0.5: must be between 0 and 0.01"),
        ({"busy_poll_s": -1}, "[cpu] busy_poll_s = -1: must be between 0 and 0.01"),
        ({"reserved_cpus": 0}, "[cpu] reserved_cpus = 0: expected a CPU list"),
        ({"reserved_cpus": "0-x"}, "[cpu] reserved_cpus = \"0-x\": '0-x' is not a CPU"),
        ({"reserved_cpus": "4000"}, '[cpu] reserved_cpus = "4000": CPU 4000 is not one'),
        ({"lanes": "idel"}, '[cpu] lanes = "idel": expected one of "nice", "idle"'),
        ({"nice": 5}, "[cpu] unknown key 'nice': it belongs in [lanes]"),
    ],
)
def test_bad_cpu_settings_are_refused_in_one_line(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"cpu": table})
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_what_is_in_force_reads_the_kernel() -> None:
    line = in_force(os.getpid())
    assert line.endswith(f"cpus {format_cpus(frozenset(os.sched_getaffinity(0)))}")
    assert line.startswith("other nice ") or line.startswith("fifo ")
    assert in_force(2**22 + 1) == ""  # no such process


def test_doctor_says_which_cpu_layers_work_here_and_which_auto_takes() -> None:
    layers = {layer.name: layer for layer in cpu_layers()}
    allowed = realtime_refusal(5) is None
    assert layers["real time"].available is layers["real time"].used is allowed
    lane_layers = [name for name in LANE_LAYERS if layers[name].used]
    assert len(lane_layers) == 1  # exactly one layer puts lanes below the hosts
    assert layers[lane_layers[0]].available
    expected = {"cpu.idle": "cpu.idle cgroup", "cpu.shares": "cpu.shares cgroup"}
    assert lane_layers[0] == expected.get(layer_here("idle"), "SCHED_IDLE")
    assert not layers["affinity"].used  # reserved CPUs are the operator's choice
    # under "auto" the custodian busy-polls only where it cannot take real time
    many = len(machine_cpus()) > 1
    assert layers["busy polling"].available is many
    assert layers["busy polling"].used is (many and not allowed)
