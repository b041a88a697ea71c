"""Fault injection for tests: what `ctl debug NAME ACTION` does in a process of the tree.

Off unless the tree runs with ORCHESTRA_SUP_DEBUG_HOOKS=1 (the node and the supervisor check
before anything here runs). The actions (`frames.CtlDebug`): a handler or a task that raises, a
loop blocked asleep or spinning on the CPU, SIGTERM ignored, the state store's commits held.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)


async def debug_raise(name: str) -> f.Body:
    """The work of a `raise_in_task` debug hook: a task serving a request that raises."""
    await asyncio.sleep(0)
    raise RuntimeError(f"debug hook: a task of {name} serving a request raises")


def debug_spin(name: str, seconds: float) -> None:
    """The work of a `spin_loop` debug hook: hold the calling thread on the CPU for `seconds`,
    never blocking (a runaway: in real time, RLIMIT_RTTIME's SIGXCPU comes first)."""
    log.warning("%s: debug hook spins on the CPU for %g s", name, seconds)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def refusal(name: str, hook: f.DebugHook, store: Store | None) -> f.Error | None:
    """Why child `name` cannot take `hook`, or None: `hold_commits` needs a state store."""
    if hook.action == "hold_commits" and store is None:
        return f.Error(code=ErrorCode.BAD_REQUEST, message=f"{name} has no state store to hold")
    return None


def act(name: str, hook: f.DebugHook, store: Store | None) -> None:
    """Carry out `hook` in child `name` (after it was acknowledged), on its event loop:
    `block_loop` blocks the loop asleep for `hook.seconds`, `spin_loop` spins it on the CPU,
    `ignore_sigterm` ignores SIGTERM from now on, `hold_commits` holds `store`'s commits."""
    if hook.action == "hold_commits":
        assert store is not None  # `refusal` said so
        log.warning("%s: debug hook holds every commit for %g s", name, hook.seconds)
        store.hold(hook.seconds)
    elif hook.action == "ignore_sigterm":
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif hook.action == "spin_loop":
        debug_spin(name, hook.seconds)
    else:
        log.warning("%s: debug hook blocks the event loop for %g s", name, hook.seconds)
        time.sleep(hook.seconds)  # the whole point: a wedged loop, heartbeats stop
