"""The operator's console (issue 23): a page at `/` and its assets at `/console/{file}`,
static files served as they ship in the package (`console/`), with no build step.

They hold nothing about the tree, so they are served without a token (`public`); the page
asks for one and sends it on every `/v1` request it makes, as any client does. The files are
read once, when the app is made (`routes`), so no request reads the disk on the supervisor's
loop; a new release's files are served from its next start or re-exec.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

FILES = {
    "index.html": "text/html",
    "console.css": "text/css",
    "console.js": "text/javascript",
    "icon.svg": "image/svg+xml",
}
"""Each file of the console and its media type."""


class Console:
    """The console's files, read from the package once (`OSError` when one is missing)."""

    def __init__(self) -> None:
        where = resources.files("orchestra_sup.web") / "console"
        self.files = {name: (where / name).read_bytes() for name in FILES}

    async def index(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if name not in FILES or name == "index.html":
            raise web.HTTPNotFound()
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        return web.Response(body=self.files[name], content_type=FILES[name], charset="utf-8")


def routes(console: Console) -> list[web.RouteDef]:
    """`GET /` (the page) and `GET /console/{file}` (one of `FILES`, else 404)."""
    return [web.get("/", console.index), web.get("/console/{file}", console.asset)]


def public(request: web.Request, console: Console) -> bool:
    """Whether `request` is for one of the console's files, which need no token."""
    return request.match_info.handler in (console.index, console.asset)
