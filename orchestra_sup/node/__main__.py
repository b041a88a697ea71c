"""Entry point of a child process: `python -m orchestra_sup.node '<ChildArgs JSON>'`."""

from __future__ import annotations

import asyncio
import logging
import sys

from orchestra_sup.errors import OrchestraError
from orchestra_sup.node.args import decode
from orchestra_sup.node.roles import make_role
from orchestra_sup.node.runtime import Node


def main() -> int:
    args = decode(sys.argv[1])
    logging.basicConfig(
        level=logging.INFO, format=f"{args.name}[gen={args.generation}] %(levelname)s %(message)s"
    )
    try:
        role = make_role(args.role)
    except ValueError as exc:
        print(f"orchestra-sup {args.name}: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(Node(args, role).run())
    except OrchestraError as exc:
        print(f"orchestra-sup {args.name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
