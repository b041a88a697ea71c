"""Children added to and removed from a running supervisor, and flags changed in place
(`Supervisor.add_child`, `remove_child`, `reconfigure`: what a config reload does to the tree),
over the fake seam and clock of the supervision matrix."""

from __future__ import annotations

from orchestra_sup.supervisor.core import Flags, Worker
from orchestra_sup.supervisor.spec import ChildSpec, ChildState
from tests.unit.test_supervision_matrix import (
    EXIT_OF,
    TERM,
    ExitKind,
    make_tree,
    quiesce,
    run,
    signals,
    starts,
)


def test_an_added_child_starts_and_is_supervised_like_the_others() -> None:
    """add_child appends and starts the worker (its generation goes on from the one given);
    a crash of it is then restarted; the others are untouched."""
    tree = make_tree(names="ab")

    async def scenario() -> None:
        await tree.sup.start()
        d = Worker(ChildSpec(name="d", role="shard"), tree.sup.flags, tree.seam)
        d.generation = 4  # a shard added again goes on from its last generation
        mark = len(tree.seam.log)
        await tree.sup.add_child(d)
        assert tree.seam.since(mark) == starts(("d", 5))
        assert [c.name for c in tree.sup.children] == ["a", "b", "d"]
        assert d.parent is tree.sup
        await tree.crash("d")
        assert tree.generations() == {"a": 1, "b": 1, "d": 6}
        assert d.restarts == 1
        assert set(tree.states().values()) == {ChildState.RUNNING}

    run(scenario)


def test_a_removed_child_is_stopped_and_gone_and_never_restarted() -> None:
    """remove_child stops the worker (SIGTERM) and takes it out; a leaving worker that
    crashes before it is removed is not restarted."""
    tree = make_tree(names="abc")

    async def scenario() -> None:
        await tree.sup.start()
        c = tree["c"]
        mark = len(tree.seam.log)
        await tree.sup.remove_child(c)
        await quiesce(tree.seam, tree.sup)
        assert tree.seam.since(mark) == signals(("c", TERM))
        assert [w.name for w in tree.sup.workers()] == ["a", "b"]
        assert c.state is ChildState.STOPPED and c.parent is None

        b = tree["b"]
        b.leaving = True  # marked for retirement, still running
        mark = len(tree.seam.log)
        await tree.crash("b")
        assert tree.seam.since(mark) == []  # no restart
        assert b.state is ChildState.STOPPED
        assert b.restarts == 0

    run(scenario)


def test_reconfigure_keeps_the_restarts_already_counted() -> None:
    """New flags take effect at once and the intensity window keeps what it counted: two
    crashes under max_restarts 5, then max_restarts 2, and the third crash escalates."""
    tree = make_tree(names="ab", max_restarts=5, max_seconds=30.0)

    async def scenario() -> None:
        await tree.sup.start()
        for _ in range(2):
            await tree.crash("a")
        tree.sup.reconfigure(Flags(max_restarts=2, max_seconds=30.0, backoff_max_s=1.0))
        assert tree["a"].backoff.max_s == 1.0
        assert tree.gave_up == []
        tree.seam.crash(tree["a"], EXIT_OF[ExitKind.ABNORMAL])
        await quiesce(tree.seam, tree.sup)
        assert tree.gave_up == ["root"]

    run(scenario)
