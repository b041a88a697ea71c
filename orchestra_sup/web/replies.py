"""How the HTTP API answers: JSON bodies encoded by msgspec (`json_reply`), the security
headers every answer carries, and a refusal as `{"error": {"code", "message"}}` with the HTTP
status its code maps to (`Refused`, `refusal`, `STATUS`), as ctl maps codes onto exit
statuses (usage errors 4xx, the tree's state 5xx)."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec
from aiohttp import web

from orchestra_sup.errors import ErrorCode, OrchestraError
from orchestra_sup.protocol import frames as f

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
}
STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.PATH_ESCAPE: 400,
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.VERSION_SKEW: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.FENCED: 409,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.BUSY: 503,
    ErrorCode.PEER_DOWN: 503,
    ErrorCode.SHARD_FULL: 503,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.STATE_DEGRADED: 507,
}
"""HTTP status by the tree's error code; any other code is 500."""

encode = msgspec.json.Encoder().encode


class Refused(OrchestraError):
    """A request refused: answered `{"error": {"code", "message"}}` with HTTP `status`
    (`web.api`'s error middleware). Never leaves the web package."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @classmethod
    def of(cls, error: f.Error) -> Refused:
        """The tree's `Error` answer, with the HTTP status of its code."""
        return cls(STATUS.get(error.code, 500), str(error.code), error.message)


def json_reply(answer: Any, status: int = 200, **headers: str) -> web.Response:
    """`answer` (a msgspec type, or plain values) as the JSON body."""
    return web.Response(
        body=encode(answer), status=status, content_type="application/json", headers=headers
    )


def refusal(status: int, code: str, message: str, **headers: str) -> web.Response:
    body = {"error": {"code": code, "message": message}}
    return json_reply(body, status, **SECURITY_HEADERS, **headers)


def seq(raw: str) -> int:
    """A sequence number of the query (`?since=`, `?after=`, `Last-Event-ID`); `Refused`
    (400) unless ASCII digits of at most `frames.MAX_SEQ`."""
    if len(raw) > 19 or not raw.isascii() or not raw.isdigit() or int(raw) > f.MAX_SEQ:
        raise Refused(400, "bad_request", f"not a sequence number: {raw[:40]!r}")
    return int(raw)


_SECONDS = re.compile(r"[0-9]{1,4}(\.[0-9]{1,6})?", re.ASCII)


def seconds(raw: str, low: float, high: float, name: str) -> float:
    """Seconds of the query parameter `name` (`?wait=`, `?status=`): ASCII digits with an
    optional fraction, from `low` to `high`; `Refused` (400) otherwise."""
    value = float(raw) if _SECONDS.fullmatch(raw) else math.nan
    if not low <= value <= high:  # NaN is within no bounds
        message = f"?{name}= takes seconds from {low:g} to {high:g}, not {raw[:40]!r}"
        raise Refused(400, "bad_request", message)
    return value
