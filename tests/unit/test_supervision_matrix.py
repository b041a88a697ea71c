"""The OTP supervision rules of `supervisor.core`, over a fake seam and a fake clock.

Modelled on OTP's `supervisor_SUITE`: the restart decision and the strategies as pure tables, then
a matrix of strategy x restart type x exit kind on a three-child supervisor, an escalation case
for each strategy (root and sub-supervisor), start order and unwind, backoff, operator restarts
and failed restarts. No processes and no sleeps: `FakeSeam` spawns at once, turns SIGTERM and
SIGKILL into exits on the next loop turn and keeps a clock the test moves; tests wait for the
supervisor to be quiescent under an `asyncio.timeout` deadline.

Every expectation below is written out by hand (never computed with `should_restart` or
`victims`), so a change to the rules fails a test instead of moving the expectation with it.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from orchestra_sup.errors import ChildStartError
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.supervisor.core import (
    ExitCause,
    ExitKind,
    Flags,
    Strategy,
    Supervisor,
    Worker,
    classify,
    should_restart,
    victims,
)
from orchestra_sup.supervisor.spec import ChildSpec, ChildState, Restart

TERM = int(signal.SIGTERM)
KILL = int(signal.SIGKILL)
SEGV = int(signal.SIGSEGV)

EXIT_OF: dict[ExitKind, ExitInfo] = {
    ExitKind.NORMAL: ExitInfo(status=0),
    ExitKind.SHUTDOWN: ExitInfo(signal=TERM),
    ExitKind.ABNORMAL: ExitInfo(status=1),
}
"""One exit of each kind, as a process would report it."""

SETTLED = {ChildState.RUNNING, ChildState.STOPPED}
DEADLINE_S = 5.0
"""Guard for a whole scenario; the fake seam makes every scenario finish in milliseconds."""

Event = tuple[str, str, int]
"""("start", name, generation), ("signal", name, signal number), ("set_aside", name,
generation) or ("reinstate", name, generation), in the order they happened."""


# --- the fake seam -------------------------------------------------------------------------------


class FakeSeam:
    """`core.Seam` without processes.

    - `clock()` returns `now`, which only the test (`advance`) and backoff sleeps move.
    - `spawn()` logs ("start", name, generation) and returns at once; when the test armed
      `fail_next_start(name)` it instead reports the exit (status 1) on the next loop turn and
      raises `ChildStartError`, as the real seam does for a child that dies in its handshake.
    - `signal()` logs ("signal", name, sig); SIGKILL, and SIGTERM unless the child is in
      `ignores_sigterm`, make the child exit with that signal on the next loop turn.
    - `sleep()` records the backoff delay, moves the clock by it and returns at once.
    - `changed()` records (name, generation, state).

    An exception raised while delivering an exit is kept in `errors` (a loop callback would only
    log it) and re-raised by `quiesce`.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.log: list[Event] = []
        self.sleeps: list[float] = []
        self.transitions: list[tuple[str, int, ChildState]] = []
        self.ignores_sigterm: set[str] = set()
        self.errors: list[BaseException] = []
        self.pending = 0
        self.progress = asyncio.Event()
        self._fail_starts: dict[str, int] = {}
        self._alive: set[str] = set()
        self._pids = itertools.count(4000)

    # core.Seam

    def clock(self) -> float:
        return self.now

    async def spawn(self, worker: Worker) -> None:
        self.log.append(("start", worker.name, worker.generation))
        if self._fail_starts.get(worker.name, 0) > 0:
            self._fail_starts[worker.name] -= 1
            self._exit_soon(worker, ExitInfo(status=1))
            raise ChildStartError(worker.name, "the test made this start fail")
        worker.pid = next(self._pids)
        self._alive.add(worker.name)

    def signal(self, worker: Worker, sig: int) -> bool:
        self.log.append(("signal", worker.name, int(sig)))
        if worker.name not in self._alive:
            return False
        if sig == KILL or (sig == TERM and worker.name not in self.ignores_sigterm):
            self._alive.discard(worker.name)
            self._exit_soon(worker, ExitInfo(signal=int(sig)))
        return True

    def set_aside(self, worker: Worker) -> None:
        self.log.append(("set_aside", worker.name, worker.generation))

    def reinstate(self, worker: Worker, generation: int) -> None:
        self.log.append(("reinstate", worker.name, generation))

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def changed(self, worker: Worker) -> None:
        self.transitions.append((worker.name, worker.generation, worker.state))
        self.progress.set()

    # test controls

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def fail_next_start(self, name: str, times: int = 1) -> None:
        """Make the next `times` starts of `name` fail."""
        self._fail_starts[name] = self._fail_starts.get(name, 0) + times

    def crash(self, worker: Worker, exit_info: ExitInfo) -> None:
        """`worker`'s running process exits on its own with `exit_info`."""
        assert worker.name in self._alive, f"{worker.name} has no running process to crash"
        self._alive.discard(worker.name)
        worker.on_exit(exit_info)

    def since(self, mark: int) -> list[Event]:
        return self.log[mark:]

    def _exit_soon(self, worker: Worker, exit_info: ExitInfo) -> None:
        self.pending += 1
        asyncio.get_running_loop().call_soon(self._deliver, worker, exit_info)

    def _deliver(self, worker: Worker, exit_info: ExitInfo) -> None:
        self.pending -= 1
        self.progress.set()
        try:
            worker.on_exit(exit_info)
        except Exception as exc:
            self.errors.append(exc)


