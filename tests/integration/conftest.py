"""Fixtures for integration tests: a subreaping test process, a git repo, real trees, a real
three-member etcd cluster."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from orchestra_sup.system import linux
from tests.integration.etcd_cluster import EtcdCluster
from tests.integration.harness import Tree, leftovers, make_repo, reap_zombies
from tests.integration.hostagent import Agent


@pytest.fixture(scope="session", autouse=True)
def subreaper() -> None:
    linux.set_child_subreaper()


@pytest.fixture(scope="session", autouse=True)
def interruptible() -> None:
    """SIGINT and SIGQUIT as an interactive shell leaves them. A shell without job control
    starts a background command (`make test &`, some CI runners) with both ignored, and every
    process the tests start would inherit that: a Ctrl-C test's SIGINT would be ignored, and a
    child's signal set would differ from a fresh interpreter's for a reason outside the tree."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "ws")


@pytest.fixture
def tree_factory(tmp_path: Path) -> Iterator[Callable[..., Tree]]:
    trees: list[Tree] = []

    def make(
        workspace: Path | None = None,
        shards: int | None = 2,
        lanes: int | None = 8,
        config: Path | None = None,
        extra_env: dict[str, str] | None = None,
        base: Path | None = None,
        run_dir: Path | None = None,
        extra_args: list[str] | None = None,
        cwd: Path | None = None,
        state_dir: Path | None = None,
    ) -> Tree:
        tree = Tree(
            base or tmp_path,
            workspace,
            shards,
            lanes,
            config,
            extra_env,
            run_dir,
            extra_args,
            cwd=cwd,
            state_dir=state_dir,
        )
        trees.append(tree)
        return tree

    yield make
    for tree in trees:
        tree.cleanup()
    for proc in leftovers():
        with contextlib.suppress(psutil.Error):  # it may exit between the listing and the kill
            proc.kill()
    reap_zombies()


@pytest.fixture
def tree(tree_factory: Callable[..., Tree], repo: Path) -> Tree:
    return tree_factory(workspace=repo)


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """Three etcd members on loopback ports, healthy; each SIGKILLed at the end (a test that
    needs etcd is marked `etcd_cluster.needs_etcd`, and skips where it is not installed)."""
    members = EtcdCluster.up(tmp_path / "etcd")
    try:
        yield members
    finally:
        members.stop()


@pytest.fixture(autouse=True)
def reap_after_each_test() -> Iterator[None]:
    """Orphans reparented to this (subreaping) process are reaped, so no zombie piles up for
    a later test that counts this process's children."""
    yield
    reap_zombies()


@pytest.fixture
def agents() -> Iterator[Callable[..., Agent]]:
    made: list[Agent] = []

    def make(*args: object, wrap: list[str] = ()) -> Agent:
        made.append(Agent(*args, wrap=wrap))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for agent in made:
        agent.stop()
