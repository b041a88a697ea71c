"""How the hosts that joined the root look in `ctl status` and `ctl tree` (ADR 0022).

`ctl status` gives one line for the cluster endpoint and a table of hosts under the children's;
`ctl tree` hangs each host under the root, its shards under it, marked as a subtree the root
supervises only through the host's agent. JSON has the same under "cluster".
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from rich.tree import Tree

from orchestra_sup.cli.columns import Field, dropped_line, fit
from orchestra_sup.protocol import frames as f

HOST_FIELDS = (
    Field("host"),
    Field("state"),
    Field("pid", right=True),
    Field("shards", right=True),
    Field("lanes", rank=1, right=True),
    Field("lease", rank=2),
    Field("heard", rank=1, right=True),
    Field("boot", rank=3),
    Field("capabilities", rank=4),
)
"""The hosts' table, each column with the rank a narrow terminal drops it by (`columns.fit`)."""


def cluster_parts(reply: f.StatusReply, width: int | None, wide_hint: str) -> list[RenderableType]:
    """`ctl status`'s cluster lines: none for a tree of one host; else where hosts join, how many
    did, how many `Hello`s were refused, how many results and commits of fenced attempts, and
    whether etcd has a quorum, then the hosts' table."""
    if not reply.cluster_listen and not reply.hosts:
        return []
    joined = sum(h.state == "joined" for h in reply.hosts)
    quorum = {True: "yes", False: "no: no lane is placed on a host", None: "?"}[reply.etcd_quorum]
    head = (
        f"cluster {reply.cluster_listen or '-'}: {joined} of {len(reply.hosts)} hosts joined, "
        f"{reply.hosts_refused} refused, {sum(c.fenced for c in reply.children)} fenced; "
        f"etcd quorum {quorum}"
    )
    parts: list[RenderableType] = [Text(head)]
    if reply.hosts:
        fitted = fit(HOST_FIELDS, [_row(h) for h in reply.hosts], width)
        parts.append(fitted.table)
        if fitted.dropped:
            parts.append(Text(dropped_line(fitted.dropped, wide_hint), style="dim"))
    return parts


def add_hosts(root: Tree, reply: f.StatusReply) -> None:
    """Each host under `root`: "host-a (host, pid P, boot B, lease L, joined)", its shards
    under it as a worker is shown ("shard-0 pid=P gen=G running")."""
    for host in reply.hosts:
        lease = f"lease {host.lease:x}" if host.lease else "no lease"
        branch = root.add(
            f"{host.name} (host, pid {host.pid}, boot {host.boot or '-'}, {lease}, {host.state})"
        )
        for shard in host.shards:
            branch.add(f"{shard.name} pid={shard.pid or '-'} gen={shard.generation} {shard.state}")


def _row(host: f.HostInfo) -> list[str]:
    running = sum(s.state == "running" for s in host.shards)
    return [
        host.name,
        host.state,
        str(host.pid),
        f"{running}/{len(host.shards)}",
        f"{sum(s.lanes for s in host.shards)}/{sum(s.capacity for s in host.shards)}",
        f"{host.lease:x}" if host.lease else "-",
        f"{host.heard_s:.1f} s",
        host.boot or "-",
        ",".join(host.capabilities) or "-",
    ]