# --- trees and waiting ---------------------------------------------------------------------------


def supervisors(root: Supervisor) -> Iterator[Supervisor]:
    yield root
    for child in root.children:
        if isinstance(child, Supervisor):
            yield from supervisors(child)


async def quiesce(seam: FakeSeam, root: Supervisor, deadline_s: float = 2.0) -> None:
    """Wait until no supervisor in the tree has a task left, no fake exit is pending and every
    worker is running or stopped; re-raise what a restart task or an exit delivery raised."""
    async with asyncio.timeout(deadline_s):
        while True:
            tasks = {task for sup in supervisors(root) for task in sup._tasks}
            if tasks:
                done, _ = await asyncio.wait(tasks)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                continue
            if seam.errors:
                raise seam.errors[0]
            if seam.pending == 0 and all(w.state in SETTLED for w in root.workers()):
                return
            seam.progress.clear()
            await seam.progress.wait()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run `scenario` on a fresh loop under `DEADLINE_S`."""

    async def guarded() -> None:
        async with asyncio.timeout(DEADLINE_S):
            await scenario()

    asyncio.run(guarded())


@dataclass
class Tree:
    """A root supervisor over workers named by letters, its fake seam and its give-ups."""

    seam: FakeSeam
    sup: Supervisor
    gave_up: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Worker:
        worker = self.sup.find(name)
        assert worker is not None
        return worker

    def states(self) -> dict[str, ChildState]:
        return {w.name: w.state for w in self.sup.workers()}

    def generations(self) -> dict[str, int]:
        return {w.name: w.generation for w in self.sup.workers()}

    async def crash(self, name: str, exit_info: ExitInfo = EXIT_OF[ExitKind.ABNORMAL]) -> None:
        """Crash worker `name` and wait until the supervisor has dealt with it."""
        self.seam.crash(self[name], exit_info)
        await quiesce(self.seam, self.sup)


def workers(
    seam: FakeSeam,
    flags: Flags,
    names: str,
    *,
    restart: dict[str, Restart] | None = None,
    shutdown_s: dict[str, float | None] | None = None,
) -> list[Worker | Supervisor]:
    restart = restart or {}
    shutdown_s = shutdown_s or {}
    return [
        Worker(
            ChildSpec(
                name=name,
                role="shard",
                restart=restart.get(name, Restart.PERMANENT),
                shutdown_s=shutdown_s.get(name, 5.0),
            ),
            flags,
            seam,
        )
        for name in names
    ]


def make_tree(
    strategy: Strategy = Strategy.ONE_FOR_ONE,
    names: str = "abc",
    *,
    max_restarts: int = 5,
    max_seconds: float = 30.0,
    backoff_max_s: float = 5.0,
    restart: dict[str, Restart] | None = None,
    shutdown_s: dict[str, float | None] | None = None,
) -> Tree:
    """A root supervisor over `names` (not started yet)."""
    seam = FakeSeam()
    flags = Flags(
        strategy=strategy,
        max_restarts=max_restarts,
        max_seconds=max_seconds,
        backoff_initial_s=0.1,
        backoff_max_s=backoff_max_s,
    )
    gave_up: list[str] = []
    children = workers(seam, flags, names, restart=restart, shutdown_s=shutdown_s)
    sup = Supervisor("root", flags, children, seam, on_give_up=lambda: gave_up.append("root"))
    return Tree(seam, sup, gave_up)


def starts(*entries: tuple[str, int]) -> list[Event]:
    return [("start", name, gen) for name, gen in entries]


def signals(*entries: tuple[str, int]) -> list[Event]:
    return [("signal", name, sig) for name, sig in entries]


# --- 1. pure tables ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_info", "kind"),
    [
        (ExitInfo(status=0), ExitKind.NORMAL),
        (ExitInfo(signal=TERM), ExitKind.SHUTDOWN),
        (ExitInfo(status=143), ExitKind.SHUTDOWN),
        (ExitInfo(status=1), ExitKind.ABNORMAL),
        (ExitInfo(status=2), ExitKind.ABNORMAL),
        (ExitInfo(signal=KILL), ExitKind.ABNORMAL),
        (ExitInfo(signal=SEGV), ExitKind.ABNORMAL),
    ],
    ids=["status0", "SIGTERM", "status143", "status1", "status2", "SIGKILL", "SIGSEGV"],
)
def test_classify(exit_info: ExitInfo, kind: ExitKind) -> None:
    """classify maps status 0 to normal, SIGTERM/143 to shutdown and anything else to abnormal."""
    assert classify(exit_info) is kind


RESTARTS: dict[tuple[Restart, ExitKind], bool] = {
    (Restart.PERMANENT, ExitKind.NORMAL): True,
    (Restart.PERMANENT, ExitKind.SHUTDOWN): True,
    (Restart.PERMANENT, ExitKind.ABNORMAL): True,
    (Restart.TRANSIENT, ExitKind.NORMAL): False,
    (Restart.TRANSIENT, ExitKind.SHUTDOWN): False,
    (Restart.TRANSIENT, ExitKind.ABNORMAL): True,
    (Restart.TEMPORARY, ExitKind.NORMAL): False,
    (Restart.TEMPORARY, ExitKind.SHUTDOWN): False,
    (Restart.TEMPORARY, ExitKind.ABNORMAL): False,
}
"""OTP's decision, written out: permanent always, transient only abnormal, temporary never."""


