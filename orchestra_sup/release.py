"""Releases: which code a process runs, and whether two of them can work together.

A release is a Python interpreter with orchestra-sup installed, named by the path of its
executable (a virtualenv's `bin/python`, or a wrapper script that execs one). The supervisor
starts each child as `RELEASE -m orchestra_sup.node ...`, and before it moves anything onto a
release it asks the release about itself: `RELEASE -m orchestra_sup.release` prints one JSON
`ReleaseInfo` (interpreter, version, protocol range) after importing every module a child or a
supervisor needs, so a release that cannot even import is refused before anything stops.

Two test-only overrides re-label a release without building a second one (ARCHITECTURE.md §9,
issue 7): `ORCHESTRA_SUP_TEST_VERSION` replaces the version it reports and
`ORCHESTRA_SUP_TEST_PROTOCOL` ("MIN..MAX") the protocol range it reports in its probe and its
handshakes. A wrapper script that sets them and execs the real interpreter is a second release.
They are taken out of the environment when this module is imported: they label the process the
wrapper started, not the children it starts on other releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Protocol

import msgspec

from orchestra_sup.errors import OrchestraError, ReleaseError
from orchestra_sup.protocol.frames import ReleaseInfo
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN

SPAWNING = 0
"""In a `hold` set while a helper is being spawned, before its pid is known (asyncio awaits
between the fork and returning the process, and a helper that exits at once can be gone by
then): a supervisor must neither reap nor kill children it does not know meanwhile."""
PROBE_TIMEOUT_S = 30.0
"""Seconds a release has to answer its probe (a cold interpreter importing every module), unless
the caller says otherwise (a rollover: `[supervisor] probe_timeout_s`, the same by default)."""
OUTPUT_MAX_BYTES = 64 * 1024
"""The most a probe may print on each of stdout and stderr; more, and it is killed and refused
(a release must not make the supervisor buffer without bound)."""
PROBE_MODULES = (
    "orchestra_sup.runtime.node",
    "orchestra_sup.node.template",
    "orchestra_sup.coordinator.role",
    "orchestra_sup.custodian.role",
    "orchestra_sup.shards.role",
    "orchestra_sup.supervisor.root",
    "orchestra_sup.cli.app",
)


try:
    INSTALLED_VERSION = metadata.version("orchestra-sup")
    """The installed distribution's version (pyproject.toml's, for an editable install); the
    package's `orchestra_sup.__version__`."""
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    INSTALLED_VERSION = "0+unknown"

_TEST_VERSION = os.environ.pop("ORCHESTRA_SUP_TEST_VERSION", None)
_TEST_PROTOCOL = os.environ.pop("ORCHESTRA_SUP_TEST_PROTOCOL", None)


def version() -> str:
    """This process's orchestra-sup version (`ORCHESTRA_SUP_TEST_VERSION` when set)."""
    return _TEST_VERSION or INSTALLED_VERSION


def protocol_range() -> tuple[int, int]:
    """The protocol versions this process speaks, (min, max), both inclusive
    (`ORCHESTRA_SUP_TEST_PROTOCOL` "MIN..MAX" when set; raises `ReleaseError` when it is not
    of that form)."""
    text = _TEST_PROTOCOL
    if not text:
        return PROTOCOL_MIN, PROTOCOL_MAX
    low, sep, high = text.partition("..")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise ReleaseError(
            f"ORCHESTRA_SUP_TEST_PROTOCOL={text!r} is not MIN..MAX (for example 1..2)"
        ) from None


def describe(python: str | None = None) -> ReleaseInfo:
    """This process as a release; `python` names its interpreter (default `sys.executable`)."""
    low, high = protocol_range()
    return ReleaseInfo(
        python=python or sys.executable, version=version(), proto_min=low, proto_max=high
    )


def compatible_with(info: ReleaseInfo) -> bool:
    """True when release `info` and this process share a protocol version."""
    low, high = protocol_range()
    return info.proto_min <= high and info.proto_max >= low


