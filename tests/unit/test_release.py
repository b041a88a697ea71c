"""Releases (`orchestra_sup.release`) and a rollover's record (`rolloverrecord.Rollover`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestra_sup import release
from orchestra_sup.errors import ReleaseError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN
from orchestra_sup.supervisor.rolloverrecord import Rollover


def info(low: int, high: int, version: str = "7.0.0") -> f.ReleaseInfo:
    return f.ReleaseInfo(python="/x/python", version=version, proto_min=low, proto_max=high)


@pytest.mark.parametrize(
    ("low", "high", "ok"),
    [
        (PROTOCOL_MIN, PROTOCOL_MAX, True),
        (PROTOCOL_MIN - 1, PROTOCOL_MIN, True),
        (PROTOCOL_MAX, PROTOCOL_MAX + 4, True),
        (PROTOCOL_MAX + 1, PROTOCOL_MAX + 2, False),
        (PROTOCOL_MIN - 2, PROTOCOL_MIN - 1, False),
    ],
)
def test_compatible_when_the_ranges_overlap(low: int, high: int, ok: bool) -> None:
    assert release.compatible_with(info(low, high)) is ok


def test_the_refusal_names_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "_TEST_VERSION", "1.2.3")
    line = release.refusal(info(7, 9, "4.0.0"))
    ours = f"{PROTOCOL_MIN}..{PROTOCOL_MAX}"
    assert "4.0.0" in line and "7..9" in line and "1.2.3" in line and ours in line
    assert "\n" not in line


@pytest.mark.parametrize("text", ["2", "a..b", "1-2", ".."])
def test_a_bad_protocol_override_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setattr(release, "_TEST_PROTOCOL", text)
    with pytest.raises(ReleaseError, match=r"is not MIN\.\.MAX"):
        release.protocol_range()


def test_the_probe_of_this_interpreter_describes_it() -> None:
    got = asyncio.run(release.probe(sys.executable))
    assert got == release.describe(sys.executable)


def test_the_probe_refuses_what_is_not_a_release(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'no module named orchestra_sup' >&2; exit 1\n")
    script.chmod(0o755)
    with pytest.raises(ReleaseError, match="its probe exited 1: no module named orchestra_sup"):
        asyncio.run(release.probe(str(script)))
    with pytest.raises(ReleaseError, match="not an executable file"):
        asyncio.run(release.probe(str(tmp_path / "missing")))
    script.write_text("#!/bin/sh\necho hello\n")
    with pytest.raises(ReleaseError, match="answered nonsense"):
        asyncio.run(release.probe(str(script)))


def test_a_probe_that_hangs_is_killed_at_its_deadline(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(0o755)
    held: set[int] = set()

    async def go() -> None:
        with pytest.raises(ReleaseError, match=r"no answer from its probe within 0\.2 s"):
            await release.probe(str(script), 0.2, hold=held)

    asyncio.run(go())
    assert held == set()  # released from the supervisor's known pids once waited for


def test_a_hung_probe_is_killed_with_what_it_started(tmp_path: Path) -> None:
    """A probe that leaves a child holding its output pipe: the deadline still holds (the whole
    process group is killed), rather than the child's own lifetime."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nsleep 60\necho never\n")
    script.chmod(0o755)

    async def go() -> None:
        async with asyncio.timeout(5.0):
            with pytest.raises(ReleaseError, match=r"within 0\.2 s"):
                await release.probe(str(script), 0.2)

    asyncio.run(go())


def escaping(script: Path, pid_file: Path, then: str) -> None:
    """`script` starts a `setsid` child holding its stdout (out of its process group: a group
    kill misses it), which writes its pid to `pid_file`; then the script runs `then`."""
    script.write_text(
        "#!/bin/sh\n"
        f"setsid sh -c 'echo $$ > {pid_file}.new; mv {pid_file}.new {pid_file}; exec sleep 60' &\n"
        f"{then}\n"
    )
    script.chmod(0o755)


def kill_escaped(pid_file: Path) -> None:
    """Kill the escaped child (untracked here: nothing else will), checked by create time."""
    deadline = time.monotonic() + 5.0
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(int(pid_file.read_text())).kill()


def test_a_probe_whose_escaped_child_holds_its_output_ends_at_its_deadline(
    tmp_path: Path,
) -> None:
    """The probe's output is read under its deadline, not until end-of-file: a child that left
    its process group and holds its stdout (nothing tracks it here) does not hold the caller."""
    script, pid_file = tmp_path / "python", tmp_path / "escaped.pid"
    escaping(script, pid_file, "exec sleep 60")
    held: set[int] = set()

    async def go() -> None:
        async with asyncio.timeout(10.0):
            with pytest.raises(ReleaseError, match=r"no answer from its probe within 0\.5 s"):
                await release.probe(str(script), 0.5, hold=held)

    try:
        asyncio.run(go())
    finally:
        kill_escaped(pid_file)
    assert held == set()


def test_a_probe_that_exits_while_its_output_is_held_is_refused(tmp_path: Path) -> None:
    """A probe that answers and exits, leaving a child that holds its stdout: what it printed
    may not be all, so it is refused at the deadline, saying what held it."""
    script, pid_file = tmp_path / "python", tmp_path / "escaped.pid"
    escaping(script, pid_file, "echo '{}'; exit 0")

    async def go() -> None:
        async with asyncio.timeout(10.0):
            with pytest.raises(ReleaseError, match="its probe exited, but what it started still"):
                await release.probe(str(script), 2.0)

    try:
        asyncio.run(go())
    finally:
        kill_escaped(pid_file)


def test_a_probe_that_prints_without_end_is_cut_off(tmp_path: Path) -> None:
    """The supervisor does not buffer a probe's output without bound: past 64 KiB on one
    stream the probe is killed and refused."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexec yes\n")
    script.chmod(0o755)

    async def go() -> None:
        async with asyncio.timeout(10.0):
            with pytest.raises(ReleaseError, match="printed more than 65536 bytes"):
                await release.probe(str(script))

    asyncio.run(go())


def test_a_release_whose_start_fails_is_refused(tmp_path: Path) -> None:
    """`check_start` runs the release's start command the way a re-exec would: a release that
    answers its probe but cannot start is refused, its last stderr line quoted."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = orchestra_sup.release ]; then exec {sys.executable} "$@"; fi\n'
        "echo 'cannot start here' >&2; exit 3\n"
    )
    script.chmod(0o755)
    asyncio.run(release.probe(str(script)))
    with pytest.raises(ReleaseError, match="its start exited 3: cannot start here"):
        asyncio.run(release.check_start(str(script)))
    asyncio.run(release.check_start(sys.executable))


def test_a_rollover_record_pages_its_events_and_wakes_its_pollers() -> None:
    async def go() -> None:
        rollover = Rollover("shard-0", info(1, 1))
        rollover.event("", "begin")
        rollover.event("shard-0", "step", took_s=0.12345)
        assert [e.seq for e in rollover.report().events] == [0, 1]
        assert [e.text for e in rollover.report(after_seq=0).events] == ["step"]
        assert rollover.report().events[1].took_s == 0.123
        poll = asyncio.ensure_future(rollover.wait(after_seq=1, wait_s=5.0))
        await asyncio.sleep(0)
        assert not poll.done()  # nothing new yet: held
        rollover.finish("shard-0: rolled back")
        async with asyncio.timeout(1.0):
            await poll
        report = rollover.report(after_seq=1)
        assert (report.done, report.ok, report.error) == (True, False, "shard-0: rolled back")
        assert report.events == []

    asyncio.run(go())