def test_restart_table_covers_every_cell() -> None:
    """The hand-written decision table has exactly one row per Restart x ExitKind."""
    assert set(RESTARTS) == set(itertools.product(Restart, ExitKind))


@pytest.mark.parametrize(("restart", "kind"), list(RESTARTS), ids=lambda v: str(v))
def test_should_restart(restart: Restart, kind: ExitKind) -> None:
    """should_restart(restart, kind) is OTP's decision for that cell."""
    assert should_restart(restart, kind) is RESTARTS[(restart, kind)]


VICTIMS: dict[tuple[Strategy, str], str] = {
    (Strategy.ONE_FOR_ONE, "a"): "a",
    (Strategy.ONE_FOR_ONE, "b"): "b",
    (Strategy.ONE_FOR_ONE, "c"): "c",
    (Strategy.ONE_FOR_ALL, "a"): "abc",
    (Strategy.ONE_FOR_ALL, "b"): "abc",
    (Strategy.ONE_FOR_ALL, "c"): "abc",
    (Strategy.REST_FOR_ONE, "a"): "abc",
    (Strategy.REST_FOR_ONE, "b"): "bc",
    (Strategy.REST_FOR_ONE, "c"): "c",
}
"""Which of a, b, c restart (in start order) when the failed child is first, middle or last."""


@pytest.mark.parametrize(("strategy", "failed"), list(VICTIMS), ids=lambda v: str(v))
def test_victims(strategy: Strategy, failed: str) -> None:
    """victims returns, in start order, the children the strategy restarts with the failed one."""
    assert victims(strategy, ["a", "b", "c"], failed) == list(VICTIMS[(strategy, failed)])


# --- 2. the matrix -------------------------------------------------------------------------------

