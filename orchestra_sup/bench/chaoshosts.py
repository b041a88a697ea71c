"""The hosts of `bench chaos --hosts N` (issue 21): an etcd member, N real host agents joined to
the chaos tree, and the harm done to them.

Each host runs in a network namespace of its own over a veth pair (`bench.netns`), so it
reaches the root and etcd only over its pair; where the machine cannot make one, on loopback,
and then there are no partitions (the report says why). The root listens for hosts on every
address (`0.0.0.0`), and each host joins at its own pair's root address. The tree's leases
are short (TTL `TTL_S`, a keep-alive every `KEEPALIVE_S`), so a lost host's lanes run again
within seconds.

Harm, one at a time, at most one host out at once:

- a host killed: its agent and everything under it SIGKILLed at once, as a machine that dies;
  its agent is started again `DOWN_S` later (a new boot, a new lease);
- a host partitioned: its link down for twice the lease, then up.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from orchestra_sup.bench.netns import HostNet, open_host_net
from orchestra_sup.errors import ConfigError, SupervisionError
from orchestra_sup.protocol.keys import init_keys

TTL_S = 3
KEEPALIVE_S = 0.5
DOWN_S = 2.0
"""Seconds a killed host stays down before its agent starts again."""
PARTITION_S = 2 * TTL_S
"""Seconds a partitioned host's link stays down."""
ETCD_READY_S = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Host:
    """One host: its name, network (None: loopback), directories and agent process."""

    def __init__(self, base: Path, name: str, net: HostNet | None, join_port: int) -> None:
        self.name, self.net, self.base = name, net, base / name
        self.base.mkdir()
        address = "127.0.0.1" if net is None else net.host_ip
        root = "127.0.0.1" if net is None else net.root_ip
        self.join = f"tcp://{root}:{join_port}"
        self.listen = f"tcp://{address}:{_free_port()}"
        self.run_dir = Path(tempfile.mkdtemp(prefix="osup-h", dir="/tmp"))
        """Short, under /tmp: its ipc sockets' paths must fit in a socket address (108 bytes),
        wherever `base` is."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.partitioned_until: float | None = None
        """While its link is down: when it comes up (`time.monotonic()` seconds)."""
        self.back_at = 0.0
        """While it is killed: when its agent starts again."""

    def start(self, keys: Path, config: Path) -> None:
        wrap = [] if self.net is None else self.net.wrap
        argv = [*wrap, sys.executable, "-m", "orchestra_sup", "host", "--join", self.join]
        argv += ["--keys", str(keys), "--name", self.name, "--shards", "1"]
        argv += ["--config", str(config)]
        argv += ["--listen", self.listen, "--state-dir", str(self.base / "state")]
        argv += ["--run-dir", str(self.run_dir)]
        with (self.base / "agent.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.partitioned_until is None

    def kill(self) -> None:
        """SIGKILL the agent and every process under it, at once."""
        assert self.proc is not None
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.partitioned_until is not None and self.net is not None:
            self.net.up()
            self.partitioned_until = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def log_tail(self) -> str:
        return (self.base / "agent.log").read_text(errors="replace")[-1500:]


class Hosts:
    """`count` hosts for the chaos tree under `base`, each agent started with `config` (its
    `[isolation]`); `config()` is the tree's `[cluster]`. Raises `ConfigError` without an
    `etcd` binary (Debian: etcd-server)."""

    def __init__(self, base: Path, count: int, config: Path) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise ConfigError(
                "bench chaos --hosts needs etcd (Debian: apt-get install etcd-server)"
            )
        self.base, self.keys, self.agent_config = base, base / "keys", config
        names = [f"host-{chr(ord('a') + i)}" for i in range(count)]
        init_keys(self.keys, names, host=True)
        nets = [open_host_net((os.getpid() + i) % 16384) for i in range(count)]
        made = [n for n in nets if isinstance(n, HostNet)]
        if len(made) < count:  # one network for all, or none
            for net in made:
                net.remove()
            reason = next(n for n in nets if isinstance(n, str))
            self.network = f"loopback ({reason}): no partitions"
            made = []
        else:
            self.network = "a network namespace per host, over a veth pair"
        self.join_port = _free_port()
        self.hosts = [
            Host(base, name, made[i] if made else None, self.join_port)
            for i, name in enumerate(names)
        ]
        addresses = [h.net.root_ip for h in self.hosts if h.net] or ["127.0.0.1"]
        port = _free_port()
        self.etcd_url = f"http://{addresses[0]}:{port}"  # every host reaches it over its pair
        clients = ",".join(f"http://{a}:{port}" for a in addresses)
        argv = [etcd, "--data-dir", str(base / "etcd"), "--listen-client-urls", clients]
        argv += ["--advertise-client-urls", self.etcd_url]
        argv += ["--listen-peer-urls", f"http://127.0.0.1:{_free_port()}"]
        with (base / "etcd.log").open("ab") as log:
            self.etcd = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self._wait_etcd(addresses[0], port)
        self.kills = self.partitions = 0

    def _wait_etcd(self, address: str, port: int) -> None:
        deadline = time.monotonic() + ETCD_READY_S
        while time.monotonic() < deadline:
            if self.etcd.poll() is not None:
                break
            try:
                socket.create_connection((address, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        log = (self.base / "etcd.log").read_text(errors="replace")[-1000:]
        self.close()
        raise SupervisionError(f"bench chaos: etcd did not start:\n{log}")

    def config(self) -> str:
        """The chaos tree's `[cluster]` (hosts join on every address; short leases)."""
        return (
            f'[cluster]\nlisten = "tcp://0.0.0.0:{self.join_port}"\nkeys = "{self.keys}"\n'
            f'etcd = ["{self.etcd_url}"]\nlease_ttl_s = {TTL_S}\nkeepalive_s = {KEEPALIVE_S}\n'
        )

    def start(self) -> None:
        for host in self.hosts:
            host.start(self.keys, self.agent_config)

    def heal(self) -> None:
        """Every link up and every agent running again, at once (the harm has stopped)."""
        for host in self.hosts:
            if host.partitioned_until is not None:
                host.partitioned_until = 0.0
            host.back_at = 0.0
        self.tend(time.monotonic())

    def tend(self, now: float) -> None:
        """Bring back what is due (`now`: `time.monotonic()`): a partitioned host's link, a
        killed host's agent."""
        for host in self.hosts:
            if host.partitioned_until is not None and now >= host.partitioned_until:
                assert host.net is not None
                host.net.up()
                host.partitioned_until = None
            elif host.proc is None and now >= host.back_at:
                host.start(self.keys, self.agent_config)

    def harm(self, rng: random.Random, now: float) -> bool:
        """Kill or partition one host picked by `rng`, while every host is up; False when
        none may be harmed now (one is out already)."""
        if not all(h.up for h in self.hosts):
            return False
        host = rng.choice(self.hosts)
        if host.net is not None and rng.random() < 0.5:
            host.net.down()
            host.partitioned_until = now + PARTITION_S
            self.partitions += 1
        else:
            host.kill()
            host.back_at = now + DOWN_S
            self.kills += 1
        return True

    def close(self) -> None:
        """Stop every agent (its link up first), remove the namespaces, kill etcd."""
        for host in self.hosts:
            host.stop()
            if host.net is not None:
                host.net.remove()
        if self.etcd.poll() is None:
            self.etcd.send_signal(signal.SIGKILL)
            self.etcd.wait()