def skew(name: str, version_said: str, proto_min: int, proto_max: int) -> str | None:
    """None when a peer `name` speaking protocol `proto_min..proto_max` (its `Hello`) shares a
    version with this process; else the one line that refuses it, naming both versions."""
    low, high = protocol_range()
    if proto_min <= high and proto_max >= low:
        return None
    return (
        f"{name} (orchestra-sup {version_said or 'unknown'}) speaks protocol "
        f"{proto_min}..{proto_max}, the supervisor (orchestra-sup {version()}) {low}..{high}"
    )


def refusal(info: ReleaseInfo) -> str:
    """The one line that refuses an incompatible release, naming both versions."""
    low, high = protocol_range()
    return (
        f"release {info.python} (orchestra-sup {info.version}, protocol "
        f"{info.proto_min}..{info.proto_max}) cannot work with this tree (orchestra-sup "
        f"{version()}, protocol {low}..{high})"
    )


class Tracker(Protocol):
    """What holds on to every process a helper starts, whatever it does with sessions, groups
    or parents: a `setsid` grandchild leaves the helper's process group, so killing the group
    misses it (the supervisor's: `supervisor.helper_cgroup.HelperCgroup`, a cgroup v2 of the
    helper's own)."""

    def preexec(self) -> Callable[[], None] | None:
        """A function the helper runs between fork and exec (None: none)."""
        ...

    async def kill(self) -> None:
        """Kill whatever the helper started that still runs, wait until it is gone, and let go
        of what tracked it: at the helper's deadline, and again once it is done (answered or
        not), when a second call finds nothing. Never raises."""
        ...


async def probe(
    python: str,
    timeout_s: float = PROBE_TIMEOUT_S,
    *,
    hold: set[int] | None = None,
    tracker: Tracker | None = None,
) -> ReleaseInfo:
    """Ask the release at `python` about itself: run `python -m orchestra_sup.release` with
    this process's environment and decode what it prints. While it runs its pid is in `hold`:
    a supervisor's orphan reaper and killer leave the pids there alone (the probe is a child of
    the supervisor that asyncio, not the reaper, must wait for). With a `tracker`, everything
    the probe started is killed once it is done, answered or not; without one, only its process
    group, at the deadline, if the probe itself has not exited by then.

    Its output is read under the same deadline, which does not wait for a pipe's end-of-file:
    a process the probe left holding its stdout or stderr delays nothing.

    Raises `ReleaseError` (one line) when `python` is not an executable file, the probe exits
    non-zero (its last stderr line is quoted), prints something that is not a `ReleaseInfo`,
    prints more than `OUTPUT_MAX_BYTES` on a stream, or has not both exited and closed its
    output (every process holding it included) within `timeout_s` seconds (it is then killed,
    with whatever it started).
    """
    out = await _run(python, ["-m", "orchestra_sup.release"], "its probe", timeout_s, hold, tracker)
    if not out.strip():
        raise ReleaseError(f"release {python}: its probe printed nothing")
    try:
        info = msgspec.json.decode(out, type=ReleaseInfo)
    except msgspec.DecodeError as exc:
        raise ReleaseError(f"release {python}: its probe answered nonsense: {exc}") from None
    return msgspec.structs.replace(info, python=python)


async def check_start(
    python: str,
    timeout_s: float = PROBE_TIMEOUT_S,
    *,
    hold: set[int] | None = None,
    tracker: Tracker | None = None,
) -> None:
    """Check that the release at `python` runs the supervisor's own start command
    (`python -m orchestra_sup start --preflight`, which imports what `start` needs and exits
    0): a supervisor re-executes itself onto a release only after this, because once it has
    exec'd there is no old image to roll back to. `hold` and `tracker` are as for `probe`.

    Raises `ReleaseError` (one line) as `probe` does when the check does not exit 0 in time.
    """
    await _run(
        python,
        ["-m", "orchestra_sup", "start", "--preflight"],
        "its start",
        timeout_s,
        hold,
        tracker,
    )