GROUP_OF_B = {Strategy.ONE_FOR_ONE: "b", Strategy.ONE_FOR_ALL: "abc", Strategy.REST_FOR_ONE: "bc"}
"""What restarts with b, by strategy, written out."""


@pytest.mark.parametrize("kind", list(ExitKind), ids=str)
@pytest.mark.parametrize("restart", list(Restart), ids=str)
@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_matrix(strategy: Strategy, restart: Restart, kind: ExitKind) -> None:
    """b's exit stops siblings in reverse and starts its group in order iff OTP restarts it."""
    restarted = RESTARTS[(restart, kind)]
    group = GROUP_OF_B[strategy] if restarted else ""
    tree = make_tree(strategy, restart={"b": restart})

    async def scenario() -> None:
        await tree.sup.start()
        mark = len(tree.seam.log)
        await tree.crash("b", EXIT_OF[kind])
        expected = signals(*((n, TERM) for n in reversed(group) if n != "b"))
        expected += starts(*((n, 2) for n in group))
        assert tree.seam.since(mark) == expected
        assert tree.generations() == {n: 2 if n in group else 1 for n in "abc"}
        assert {n: tree[n].restarts for n in "abc"} == {"a": 0, "b": int(restarted), "c": 0}
        assert tree.states() == {
            "a": ChildState.RUNNING,
            "b": ChildState.RUNNING if restarted else ChildState.STOPPED,
            "c": ChildState.RUNNING,
        }
        assert tree["b"].last_exit == EXIT_OF[kind]
        assert tree.seam.sleeps == []
        assert tree.gave_up == []
        assert tree.sup.running

    run(scenario)


# --- 3. escalation -------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_escalation_when_intensity_exceeded(strategy: Strategy) -> None:
    """A 3rd restart within max_seconds stops all children in reverse and gives up once."""
    tree = make_tree(strategy, max_restarts=2, max_seconds=10.0)

    async def scenario() -> None:
        await tree.sup.start()
        for _ in range(2):
            await tree.crash("b")
            tree.seam.advance(1.0)
        assert tree.gave_up == []
        mark = len(tree.seam.log)
        await tree.crash("b")
        # b is already down: only its siblings get signalled, c before a.
        assert tree.seam.since(mark) == signals(("c", TERM), ("a", TERM))
        assert tree.gave_up == ["root"]
        assert tree.sup.escalated
        assert not tree.sup.running
        assert set(tree.states().values()) == {ChildState.STOPPED}
        assert tree["b"].restarts == 2

    run(scenario)


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_restarts_sliding_out_of_the_window_never_escalate(strategy: Strategy) -> None:
    """Restarts 6 s apart slide out of a 10 s window: max_restarts=2 is never exceeded."""
    tree = make_tree(strategy, max_restarts=2, max_seconds=10.0)

    async def scenario() -> None:
        await tree.sup.start()
        for _ in range(8):
            await tree.crash("b")
            tree.seam.advance(6.0)
        assert tree.gave_up == []
        assert not tree.sup.escalated
        assert tree["b"].restarts == 8
        assert tree["b"].generation == 9
        assert set(tree.states().values()) == {ChildState.RUNNING}

    run(scenario)


ROOT_GROUP = {
    Strategy.ONE_FOR_ONE: ["sub"],
    Strategy.ONE_FOR_ALL: ["x", "sub", "y"],
    Strategy.REST_FOR_ONE: ["sub", "y"],
}
"""What the root [x, sub, y] restarts with the sub-supervisor, by its strategy, written out."""


