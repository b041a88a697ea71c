"""`bench.machine`: what a benchmark records about the machine it ran on, parsed from /proc and
sysfs texts, and `--hold-cpu-latency`'s hold of /dev/cpu_dma_latency."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from orchestra_sup.bench import machine as m
from orchestra_sup.errors import ConfigError

PROC_STAT = """\
cpu  2252909 90292 951521 1675652 112981 0 41368 4214 0 0
cpu0 1113895 38865 445637 937040 25464 0 1088 2042 0 0
cpu1 1139013 51426 505884 738612 87517 0 40279 2171 0 0
intr 123 0 0
ctxt 456
btime 1700000000
"""


def test_cpu_times_sum_the_aggregate_line_and_take_its_steal_column() -> None:
    total, steal = m.cpu_times(PROC_STAT)
    assert steal == 4214
    assert total == 2252909 + 90292 + 951521 + 1675652 + 112981 + 0 + 41368 + 4214


def test_guest_time_is_not_counted_twice() -> None:
    """guest and guest_nice are already inside user and nice: they do not add to the total."""
    with_guest = "cpu  10 0 0 80 0 0 0 10 7 3\n"
    assert m.cpu_times(with_guest) == (100, 10)


@pytest.mark.parametrize("text", ["", "cpu0 1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4\n", "intr 1 2\n"])
def test_cpu_times_refuse_a_text_without_a_full_aggregate_line(text: str) -> None:
    with pytest.raises(ValueError):
        m.cpu_times(text)


def test_steal_is_a_percentage_of_the_cpu_time_in_the_interval() -> None:
    start = m.cpu_times("cpu  100 0 100 700 0 0 0 100 0 0\n")
    end = m.cpu_times("cpu  150 0 150 1000 0 0 0 200 0 0\n")  # +500 ticks, +100 of them stolen
    assert m.steal_percent(start, end) == 20.0
    assert m.steal_percent((10, 1), (20, 1)) == 0.0


@pytest.mark.parametrize("start, end", [((10, 1), (10, 1)), ((10, 1), (5, 0)), ((10, 5), (20, 4))])
def test_steal_is_none_without_an_interval(start: tuple[int, int], end: tuple[int, int]) -> None:
    assert m.steal_percent(start, end) is None


def test_a_sysfs_value_loses_its_newline_and_unreadable_is_unknown() -> None:
    assert m.sysfs_word("haltpoll\n") == "haltpoll"
    assert m.sysfs_word("menu") == "menu"
    assert m.sysfs_word(None) == "unknown"
    assert m.sysfs_word("\n") == "unknown"


def test_the_latency_target_is_a_native_32_bit_integer() -> None:
    assert m.latency_target_us(struct.pack("i", 0)) == 0
    assert m.latency_target_us(struct.pack("i", m.LATENCY_DEFAULT_US)) == m.LATENCY_DEFAULT_US
    with pytest.raises(ValueError):
        m.latency_target_us(b"\x00\x00")


def _sample(load: float, cpu: tuple[int, int] | None, latency: int | None) -> m.Sample:
    return m.Sample(loadavg=(load, load, load), cpu=cpu, latency_us=latency)


def test_the_record_has_every_documented_key() -> None:
    record = m.record(
        _sample(1.5, (1000, 10), 0), _sample(2.0, (2000, 60), 0), hold_cpu_latency=True
    )
    assert set(record) == {
        "cpu_count",
        "affinity_cpus",
        "cpuidle_driver",
        "cpuidle_governor",
        "cpu_dma_latency_us",
        "cpu_dma_latency_held",
        "hold_cpu_latency",
        "loadavg_start",
        "loadavg_end",
        "steal_percent",
    }
    assert record["steal_percent"] == 5.0
    assert record["loadavg_start"] == [1.5, 1.5, 1.5] and record["loadavg_end"] == [2.0] * 3
    assert record["cpu_dma_latency_us"] == 0 and record["cpu_dma_latency_held"] is True
    assert record["hold_cpu_latency"] is True
    assert 1 <= record["affinity_cpus"] <= record["cpu_count"]


def test_the_record_says_unknown_for_what_it_could_not_read() -> None:
    record = m.record(_sample(0.0, None, None), _sample(0.0, (5, 0), None), hold_cpu_latency=False)
    assert record["steal_percent"] == "unknown"
    assert record["cpu_dma_latency_us"] == "unknown"
    assert record["cpu_dma_latency_held"] == "unknown"
    assert "cpu_dma_latency unknown" in m.one_line(record)


def test_the_default_latency_target_is_not_held() -> None:
    start = _sample(0.5, (0, 0), m.LATENCY_DEFAULT_US)
    record = m.record(start, start, hold_cpu_latency=False)
    assert record["cpu_dma_latency_held"] is False
    line = m.one_line(record)
    assert re.match(r"\d+ CPUs \(\d+ usable\), cpuidle \S+/\S+, ", line), line
    assert "cpu_dma_latency not held" in line and "load 0.5/0.5" in line
    assert "\n" not in line


def test_a_hold_that_cannot_open_the_device_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "cpu_dma_latency"
    ran = False
    with pytest.raises(ConfigError) as caught, m.cpu_latency_held(True, missing):
        ran = True
    assert not ran
    assert str(caught.value) == (
        f"--hold-cpu-latency: cannot hold {missing}: No such file or directory"
    )


def test_a_hold_writes_a_32_bit_zero_and_keeps_the_file_open(tmp_path: Path) -> None:
    """A plain file stands in for the device: the 4 bytes are written before the block runs,
    and the file stays open until it ends (the kernel drops the request when it is closed)."""
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    with m.cpu_latency_held(True, device):
        assert device.read_bytes() == struct.pack("i", 0)
        assert str(device) in _open_files()
    assert str(device) not in _open_files()


def _open_files() -> set[str]:
    fds = Path("/proc/self/fd")
    out = set()
    for fd in fds.iterdir():
        try:
            out.add(str(fd.readlink()))
        except OSError:
            continue
    return out


def test_no_hold_touches_nothing(tmp_path: Path) -> None:
    with m.cpu_latency_held(False, tmp_path / "absent"):
        pass
    assert not (tmp_path / "absent").exists()
