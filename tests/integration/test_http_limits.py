"""The HTTP API's server (`supervisor.httpserve`, `[http]`, issue 23) on a real tree: bounded
connections, idle and slow clients let go, tokens counted from their next request, a
non-loopback address served only over TLS, and the port of `HOST:0` kept across a re-exec."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.tokens import TOKENS_DIR
from tests.integration.harness import Tree, wait_until
from tests.integration.test_cli import assert_one_line_error
from tests.integration.test_http_api import Http, api, token

pytestmark = pytest.mark.integration
__all__ = ["api"]  # the fixture, used by name

LIMITS = '[http]\nlisten = "127.0.0.1:0"\nmax_connections = 8\nidle_s = 1.0\nrequest_s = 2.0\n'


@pytest.fixture
def limited(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> Iterator[tuple[Tree, str]]:
    """A tree whose API takes 8 connections, lets one idle 1 s and a request take 2 s."""
    config = tmp_path / "orchestra.toml"
    config.write_text(LIMITS)
    ops = token(tmp_path / "state", "ops")
    yield tree_factory(workspace=repo, shards=1, config=config), ops


def _address(tree: Tree) -> tuple[str, int]:
    url = urlsplit(tree.status().http_url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_silent_connections_are_bounded_and_let_go(limited: tuple[Tree, str]) -> None:
    """Eight silent connections fill the API: a ninth is answered 503 in JSON and closed at
    once, ctl goes on; after idle_s the silent ones are closed and the API answers again."""
    tree, ops = limited
    address = _address(tree)
    with ExitStack() as held:
        silent = [held.enter_context(socket.create_connection(address)) for _ in range(8)]
        wait_until(lambda: _full(address), 10, "a ninth connection is refused")
        counts = tree.status().http  # ctl is not shut out, and says so
        assert counts is not None and counts.max == 8 and counts.refused >= 1, counts
        assert counts.open <= 8, counts  # the silent ones close after idle_s
        for sock in silent:
            sock.settimeout(10)
            assert _closed_by_server(sock), "a silent connection outlived idle_s"
    http = Http(tree.status().http_url, ops)
    wait_until(lambda: http.call("GET", "/v1/status")[0] == 200, 10, "the API answers again")


def _full(address: tuple[str, int]) -> bool:
    with socket.create_connection(address, timeout=10) as extra:
        extra.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := extra.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 503"):
        return False
    assert json.loads(body)["error"]["code"] == "busy"
    return True


def test_a_request_that_does_not_finish_is_ended(limited: tuple[Tree, str]) -> None:
    """A body promised and never sent is answered 504 after request_s, in JSON."""
    tree, ops = limited
    with socket.create_connection(_address(tree), timeout=20) as slow:
        slow.sendall(
            b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + ops.encode()
            + b"\r\nContent-Length: 100\r\n\r\nname = "
        )
        answer = slow.recv(65536)
    assert answer.startswith(b"HTTP/1.1 504"), answer[:80]
    assert b'"code": "timeout"' in answer or b'"code":"timeout"' in answer


def test_two_authorization_headers_and_tokens_made_or_revoked_live(
    limited: tuple[Tree, str], tmp_path: Path
) -> None:
    """Two Authorization headers are refused (400); a token made while the tree runs is
    admitted at once, and refused (401) once its file is deleted."""
    tree, ops = limited
    url = tree.status().http_url
    with socket.create_connection(_address(tree), timeout=20) as twice:
        header = b"Authorization: Bearer " + ops.encode() + b"\r\n"
        twice.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + header * 2 + b"\r\n")
        assert twice.recv(65536).startswith(b"HTTP/1.1 400")
    late = token(tree.state_dir, "late", "read")
    assert Http(url, late).call("GET", "/v1/status")[0] == 200
    (tree.state_dir / "keys" / TOKENS_DIR / "late.toml").unlink()
    assert Http(url, late).call("GET", "/v1/status")[0] == 401


def certificate(where: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, `where/name.pem` and `.key`."""
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    made = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1"
    argv = ["openssl", "req", "-x509", *made.split(), "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run([*argv, "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


def test_a_non_loopback_address_is_served_over_tls(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """With a certificate and key, 0.0.0.0 is served, over TLS only: a client that trusts
    the certificate is answered; plain HTTP to the port is not."""
    cert, key = certificate(tmp_path, "api")
    config = tmp_path / "orchestra.toml"
    config.write_text(f'[http]\nlisten = "0.0.0.0:0"\ncert = "{cert}"\nkey = "{key}"\n')
    ops = token(tmp_path / "state", "ops")
    tree = tree_factory(workspace=repo, shards=1, config=config)
    url = tree.status().http_url
    assert url.startswith("https://0.0.0.0:"), url
    port = urlsplit(url).port
    trusted = ssl.create_default_context(cafile=str(cert))
    request = urllib.request.Request(f"https://127.0.0.1:{port}/v1/status")
    request.add_header("Authorization", f"Bearer {ops}")
    with urllib.request.urlopen(request, context=trusted, timeout=30) as reply:
        assert json.loads(reply.read())["supervisor"]["http_url"] == url
    with socket.create_connection(("127.0.0.1", port or 0), timeout=20) as plain:
        plain.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not plain.recv(65536).startswith(b"HTTP/1.1 200")


def test_a_certificate_that_cannot_be_loaded_is_refused_at_start(tmp_path: Path) -> None:
    """A cert or key that cannot be read stops the start in one line naming both files; an
    encrypted key is said to be one, with no passphrase prompt holding the start."""
    config = tmp_path / "orchestra.toml"
    missing = tmp_path / "nowhere.pem"
    cert, key = certificate(tmp_path, "api")
    locked = tmp_path / "locked.key"
    argv = ["openssl", "pkey", "-in", key, "-aes256", "-passout", "pass:secret", "-out", locked]
    subprocess.run(argv, check=True, capture_output=True)
    for (pem, private), words in (
        ((missing, missing), ("[http] cert", "cannot be loaded")),
        ((cert, locked), ("[http] key", "encrypted")),
    ):
        config.write_text(f'[http]\nlisten = "0.0.0.0:0"\ncert = "{pem}"\nkey = "{private}"\n')
        argv = [sys.executable, "-m", "orchestra_sup", "start", "--state-dir", str(tmp_path / "s")]
        argv += ["--run-dir", str(tmp_path / "r"), "--config", str(config)]
        started = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        assert_one_line_error(started, 2, *words)
        assert "pass phrase" not in started.stdout + started.stderr


def test_a_re_exec_keeps_the_port_of_host_0(api: tuple[Tree, str, str]) -> None:
    """`--http 127.0.0.1:0` after `ctl rollover supervisor`: the new image serves the port
    the old one had (`Handoff.http_bound`), so a client finds the tree where it left it."""
    tree, ops, _ = api
    before = tree.status()
    done = tree.rollover("supervisor")
    assert done.returncode == 0, done.stderr
    after = tree.status()
    assert after.version == before.version and after.http_url == before.http_url
    status, body, _ = Http(before.http_url, ops).call("GET", "/v1/status")
    assert status == 200 and body["supervisor"]["pid"] == before.supervisor_pid


def test_a_re_exec_outlives_a_damaged_token_and_a_key_renewed_badly(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """What a running tree only refuses must not stop it at a re-exec: a token file that says
    nonsense refuses its own token and the API is served again; a key that no longer matches
    the certificate leaves the new image running its children without the API (logged)."""
    cert, key = certificate(tmp_path, "api")
    config = tmp_path / "orchestra.toml"
    config.write_text(f'[http]\nlisten = "127.0.0.1:0"\ncert = "{cert}"\nkey = "{key}"\n')
    ops = token(tmp_path / "state", "ops")
    tree = tree_factory(workspace=repo, shards=1, config=config)
    (tree.state_dir / "keys" / TOKENS_DIR / "junk.toml").write_text("this is not toml\n")
    before = tree.status()
    assert tree.rollover("supervisor").returncode == 0
    port = urlsplit(before.http_url).port
    trusted = ssl.create_default_context(cafile=str(cert))
    request = urllib.request.Request(f"https://127.0.0.1:{port}/v1/status")
    request.add_header("Authorization", f"Bearer {ops}")
    with urllib.request.urlopen(request, context=trusted, timeout=30) as reply:
        assert json.loads(reply.read())["supervisor"]["pid"] == before.supervisor_pid
    key.write_bytes(certificate(tmp_path, "other")[1].read_bytes())
    assert tree.rollover("supervisor").returncode == 0
    after = tree.status()
    assert after.supervisor_pid == before.supervisor_pid and after.http_url == ""
    assert [c.pid for c in after.children] == [c.pid for c in before.children]


def test_tls_handshakes_count_against_the_bound(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Eight TCP connections that never begin their TLS handshake fill a bound of eight: a
    ninth is closed at once, ctl goes on; the eight are aborted after idle_s, and a client
    that trusts the certificate is answered again."""
    cert, key = certificate(tmp_path, "api")
    config = tmp_path / "orchestra.toml"
    config.write_text(
        f'[http]\nlisten = "127.0.0.1:0"\ncert = "{cert}"\nkey = "{key}"\n'
        "max_connections = 8\nidle_s = 1.0\n"
    )
    ops = token(tmp_path / "state", "ops")
    tree = tree_factory(workspace=repo, shards=1, config=config)
    address = _address(tree)
    trusted = ssl.create_default_context(cafile=str(cert))

    def answered() -> bool:
        request = urllib.request.Request(f"https://127.0.0.1:{address[1]}/v1/whoami")
        request.add_header("Authorization", f"Bearer {ops}")
        try:
            with urllib.request.urlopen(request, context=trusted, timeout=10) as reply:
                return bool(reply.status == 200)
        except OSError:  # URLError, a reset: turned away
            return False

    def turned_away() -> bool:
        with socket.create_connection(address, timeout=10) as extra:
            return _closed_by_server(extra)

    with ExitStack() as held:
        silent = [held.enter_context(socket.create_connection(address)) for _ in range(8)]
        wait_until(turned_away, 10, "a ninth connection closed at once")
        assert not answered()
        assert isinstance(tree.status(), f.StatusReply)
        for sock in silent:
            sock.settimeout(10)
            assert _closed_by_server(sock), "a handshake outlived idle_s"
    wait_until(answered, 10, "the API to answer over TLS again")


def test_a_client_that_reads_nothing_is_let_go(limited: tuple[Tree, str]) -> None:
    """A client that pipelines requests for large answers and never reads one is reset
    within two sweeps of idle_s: its answers' writes, which no request timeout covers, do not
    hold the connection (and its descriptor) for as long as the client likes."""
    tree, _ = limited
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(_address(tree))
    with hog:
        hog.sendall(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
        hog.setblocking(False)
        wait_until(
            lambda: hog.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0,
            20,
            "the server to reset a connection that reads nothing",
        )
    counts = tree.status().http
    assert counts is not None and counts.reset == 1, counts


def test_short_connections_one_at_a_time_never_fill_the_bound(limited: tuple[Tree, str]) -> None:
    """Thirty connections one after another, each closed after its answer, on a bound of
    eight: each is answered, and none is counted once it is gone."""
    tree, _ = limited
    url = Http(tree.status().http_url, None).url + "/v1/openapi.json"
    for _ in range(30):
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200
    counts = tree.status().http
    assert counts is not None and counts.refused == 0, counts