@pytest.mark.parametrize("sub_strategy", list(Strategy), ids=lambda s: f"sub-{s}")
@pytest.mark.parametrize("root_strategy", list(Strategy), ids=lambda s: f"root-{s}")
def test_sub_supervisor_escalates_to_its_parent(
    root_strategy: Strategy, sub_strategy: Strategy
) -> None:
    """A sub-supervisor over its intensity is restarted by its parent, once; twice gives up."""
    seam = FakeSeam()
    sub_flags = Flags(strategy=sub_strategy, max_restarts=2, max_seconds=10.0)
    root_flags = Flags(strategy=root_strategy, max_restarts=1, max_seconds=10.0)
    sub = Supervisor("sub", sub_flags, workers(seam, sub_flags, "abc"), seam)
    x, y = workers(seam, root_flags, "xy")
    gave_up: list[str] = []
    root = Supervisor(
        "root", root_flags, [x, sub, y], seam, on_give_up=lambda: gave_up.append("root")
    )
    tree = Tree(seam, root, gave_up)

    async def escalate_sub() -> tuple[int, dict[str, int]]:
        """Three crashes of the sub's b, 1 s apart; returns the log mark and the generations
        before the third."""
        for _ in range(2):
            await tree.crash("b")
            seam.advance(1.0)
        assert not sub.escalated
        mark, before = len(seam.log), tree.generations()
        await tree.crash("b")
        return mark, before

    async def scenario() -> None:
        await root.start()
        assert seam.log == starts(("x", 1), ("a", 1), ("b", 1), ("c", 1), ("y", 1))
        mark, before = await escalate_sub()
        group = ROOT_GROUP[root_strategy]
        expected = signals(("c", TERM), ("a", TERM))  # the sub gives up, in reverse
        expected += signals(*((n, TERM) for n in reversed(group) if n != "sub"))
        members = [m for n in group for m in ("abc" if n == "sub" else n)]
        expected += starts(*((m, before[m] + 1) for m in members))
        assert seam.since(mark) == expected
        # With the root's max_restarts=1, surviving this escalation and giving up on the next
        # pins that each escalation counts exactly one restart in the root (the sub's own
        # worker restarts count none there).
        assert gave_up == []
        assert not root.escalated
        assert sub.running and not sub.escalated
        assert set(tree.states().values()) == {ChildState.RUNNING}

        seam.advance(1.0)
        mark, _ = await escalate_sub()
        assert gave_up == ["root"]
        assert root.escalated and not root.running
        assert set(tree.states().values()) == {ChildState.STOPPED}
        assert seam.since(mark) == signals(("c", TERM), ("a", TERM), ("y", TERM), ("x", TERM))

    run(scenario)


# --- 4. start order, unwind, stop ----------------------------------------------------------------


def test_start_in_order() -> None:
    """start() starts a, b, c in order, generation 1, and leaves them running."""
    tree = make_tree()

    async def scenario() -> None:
        await tree.sup.start()
        assert tree.seam.log == starts(("a", 1), ("b", 1), ("c", 1))
        assert set(tree.states().values()) == {ChildState.RUNNING}
        assert tree.sup.running
        transitions = [(n, s) for n, _, s in tree.seam.transitions]
        assert transitions == [
            (n, s) for n in "abc" for s in (ChildState.STARTING, ChildState.RUNNING)
        ]

    run(scenario)


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_failed_start_unwinds_in_reverse(strategy: Strategy) -> None:
    """c failing to start stops b then a, raises ChildStartError and restarts nothing."""
    tree = make_tree(strategy)
    tree.seam.fail_next_start("c")

    async def scenario() -> None:
        with pytest.raises(ChildStartError) as raised:
            await tree.sup.start()
        assert raised.value.name == "c"
        await quiesce(tree.seam, tree.sup)
        assert tree.seam.log == starts(("a", 1), ("b", 1), ("c", 1)) + signals(
            ("b", TERM), ("a", TERM)
        )
        assert set(tree.states().values()) == {ChildState.STOPPED}
        assert not tree.sup.running
        assert [tree[n].restarts for n in "abc"] == [0, 0, 0]
        assert tree.seam.sleeps == []
        assert tree.gave_up == []

    run(scenario)


def test_stop_in_reverse_order() -> None:
    """stop() sends SIGTERM to c, b, a in that order, reaps each, restarts none."""
    tree = make_tree()

    async def scenario() -> None:
        await tree.sup.start()
        mark = len(tree.seam.log)
        await tree.sup.stop()
        await quiesce(tree.seam, tree.sup)
        assert tree.seam.since(mark) == signals(("c", TERM), ("b", TERM), ("a", TERM))
        assert set(tree.states().values()) == {ChildState.STOPPED}
        assert all(tree[n].last_exit == ExitInfo(signal=TERM) for n in "abc")
        assert [tree[n].restarts for n in "abc"] == [0, 0, 0]
        assert not tree.sup.running

    run(scenario)


