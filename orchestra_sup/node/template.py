"""The fork template: a pre-imported, clean interpreter that forks the tree's children.

The supervisor (`supervisor.template.ForkTemplate`) starts it as
`python -m orchestra_sup.node.template CMD_FD REPLY_FD SUPERVISOR_PID`. It imports what a child
needs (pyzmq, msgspec, lmdb, psutil, the node runtime and every role), checks that it is clean,
answers `Ready`, then serves the supervisor's requests from the pipe CMD_FD, one JSON line each
(`Request`), answering each on REPLY_FD, in order (`Reply`; `protocol.forkpipe`):

- `Fork(args)`: if this process is not clean (`problems`), answer `Refused(reason)`. Else fork an
  intermediate process, which forks the child and then holds it: it never reaps it and waits to
  be killed. Answer `Forked(pid)` with the child's pid.
- `Release(pid)`: SIGKILL and reap that child's intermediate, so the child is reparented to the
  supervisor (the nearest child subreaper above it), then write one byte on the child's go pipe.
  Answer `Released(pid)`.

Between `Forked` and `Release` the child's pid cannot be recycled (its parent holds it unreaped)
and it is not yet the supervisor's child: the supervisor opens its pidfd in that window, so no
unknown child ever appears under the supervisor and no exit status is lost. The child blocks on
its go pipe until it is released; if the template dies first, the pipe reaches end-of-file and the
child exits 1 having done nothing (bound no socket, said no `Hello`).

Released, the child is what a fresh `python -m orchestra_sup.node` would be: the leader of its own
process group, no file descriptor but stdin/stdout/stderr, signal dispositions and mask as a
fresh interpreter has them, no thread, no ZeroMQ context, no LMDB environment. It then runs
`node.__main__.run`, which arms `PR_SET_PDEATHSIG` and checks that its parent is the supervisor:
only now, after the reparenting, since the intermediate's exit would fire an earlier one.

Clean means: one thread (a fork copies only the calling one, so a lock another thread holds stays
held forever in the child), and no file descriptor beyond those it had when it declared itself
clean (stdio and its two pipes) and the go pipes of children not yet released. A ZeroMQ context
holds an eventfd from creation to termination, an LMDB environment its lock and data files, so
either shows up as a descriptor. The check runs before every fork.

Exit statuses: 0 when the supervisor closes CMD_FD, 1 when the supervisor is already gone or the
template is not clean after its imports, 2 on a request it cannot decode.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import traceback
from typing import assert_never

import msgspec

from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.forkpipe import (
    Fork,
    Forked,
    Ready,
    Refused,
    Release,
    Released,
    Reply,
    Request,
)
from orchestra_sup.system import descriptors, linux

PRELOADED = (
    "zmq",
    "msgspec",
    "lmdb",
    "psutil",
    "orchestra_sup.node.__main__",
    "orchestra_sup.coordinator.role",
    "orchestra_sup.custodian.role",
    "orchestra_sup.shards.role",
)
"""What a child imports, imported once here so a forked child never imports it again."""

_FRESH_SIGNALS = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGPIPE: signal.SIG_IGN,
    signal.SIGXFSZ: signal.SIG_IGN,
}
"""Dispositions CPython sets at startup; every other signal starts at SIG_DFL."""


class Template:
    """The template's state: its two pipes and the children forked but not yet released.

    `cmd_fd` is read for requests, `reply_fd` written with replies; `clean_fds` are the file
    descriptors it may hold besides go pipes (by default stdio and the two pipes).
    """

    def __init__(self, cmd_fd: int, reply_fd: int):
        self.cmd_fd = cmd_fd
        self.reply_fd = reply_fd
        self.clean_fds = frozenset({0, 1, 2, cmd_fd, reply_fd})
        self.held: dict[int, tuple[int, int]] = {}
        """child pid -> (its intermediate's pid, the write end of its go pipe)."""
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Request)

    # --- cleanliness -----------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """What would make a fork unsafe now, one sentence each (empty: clean)."""
        found: list[str] = []
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            found.append(f"{threads} threads alive (a fork copies only the calling one)")
        allowed = self.clean_fds | {go for _, go in self.held.values()}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in allowed:
                continue
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:
                continue  # the descriptor listdir read the directory through, closed since
            found.append(_describe_fd(fd, target))
        return found

    # --- requests --------------------------------------------------------------------------------

    def handle(self, request: Request) -> Reply:
        """Carry out one request and return its reply (see the module docstring)."""
        match request:
            case Fork(args=args):
                return self.fork(args)
            case Release(pid=pid):
                return self.release(pid)
            case _:
                assert_never(request)

    def fork(self, args: ChildArgs) -> Reply:
        problems = self.problems()
        if problems:
            return Refused(reason="the template is not clean: " + "; ".join(problems))
        pid_r, pid_w = os.pipe()
        go_r, go_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        me = os.getpid()
        try:
            intermediate = os.fork()
        except OSError as exc:
            for fd in (pid_r, pid_w, go_r, go_w):
                os.close(fd)
            return Refused(reason=f"fork failed: {exc}")
        if intermediate == 0:
            _intermediate(me, args, pid_w, go_r)
        os.close(pid_w)
        os.close(go_r)
        data = os.read(pid_r, 32)  # one write of a few bytes is atomic on a pipe
        os.close(pid_r)
        if not data:
            os.waitpid(intermediate, 0)
            os.close(go_w)
            return Refused(reason="the intermediate process could not fork the child")
        pid = int(data)
        self.held[pid] = (intermediate, go_w)
        return Forked(pid=pid)

    def release(self, pid: int) -> Reply:
        entry = self.held.pop(pid, None)
        if entry is None:
            return Refused(reason=f"no child {pid} is held")
        intermediate, go_w = entry
        # Our own unreaped child: its pid cannot have been recycled.
        os.kill(intermediate, signal.SIGKILL)
        # Reaped means it has gone through exit, and its child was reparented on the way.
        os.waitpid(intermediate, 0)
        try:
            os.write(go_w, b"g")
        except BrokenPipeError:
            pass  # the child died while held; the supervisor reaps it through its pidfd
        finally:
            os.close(go_w)
        return Released(pid=pid)

    def drop_held(self) -> None:
        """Kill every intermediate still holding a child; its child then reads end-of-file on
        its go pipe and exits 1."""
        for pid in list(self.held):
            intermediate, go_w = self.held.pop(pid)
            os.kill(intermediate, signal.SIGKILL)
            os.waitpid(intermediate, 0)
            os.close(go_w)

    # --- the loop --------------------------------------------------------------------------------

    def send(self, reply: Reply) -> None:
        data = self._encoder.encode(reply) + b"\n"
        while data:
            data = data[os.write(self.reply_fd, data) :]

    def serve(self) -> int:
        """Answer requests until CMD_FD reaches end-of-file; returns the exit status."""
        buf = b""
        while True:
            chunk = os.read(self.cmd_fd, 65536)
            if not chunk:
                self.drop_held()
                return 0
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    request = self._decoder.decode(line)
                except msgspec.DecodeError as exc:
                    print(f"orchestra-sup template: bad request: {exc}", file=sys.stderr)
                    self.drop_held()
                    return 2
                self.send(self.handle(request))


