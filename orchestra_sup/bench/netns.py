"""Another machine's network on this one (issue 21): a network namespace joined to the current
one by a veth pair, for `bench relay --remote` and the tests of hosts.

The host's address exists only inside the namespace, the root's on this side, so a process run
under `wrap` (`ip netns exec NS`) reaches the root only over the pair, never over loopback. A
partition is `ip link set ... down` on this side's end (`down`), as a cable pulled: TCP segments
wait to be sent again, and arrive once it is `up`.

It needs root and iproute2 (`make` installs neither: Debian has `ip` by default); `open_host_net`
says why not where it cannot make one.
"""

from __future__ import annotations

import os
import shutil
import subprocess

SUBNET = "10.213"
"""The /16 the pairs' /30s are taken from (10.213.0.0/16: private, rarely routed)."""


def _ip(*args: str, ns: str | None = None) -> None:
    argv = [shutil.which("ip") or "ip", *(["-n", ns] if ns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=10)


class HostNet:
    """Namespace `osup-<n>` with `host_ip` on its end of the pair, `root_ip` on this end (a /30
    of `SUBNET` picked from `n`, 0 <= n < 16384: one per process id, say). Raises
    `subprocess.CalledProcessError` when `ip` cannot make it (nothing is left behind)."""

    def __init__(self, n: int) -> None:
        self.ns = f"osup-{n}"
        self.root_dev, self.host_dev = f"osr{n}", f"osh{n}"
        a, b = divmod(n * 4 % 65536, 256)
        self.root_ip, self.host_ip = f"{SUBNET}.{a}.{b + 1}", f"{SUBNET}.{a}.{b + 2}"
        _ip("netns", "add", self.ns)  # fails when it exists: another run's, never touched
        try:
            _ip("link", "add", self.root_dev, "type", "veth", "peer", "name", self.host_dev)
        except BaseException:  # the pair is another run's: only the namespace is ours
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)
            raise
        try:
            _ip("link", "set", self.host_dev, "netns", self.ns)
            _ip("addr", "add", f"{self.root_ip}/30", "dev", self.root_dev)
            _ip("link", "set", self.root_dev, "up")
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_dev, ns=self.ns)
            _ip("link", "set", self.host_dev, "up", ns=self.ns)
            _ip("link", "set", "lo", "up", ns=self.ns)
            # Every address of this side through this end: another pair's root address too,
            # since this machine takes a packet for any of its addresses on any interface.
            _ip("route", "add", "default", "via", self.root_ip, ns=self.ns)
        except BaseException:
            self.remove()
            raise

    @property
    def wrap(self) -> list[str]:
        """The command prefix that runs a process on the host's network."""
        return [shutil.which("ip") or "ip", "netns", "exec", self.ns]

    def down(self) -> None:
        """Partition: this side's end goes down, and the pair carries nothing either way (the
        root's address still answers on this machine)."""
        _ip("link", "set", self.root_dev, "down")

    def up(self) -> None:
        _ip("link", "set", self.root_dev, "up")

    def remove(self) -> None:
        """The namespace and the pair go (deleting one end of a veth deletes both)."""
        ip = shutil.which("ip") or "ip"
        subprocess.run([ip, "link", "del", self.root_dev], capture_output=True, timeout=10)
        subprocess.run([ip, "netns", "del", self.ns], capture_output=True, timeout=10)


TRIES = 32
"""Numbers tried from the one asked, past namespaces and pairs another run holds (or a killed
run left)."""


def open_host_net(n: int) -> HostNet | str:
    """A `HostNet` numbered `n` or, where another run holds that one, one of the next
    `TRIES`; else one line saying why this machine cannot make one."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    why = ""
    for k in range(TRIES):
        try:
            return HostNet((n + k) % 16384)
        except subprocess.CalledProcessError as exc:
            why = exc.stderr.decode().strip()
            if "exists" not in why:
                break
    return f"cannot make a network namespace here: {why}"