def test_brutal_kill() -> None:
    """A child with shutdown_s=None (brutal_kill) gets SIGKILL at once and no SIGTERM."""
    tree = make_tree(shutdown_s={"b": None})

    async def scenario() -> None:
        await tree.sup.start()
        mark = len(tree.seam.log)
        await tree.sup.stop()
        assert tree.seam.since(mark) == signals(("c", TERM), ("b", KILL), ("a", TERM))
        assert tree["b"].last_exit == ExitInfo(signal=KILL)
        assert tree["b"].state is ChildState.STOPPED

    run(scenario)


def test_sigterm_ignored_then_killed_after_grace() -> None:
    """A child that ignores SIGTERM gets SIGKILL once its shutdown_s grace has passed."""
    grace = 0.05
    tree = make_tree(shutdown_s={"b": grace})
    tree.seam.ignores_sigterm.add("b")

    async def scenario() -> None:
        await tree.sup.start()
        loop = asyncio.get_running_loop()
        mark, began = len(tree.seam.log), loop.time()
        await tree["b"].stop()
        waited = loop.time() - began
        assert tree.seam.since(mark) == signals(("b", TERM), ("b", KILL))
        assert tree["b"].last_exit == ExitInfo(signal=KILL)
        assert tree["b"].state is ChildState.STOPPED
        assert waited >= grace * 0.9
        assert tree.states() == {
            "a": ChildState.RUNNING,
            "b": ChildState.STOPPED,
            "c": ChildState.RUNNING,
        }

    run(scenario)


# --- 5. backoff ----------------------------------------------------------------------------------


def test_first_restart_is_immediate() -> None:
    """The first restart of a child asks for no sleep and never enters backoff."""
    tree = make_tree()

    async def scenario() -> None:
        await tree.sup.start()
        await tree.crash("b")
        assert tree.seam.sleeps == []
        assert ChildState.BACKOFF not in {s for _, _, s in tree.seam.transitions}
        assert tree["b"].generation == 2

    run(scenario)


def test_repeated_restarts_back_off_doubling_to_the_cap() -> None:
    """Repeated restarts back off 0.1, 0.2, 0.4 s ... capped at backoff_max_s, via BACKOFF."""
    tree = make_tree(max_restarts=100, max_seconds=10.0, backoff_max_s=0.5)

    async def scenario() -> None:
        await tree.sup.start()
        for _ in range(6):
            await tree.crash("b")
        assert tree.seam.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
        backoffs = [gen for n, gen, s in tree.seam.transitions if s is ChildState.BACKOFF]
        assert backoffs == [2, 3, 4, 5, 6]  # entered after generations 2..6 exited
        assert tree["b"].generation == 7
        assert tree.gave_up == []

    run(scenario)


def test_backoff_resets_after_staying_up_max_seconds() -> None:
    """After max_seconds up the next restart is immediate and the one after waits 0.1 s."""
    tree = make_tree(max_restarts=100, max_seconds=10.0)

    async def scenario() -> None:
        await tree.sup.start()
        for _ in range(3):
            await tree.crash("b")
        assert tree.seam.sleeps == pytest.approx([0.1, 0.2])
        tree.seam.advance(10.0)
        await tree.crash("b")
        assert tree.seam.sleeps == pytest.approx([0.1, 0.2])
        await tree.crash("b")
        assert tree.seam.sleeps == pytest.approx([0.1, 0.2, 0.1])

    run(scenario)


# --- 6. operator restarts ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_operator_restart_is_not_a_failure(strategy: Strategy) -> None:
    """restart_worker bumps one worker, counts operator_restarts only, no backoff, no intensity."""
    tree = make_tree(strategy, max_restarts=2, max_seconds=10.0)

    async def scenario() -> None:
        await tree.sup.start()
        b = tree["b"]
        for gen in range(2, 2 + 5):
            mark = len(tree.seam.log)
            await tree.sup.restart_worker(b)
            await quiesce(tree.seam, tree.sup)
            assert tree.seam.since(mark) == signals(("b", TERM)) + starts(("b", gen))
        assert b.operator_restarts == 5
        assert b.restarts == 0
        assert tree.seam.sleeps == []
        assert tree.generations() == {"a": 1, "b": 6, "c": 1}
        assert tree.gave_up == []
        assert not tree.sup.escalated
        # The whole intensity budget is still there: two crashes are restarted.
        for _ in range(2):
            await tree.crash("b")
        assert tree.gave_up == []
        assert b.restarts == 2
        assert set(tree.states().values()) == {ChildState.RUNNING}

    run(scenario)


