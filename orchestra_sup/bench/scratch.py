"""A private tree for one benchmark run, in a temporary directory of its own."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree


@contextlib.contextmanager
def scratch_tree(config: str, *, shards: int, lanes_per_shard: int) -> Iterator[CtlClient]:
    """Start a private tree (`client.oneshot.private_tree`, with no workspace given: it makes its
    own) of `shards` shards of `lanes_per_shard` lanes, its config file holding `config` (TOML
    text), it and its state directory in a fresh temporary directory (prefix `osup-bench-`);
    yield a ctl client to it; stop it and remove the directory on the way out.

    Raises `SupervisionError` when the tree does not start (as `private_tree` does).
    """
    with tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp:
        work = Path(tmp)
        path = work / "tree.toml"
        path.write_text(config)
        with private_tree(
            workspace=None,
            state_dir=work / "state",
            shards=shards,
            lanes_per_shard=lanes_per_shard,
            config=path,
        ) as client:
            yield client
