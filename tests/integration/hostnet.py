"""Another machine's network for a test (`orchestra_sup.bench.netns`), or a skip saying why
this machine cannot make one."""

from __future__ import annotations

import pytest

from orchestra_sup.bench.netns import HostNet, open_host_net

__all__ = ["HostNet", "host_net"]


def host_net(n: int) -> HostNet:
    made = open_host_net(n)
    if isinstance(made, str):
        pytest.skip(made)
    return made