# --- 7. failed restarts --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_failed_restart_is_counted_and_retried_through_child_exited(strategy: Strategy) -> None:
    """Each failed restart goes back through child_exited; the (max_restarts+1)th escalates."""
    tree = make_tree(strategy, max_restarts=3, max_seconds=10.0)
    sup = tree.sup
    exits: list[tuple[str, ExitKind]] = []
    records: list[bool] = []

    async def scenario() -> None:
        await sup.start()
        child_exited, record = sup.child_exited, sup.intensity.record

        def spy_exit(child: Worker | Supervisor, kind: ExitKind) -> None:
            exits.append((child.name, kind))
            child_exited(child, kind)

        def spy_record() -> bool:
            records.append(record())
            return records[-1]

        sup.child_exited = spy_exit  # type: ignore[method-assign]
        sup.intensity.record = spy_record  # type: ignore[method-assign]
        tree.seam.fail_next_start("b", times=1000)
        await tree.crash("b")

        assert [e for e in tree.seam.log if e[:2] == ("start", "b")] == starts(
            ("b", 1), ("b", 2), ("b", 3), ("b", 4)
        )
        assert exits == [("b", ExitKind.ABNORMAL)] * 4  # the crash, then each failed start
        assert records == [True, True, True, False]
        assert tree["b"].restarts == 3
        assert tree.gave_up == ["root"]
        assert set(tree.states().values()) == {ChildState.STOPPED}

    run(scenario)


# --- regressions: defects the matrix found in core.py, fixed with these tests ------------------


def test_no_restart_after_first_child_fails_to_start() -> None:
    """When the first child fails to start, start() raises and nothing is ever restarted."""
    tree = make_tree()
    tree.seam.fail_next_start("a")

    async def scenario() -> None:
        with pytest.raises(ChildStartError):
            await tree.sup.start()
        await quiesce(tree.seam, tree.sup)
        assert tree.seam.log == starts(("a", 1))
        assert set(tree.states().values()) == {ChildState.STOPPED}

    run(scenario)


def test_failed_restart_of_a_sub_supervisor_is_retried() -> None:
    """A sub-supervisor whose restart fails is retried by its parent, like a failed worker."""
    seam = FakeSeam()
    flags = Flags(max_restarts=2, max_seconds=10.0)
    sub = Supervisor("sub", flags, workers(seam, flags, "abc"), seam)
    gave_up: list[str] = []
    root = Supervisor("root", flags, [sub], seam, on_give_up=lambda: gave_up.append("root"))
    tree = Tree(seam, root, gave_up)

    async def scenario() -> None:
        await root.start()
        for _ in range(2):
            await tree.crash("b")
        seam.fail_next_start("c")  # the parent's first restart of sub fails on c
        mark = len(seam.log)
        await tree.crash("b")
        c_starts = [gen for what, name, gen in seam.since(mark) if (what, name) == ("start", "c")]
        assert len(c_starts) == 2  # the failed restart of sub, then the retry
        assert gave_up == []
        assert sub.running
        assert set(tree.states().values()) == {ChildState.RUNNING}

    run(scenario)


def test_two_exits_before_a_group_restart() -> None:
    """b and c exiting in one loop turn under one_for_all end with every child running."""
    tree = make_tree(Strategy.ONE_FOR_ALL)

    async def scenario() -> None:
        await tree.sup.start()
        tree.seam.crash(tree["b"], EXIT_OF[ExitKind.ABNORMAL])
        tree.seam.crash(tree["c"], EXIT_OF[ExitKind.ABNORMAL])
        await quiesce(tree.seam, tree.sup)
        assert set(tree.states().values()) == {ChildState.RUNNING}

    run(scenario)