async def _run(
    python: str,
    args: list[str],
    what: str,
    timeout_s: float,
    hold: set[int] | None,
    tracker: Tracker | None,
) -> bytes:
    """Run `python *args` in a process group of its own (and in `tracker`); its stdout.
    Raises `ReleaseError` when it cannot run, exits non-zero, prints too much, or has not exited
    and closed its output within `timeout_s` seconds. Its pipes are this function's own, read
    under the deadline and closed at it, so no process holding their other end (a `setsid`
    grandchild) holds the caller: asyncio's own pipes would make `wait()` wait for them."""
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise ReleaseError(f"release {python}: not an executable file")
    try:
        return await _tracked(python, args, what, timeout_s, hold, tracker)
    finally:
        if tracker is not None:
            await tracker.kill()


async def _tracked(
    python: str,
    args: list[str],
    what: str,
    timeout_s: float,
    hold: set[int] | None,
    tracker: Tracker | None,
) -> bytes:
    pipes = [os.pipe2(os.O_CLOEXEC) for _stream in ("stdout", "stderr")]
    reads = [read for read, _write in pipes]
    try:
        if hold is not None:
            hold.add(SPAWNING)
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=pipes[0][1],
                stderr=pipes[1][1],
                process_group=0,
                preexec_fn=tracker.preexec() if tracker is not None else None,
            )
        except OSError as exc:
            raise ReleaseError(f"release {python}: cannot run it: {exc}") from exc
        finally:
            for _read, write in pipes:
                os.close(write)
            if hold is not None:
                hold.discard(SPAWNING)
        if hold is not None:
            hold.add(proc.pid)
        try:
            return await _answer(proc, reads, python, what, timeout_s, tracker)
        finally:
            if hold is not None:
                hold.discard(proc.pid)
    finally:
        for read in reads:
            os.close(read)


async def _answer(
    proc: asyncio.subprocess.Process,
    reads: list[int],
    python: str,
    what: str,
    timeout_s: float,
    tracker: Tracker | None,
) -> bytes:
    """Read `proc`'s output from `reads` (stdout, stderr) and wait for it, under the deadline;
    at the deadline, or past the output cap, kill it (its group, then `tracker`'s content)."""
    readers = [asyncio.ensure_future(_capped(fd)) for fd in reads]
    failure: BaseException | None = None
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await asyncio.gather(*readers)
            await proc.wait()
    except (TimeoutError, _TooMuch) as exc:
        failure = exc
    finally:
        exited = proc.returncode is not None
        if not exited:  # not waited for, so its pid still names its group: never recycled
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if failure is not None and tracker is not None:
            await tracker.kill()  # now, not after the wait: the escaped go with the group
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await proc.wait()  # no pipe of asyncio's: this waits for the exit alone
    if isinstance(failure, _TooMuch):
        raise ReleaseError(f"release {python}: {what} printed more than {OUTPUT_MAX_BYTES} bytes")
    if failure is not None and exited:
        raise ReleaseError(
            f"release {python}: {what} exited, but what it started still held its output "
            f"{timeout_s:g} s after it began"
        )
    if failure is not None:
        raise ReleaseError(f"release {python}: no answer from {what} within {timeout_s:g} s")
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        last = lines[-1] if lines else "no output"
        raise ReleaseError(f"release {python}: {what} exited {proc.returncode}: {last}")
    return out


class _TooMuch(OrchestraError):
    """A probe printed more than `OUTPUT_MAX_BYTES` on one stream."""


async def _capped(fd: int) -> bytes:
    """Everything the pipe at `fd` gives until end-of-file (read as the loop finds it
    readable); raises `_TooMuch` past the cap. Cancelling it leaves `fd` open and unwatched."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    data = bytearray()
    try:
        while True:
            await readable.wait()
            readable.clear()
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return bytes(data)
            data += chunk
            if len(data) > OUTPUT_MAX_BYTES:
                raise _TooMuch
    finally:
        loop.remove_reader(fd)


def main() -> int:
    """The probe: import what a child and a supervisor need, then print this release."""
    try:
        for module in PROBE_MODULES:
            importlib.import_module(module)
        info = describe()
    except ReleaseError as exc:
        print(f"orchestra-sup release: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(msgspec.json.encode(info).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
