"""`[cluster]` (`cluster.settings`, ADR 0021): what a valid table gives, each refusal in one
line naming the key, and that reading a config never imports etcd's HTTP client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.cluster.settings import ClusterSettings, check_host_cluster, connect
from orchestra_sup.config import settings_from_mapping
from orchestra_sup.errors import ConfigError


def cluster(**table: object) -> ClusterSettings:
    return settings_from_mapping({"cluster": table}).cluster


def test_no_cluster_table_is_one_host() -> None:
    assert settings_from_mapping({}).cluster == ClusterSettings()
    assert ClusterSettings().etcd == ()
    with pytest.raises(ConfigError, match="etcd is empty: this tree is one host"):
        connect(ClusterSettings())


def test_a_full_table(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    got = cluster(
        etcd=["https://10.0.0.5:2379", "https://10.0.0.6:2379", "https://10.0.0.5:2379"],
        etcd_ca=str(ca),
        etcd_user="orchestra",
        etcd_password_file=str(password),
        prefix="/trees/a/",
        lease_ttl_s=15,
        keepalive_s=2,
        listen="tcp://10.0.0.2:7450",
        keys="/var/lib/orchestra-sup/keys",
    )
    assert (got.listen, got.keys) == ("tcp://10.0.0.2:7450", "/var/lib/orchestra-sup/keys")
    assert got.etcd == ("https://10.0.0.5:2379", "https://10.0.0.6:2379")  # once each
    assert (got.lease_ttl_s, got.keepalive_s, got.prefix) == (15, 2.0, "/trees/a/")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"etcd": "http://a:2379"}, r"etcd = 'http://a:2379': expected an array of URLs"),
        ({"etcd": ["a:2379"]}, r"etcd: 'a:2379' is not an http:// or https:// URL"),
        ({"etcd": ["https://"]}, r"is not an http:// or https:// URL"),
        ({"etcd_ca": "/nonexistent/ca.pem"}, r"etcd_ca = '/nonexistent/ca.pem': no such file"),
        ({"etcd_user": "u"}, r"etcd_user and etcd_password_file go together"),
        ({"prefix": "trees"}, r"prefix = 'trees': must begin and end with /"),
        ({"lease_ttl_s": 1}, r"lease_ttl_s = 1: expected whole seconds, 2 to 3600"),
        ({"lease_ttl_s": 2.5}, r"lease_ttl_s = 2.5: expected whole seconds"),
        ({"keepalive_s": True}, r"keepalive_s = True: expected seconds"),
        ({"lease_ttl_s": 4, "keepalive_s": 2}, r"must be more than twice keepalive_s = 2"),
        (
            {"lease": 10},
            r"\[cluster\] unknown key 'lease' \(known: listen, coordinator_listen, custodian_",
        ),
        ({"listen": "ipc:///tmp/x"}, r"listen = 'ipc:///tmp/x': give a tcp://HOST:PORT address"),
        ({"listen": "tcp://h:0"}, r"listen = 'tcp://h:0': give a tcp://HOST:PORT"),
        ({"listen": "tcp://:7450"}, r"give a tcp://HOST:PORT"),
        ({"listen": "tcp://h:\uff17"}, r"give a tcp://HOST:PORT"),
        ({"listen": "tcp://h:7450"}, r"listen needs etcd: hosts' membership"),
        ({"keys": ""}, r"keys = '': expected a non-empty string"),
    ],
)
def test_refusals_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_mapping({"cluster": table})


def test_cert_without_key_is_refused(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="etcd_cert and etcd_key go together"):
        cluster(etcd_cert=str(cert))


def test_a_hosts_config_gives_only_how_it_reaches_etcd(tmp_path: Path) -> None:
    """A host's agent's `[cluster]`: its own user, TLS files and etcd addresses pass; a key the
    root's welcome says is refused naming it; a password file it cannot read, too, at once."""
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    check_host_cluster(cluster(etcd_user="host-a", etcd_password_file=str(password)))
    check_host_cluster(cluster(etcd=["http://10.0.0.5:2379"]))
    for table, key in (
        ({"prefix": "/other/"}, "prefix"),
        ({"lease_ttl_s": 20}, "lease_ttl_s"),
        ({"listen": "tcp://0.0.0.0:7450", "etcd": ["http://e:2379"]}, "listen"),
    ):
        with pytest.raises(ConfigError, match=f"\\[cluster\\] {key} is the root's to say"):
            check_host_cluster(cluster(**table))
    password.chmod(0)
    unreadable = cluster(etcd_user="host-a", etcd_password_file=str(password))
    if os.geteuid() != 0:  # root reads any file
        with pytest.raises(ConfigError, match="etcd_password_file"):
            check_host_cluster(unreadable)


def test_reading_a_config_or_starting_the_cli_does_not_import_aiohttp() -> None:
    """aiohttp takes about 0.4 s to import here: only what talks to etcd pays for it, not every
    `orchestra-sup` command and every child of the tree."""
    probe = (
        "import sys, orchestra_sup.config, orchestra_sup.cli.app; print('aiohttp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
