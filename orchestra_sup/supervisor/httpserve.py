"""The HTTP API (`web.api`) served on the supervisor's loop, when `[http] listen` (or `start
--http`) names an address.

Its tokens are read from the keys directory when it opens (`protocol.tokens`): one made later
is admitted from the next start. A re-exec needs nothing of it: the listening socket and every
connection are close-on-exec, so the old image's go with the exec, a client sees its
connection end (an `EventSource` reconnects by itself, sending `Last-Event-ID`), and the new
image binds the address again; a failed exec leaves the old image serving.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.httplisten import host_port
from orchestra_sup.protocol.keys import default_keys_dir
from orchestra_sup.protocol.tokens import TokenTable
from orchestra_sup.web.api import Desk, make_app

log = logging.getLogger("orchestra_sup.supervisor")

SHUTDOWN_S = 1.0
"""Seconds requests in flight get when the tree stops."""


class HttpServer:
    """The API over `desk`, admitting the tokens in the keys directory (`keys_dir`, that of
    `start --keys`; None: the state directory's, `keys.default_keys_dir`); `url` once open."""

    def __init__(self, desk: Desk, state_dir: Path, keys_dir: str | None) -> None:
        self.desk = desk
        self.keys_dir = Path(keys_dir) if keys_dir else default_keys_dir(state_dir)
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def open(self, listen: str) -> None:
        """Serve on `listen` ("HOST:PORT", checked: `httplisten.http_listen`; "": nothing).
        Raises `ConfigError` when a token file cannot be read or the address cannot be bound."""
        if not listen:
            return
        tokens = TokenTable.load(self.keys_dir)
        host, port = host_port(listen)
        runner = web.AppRunner(
            make_app(self.desk, tokens), access_log=None, shutdown_timeout=SHUTDOWN_S
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"--http {listen}: cannot listen there: {exc.strerror}") from exc
        self._runner = runner
        bound = runner.addresses[0][1]  # the port taken, for port 0
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/v1/"
        if not len(tokens):
            log.warning("HTTP API at %s: no token yet (keys init --http-token NAME)", self.url)
        log.info("HTTP API at %s, %d tokens", self.url, len(tokens))

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