def _describe_fd(fd: int, target: str) -> str:
    if target == "anon_inode:[eventfd]":
        return f"fd {fd} is an eventfd (a ZeroMQ context holds one)"
    if target.endswith(".mdb"):
        return f"fd {fd} is an LMDB environment's file {target}"
    return f"fd {fd} ({target}) was opened after the template declared itself clean"


def _intermediate(template: int, args: ChildArgs, pid_w: int, go_r: int) -> None:
    """In the intermediate: fork the child, report its pid, hold it until killed."""
    try:
        linux.set_parent_death_signal()  # never outlive the template
        if os.getppid() != template:
            os._exit(1)
        child = os.fork()
        if child == 0:
            _child(args, go_r)
        os.write(pid_w, str(child).encode())
        os.close(pid_w)
        while True:
            signal.pause()  # until the template's SIGKILL (release) or its death
    finally:
        os._exit(1)


def _child(args: ChildArgs, go_r: int) -> None:
    """In the child: become a fresh child process, wait for the release, run the node."""
    code = 1
    try:
        os.setpgid(0, 0)
        # Every descriptor but stdio and the go pipe is one of the template's raw pipes (the
        # cleanliness check ran just before the fork), owned by no Python object here.
        os.dup2(go_r, 3)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                signal.signal(sig, _FRESH_SIGNALS.get(sig, signal.SIG_DFL))
            except (OSError, ValueError):
                continue  # the real-time signals glibc reserves for itself
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        released = os.read(3, 1) == b"g"
        os.close(3)
        if released:
            from orchestra_sup.node.__main__ import run

            code = run(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        # Never return into the template's loop, and run none of its exit handlers.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _warm() -> None:
    """Build once what every child builds first, so a forked child finds it built: msgspec's
    per-type tables behind the frame codec (about 3 ms each time otherwise) and each role's own
    decoders. Side-effect free: the cleanliness check that follows would refuse otherwise."""
    from orchestra_sup.node.roles import make_role
    from orchestra_sup.protocol.codec import Codec

    Codec()
    for role in ("coordinator", "custodian", "shard"):
        make_role(role)


def main() -> int:
    cmd_fd, reply_fd, supervisor_pid = (int(a) for a in sys.argv[1:4])
    linux.set_parent_death_signal()
    descriptors.raise_limit()  # and so every child it forks
    if os.getppid() != supervisor_pid:
        return 1  # orphaned before the death signal was armed
    for module in PRELOADED:
        __import__(module)
    _warm()
    gc.collect()
    gc.freeze()  # children never scan (and so never copy) the objects the imports made
    template = Template(cmd_fd, reply_fd)
    problems = template.problems()
    if problems:
        print(f"orchestra-sup template: not clean after imports: {problems}", file=sys.stderr)
        return 1
    template.send(Ready(pid=os.getpid()))
    return template.serve()


if __name__ == "__main__":
    sys.exit(main())