def test_operator_restart_right_after_a_crash() -> None:
    """An operator restart that beats a queued crash restart leaves the worker running."""
    tree = make_tree()

    async def scenario() -> None:
        await tree.sup.start()
        tree.seam.crash(tree["b"], EXIT_OF[ExitKind.ABNORMAL])
        await tree.sup.restart_worker(tree["b"])
        await quiesce(tree.seam, tree.sup)
        assert tree["b"].state is ChildState.RUNNING

    run(scenario)


def test_temporary_sibling_is_stopped_not_restarted() -> None:
    """Under one_for_all a temporary sibling of the failed child is stopped and not restarted."""
    tree = make_tree(Strategy.ONE_FOR_ALL, restart={"a": Restart.TEMPORARY})

    async def scenario() -> None:
        await tree.sup.start()
        mark = len(tree.seam.log)
        await tree.crash("b")
        assert tree.seam.since(mark) == signals(("c", TERM), ("a", TERM)) + starts(
            ("b", 2), ("c", 2)
        )
        assert tree["a"].state is ChildState.STOPPED

    run(scenario)


# --- 8. surges (a shard's rollover) ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_a_surge_starts_the_next_generation_beside_and_restarts_nothing(
    strategy: Strategy,
) -> None:
    """start_beside sets the running process aside, starts generation + 1 and returns the old
    generation, which stays `retiring` until `retired()`; no sibling moves, nothing counts."""
    tree = make_tree(strategy)

    async def scenario() -> None:
        await tree.sup.start()
        b = tree["b"]
        mark = len(tree.seam.log)
        assert await b.start_beside() == 1
        assert tree.seam.since(mark) == [("set_aside", "b", 1), *starts(("b", 2))]
        assert (b.state, b.generation, b.retiring) == (ChildState.RUNNING, 2, 1)
        b.retired()
        assert b.retiring is None
        await quiesce(tree.seam, tree.sup)
        assert tree.generations() == {"a": 1, "b": 2, "c": 1}
        assert (b.restarts, b.operator_restarts, len(tree.sup.intensity._times)) == (0, 0, 0)

    run(scenario)


@pytest.mark.parametrize("strategy", list(Strategy), ids=str)
def test_a_surge_whose_new_generation_fails_puts_the_old_one_back(strategy: Strategy) -> None:
    """The new process dies in its handshake: the set-aside one is the worker's again, with its
    generation, pid and exit record; the failure is not an exit of the worker, so nothing is
    restarted (under every strategy) and the old process is supervised as before."""
    tree = make_tree(strategy)

    async def scenario() -> None:
        await tree.sup.start()
        b = tree["b"]
        pid = b.pid
        tree.seam.fail_next_start("b")
        mark = len(tree.seam.log)
        with pytest.raises(ChildStartError):
            await b.start_beside()
        await quiesce(tree.seam, tree.sup)
        assert tree.seam.since(mark) == [
            ("set_aside", "b", 1),
            *starts(("b", 2)),
            *signals(("b", 0)),
            ("reinstate", "b", 1),
        ]
        assert (b.state, b.generation, b.pid, b.retiring) == (ChildState.RUNNING, 1, pid, None)
        assert (b.last_exit, b.restarts) == (None, 0)
        assert tree.generations() == {"a": 1, "b": 1, "c": 1}
        await tree.crash("b")  # still b's process: its exit is handled as any
        assert b.generation == 2 and b.restarts == 1

    run(scenario)


def test_lease_kills_count_toward_no_intensity_and_wait_no_backoff() -> None:
    """A host's agent SIGKILLs its shards when its etcd lease is lost (`ExitCause.LEASE`):
    six such kills in a row, past max_restarts = 2, escalate nothing and sleep no backoff,
    so one etcd outage does not stop a host with more shards than the intensity allows. The
    mutation of recording them in the intensity escalates at the third, and this fails."""
    tree = make_tree(max_restarts=2, max_seconds=10.0)

    async def scenario() -> None:
        await tree.sup.start()
        for _ in range(6):
            tree["b"].killed_for = ExitCause.LEASE
            await tree.crash("b", EXIT_OF[ExitKind.ABNORMAL])
        assert tree.gave_up == [] and tree.sup.running
        assert tree.seam.sleeps == []
        assert tree["b"].generation == 7 and tree["b"].exits[ExitCause.LEASE] == 6

    run(scenario)
