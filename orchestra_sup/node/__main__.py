"""Entry point of a child process: `python -m orchestra_sup.node '<ChildArgs JSON>'`."""

from __future__ import annotations

import asyncio
import logging
import sys

from orchestra_sup.errors import OrchestraError
from orchestra_sup.node.args import decode
from orchestra_sup.node.runtime import Node, Role


def make_role(role: str) -> Role:
    if role == "coordinator":
        from orchestra_sup.coordinator.role import Coordinator

        return Coordinator()
    if role == "custodian":
        from orchestra_sup.custodian.role import Custodian

        return Custodian()
    if role == "shard":
        from orchestra_sup.shards.role import Shard

        return Shard()
    raise SystemExit(f"unknown role {role!r}")


def main() -> int:
    args = decode(sys.argv[1])
    logging.basicConfig(
        level=logging.INFO, format=f"{args.name}[gen={args.generation}] %(levelname)s %(message)s"
    )
    try:
        return asyncio.run(Node(args, make_role(args.role)).run())
    except OrchestraError as exc:
        print(f"orchestra-sup {args.name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
