"""Entry point of a child process: `python -m orchestra_sup.node '<ChildArgs JSON>'`.

A child forked from the fork template (`node.template`) enters at `run` instead, with the same
arguments, already decoded.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from orchestra_sup import logformat
from orchestra_sup.errors import OrchestraError
from orchestra_sup.node.roles import loop_factory, make_role
from orchestra_sup.protocol.childargs import ChildArgs, decode
from orchestra_sup.runtime.node import Node
from orchestra_sup.system import cpupolicy

log = logging.getLogger(__name__)


def run(args: ChildArgs) -> int:
    """Run the child `args` describes until it stops; returns its exit status (0 after SIGTERM,
    1 when it was orphaned or rejected, 2 on an unknown role or an `OrchestraError`, logged).

    The child's CPU policy (`ChildArgs.cpu`) is applied first; a step the kernel refuses is
    logged and the child runs without it. Logging is configured afresh (`logformat.configure`
    replaces every handler): a forked child must not keep handlers it inherited. Its lines
    carry `args.name` and `args.generation`. The node runs on the event loop its role's
    `roles.loop_factory` makes (uvloop's or asyncio's).
    """
    logformat.configure(args.name, args.generation, args.log_format)
    try:  # first: before any thread (ZeroMQ's among them) starts, so they inherit it
        cpupolicy.apply(args.cpu)
    except OSError as exc:
        log.warning("%s: CPU policy not applied: %s", args.name, exc)
    try:
        role = make_role(args.role)
    except ValueError as exc:
        log.error("%s: %s", args.name, exc)
        return 2
    try:
        with asyncio.Runner(loop_factory=loop_factory(args.role)) as runner:
            return runner.run(Node(args, role).run())
    except OrchestraError as exc:
        log.error("%s: %s", args.name, exc)
        return 2


def main() -> int:
    return run(decode(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
