"""The HTTP API (`web.api`) served on the supervisor's loop, when `[http] listen` (or `start
--http`) names an address, within the limits of `[http]` (`protocol.httplisten`).

Limits, each because a client that is slow or hostile must not cost the tree:
- connections: at most `max_connections` open, TLS handshakes included; one more is turned
  away at once (`httpgate.Gate`), so a crowd of silent connections cannot take the
  descriptors the supervisor needs for its children and `ctl`;
- idle: a connection without a whole request for `idle_s` is closed (aiohttp's keep-alive
  timer, armed from the accept), a TLS handshake that takes longer aborted, and a client
  that reads nothing of its answer for `idle_s` let go (`Gate.sweep`);
- time: a request may take `request_s`, body and answer included (`web.api`), and an event
  stream's write `idle_s`.

Tokens are read from the keys directory as they are presented (`protocol.tokens.TokenTable`):
one made or revoked with the tree running counts from its next request.

TLS: with `[http] cert` and `key`, the API is served over TLS 1.2 or later, and only then from
a non-loopback address (`httplisten.http_listen`).

At a re-exec the listening socket and every connection are close-on-exec, so the old image's
go with the exec, a client sees its connection end (an `EventSource` reconnects by itself,
sending `Last-Event-ID`), and the new image binds the address again: for `HOST:0`, the port
the old image had (`Handoff.http_bound`), so clients find it where they left it (another one
when that port was taken meanwhile). A failed exec leaves the old image serving.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

from aiohttp import web

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.httplisten import HttpSettings, host_port
from orchestra_sup.protocol.keys import default_keys_dir
from orchestra_sup.protocol.tokens import TokenTable
from orchestra_sup.supervisor.httpgate import Gate
from orchestra_sup.web.api import Desk, Limits, end_streams, make_app

log = logging.getLogger("orchestra_sup.supervisor")

SHUTDOWN_S = 1.0
"""Seconds requests in flight get when the tree stops."""


class HttpServer:
    """The API over `desk`, admitting the tokens in the keys directory (`keys_dir`, that of
    `start --keys`; None: the state directory's, `keys.default_keys_dir`); `url` and `bound`
    ("HOST:PORT") and its connections' `gate` once open.
    `rebind`: after a re-exec, the address the earlier image had bound (`Handoff`; "" when
    it served none), taken again for a `listen` of port 0; None at a first start."""

    def __init__(
        self, desk: Desk, state_dir: Path, keys_dir: str | None, rebind: str | None = None
    ):
        self.desk = desk
        self.keys_dir = Path(keys_dir) if keys_dir else default_keys_dir(state_dir)
        self.rebind = rebind
        self.url = ""
        self.bound = ""
        self.gate: Gate | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None

    async def open(self, settings: HttpSettings) -> None:
        """Serve as `settings` say ("" `listen`: nothing). Raises `ConfigError` when the
        certificate or key cannot be loaded or the address cannot be bound, at a first start;
        after a re-exec the tree is running already and must not stop for its API (a key
        renewed meanwhile, a port taken): the error is logged and the API is not served."""
        if not settings.listen:
            return
        try:
            await self._open(settings)
        except ConfigError as exc:
            if self.rebind is None:
                raise
            log.error("HTTP API not served after the re-exec: %s", exc)

    async def _open(self, settings: HttpSettings) -> None:
        tokens, damaged = TokenTable.load(self.keys_dir)
        for line in damaged:
            log.warning("%s; that token is refused", line)
        tls = _tls(settings) if settings.tls else None
        host, port = host_port(settings.listen)
        limits = Limits(request_s=settings.request_s, write_s=settings.idle_s)
        runner = web.AppRunner(
            make_app(self.desk, tokens, limits, settings.releases),
            access_log=None,
            shutdown_timeout=SHUTDOWN_S,
            keepalive_timeout=settings.idle_s,
            handler_cancellation=True,  # a client gone cancels its handler: nothing waits on it
        )
        await runner.setup()
        assert runner.server is not None
        gate = Gate(runner.server, settings.max_connections, tls, settings.idle_s)
        ports = [port]
        if port == 0 and self.rebind and host_port(self.rebind)[0] == host:
            ports.insert(0, host_port(self.rebind)[1])
        for each in ports:
            try:
                server = await asyncio.get_running_loop().create_server(
                    gate, host, each, backlog=128, reuse_address=True
                )
                break
            except OSError as exc:
                if each != ports[-1]:
                    log.warning("HTTP API: port %d taken meanwhile (%s)", each, exc.strerror)
                    continue
                await runner.cleanup()
                where = settings.listen
                raise ConfigError(f"--http {where}: cannot listen there: {exc.strerror}") from exc
        self._runner, self._server, self.gate = runner, server, gate
        gate.start_sweeping(settings.idle_s)
        bound = server.sockets[0].getsockname()[1]  # the port taken, for port 0
        shown = f"[{host}]" if ":" in host else host
        self.bound = f"{shown}:{bound}"
        self.url = f"{'https' if tls else 'http'}://{shown}:{bound}/v1/"
        if not len(tokens):
            log.warning(
                "HTTP API at %s: no token in %s yet (orchestra-sup keys init --dir %s "
                "--http-token NAME)",
                self.url,
                self.keys_dir,
                self.keys_dir,
            )
        else:
            log.info("HTTP API at %s, %d tokens in %s", self.url, len(tokens), self.keys_dir)

    def counts(self) -> f.HttpCounts | None:
        """The connections now and since the start (None: not served)."""
        gate = self.gate
        if gate is None:
            return None
        return f.HttpCounts(
            open=gate.open(),
            max=gate.most,
            refused=gate.refused,
            reset=gate.stuck,
        )

    async def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            end_streams(self._runner.app)
            await self._runner.cleanup()
            self._runner = None


def _no_passphrase() -> str:
    """An encrypted key would make OpenSSL prompt on the terminal, holding the start there."""
    raise ConfigError("the key is encrypted; give its decrypted PEM (openssl pkey -in KEY)")


def _tls(settings: HttpSettings) -> ssl.SSLContext:
    """A server context of `settings`' certificate chain and key, TLS 1.2 at least. Raises
    `ConfigError` naming the file when either cannot be loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.cert, settings.key, password=_no_passphrase)
    except ConfigError as exc:
        raise ConfigError(f"[http] key {settings.key}: {exc}") from None
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise ConfigError(
            f"[http] cert {settings.cert} and key {settings.key}: cannot be loaded: {reason}"
        ) from None
    return context
