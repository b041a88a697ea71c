"""etcd v3 through its JSON gateway, over aiohttp: the calls a tree's membership, leases and
fencing make (ADR 0021).

Every etcd server answers its v3 API as JSON on its client URL beside gRPC (`POST /v3/kv/put`,
`/v3/lease/keepalive`, `/v3/watch`, ...: etcd's grpc-gateway, "etcd3 API > gRPC gateway" in
etcd's documentation). In that mapping (proto3's JSON) keys and values are base64, 64-bit
integers are strings and a field at its zero value is left out (a keep-alive of an expired lease
has no "TTL"; a PUT event has no "type").

Endpoints: a request goes to the endpoint that last answered, and on a connection error, a
timeout or a 5xx answer (a member without a leader answers 503) to the next, until each was
tried once; then `EtcdUnavailable`. One member of three SIGKILLed is a retry to the next, not
an error. Requests carry `Grpc-Metadata-hasleader: true` (clientv3's `WithRequireLeader`): a
member cut off from the quorum refuses them, and ends a watch, instead of serving stale state.

Errors: `EtcdUnavailable` (no endpoint answered: no quorum, every member down, all timed out),
`EtcdRefused` (etcd answered with an error: a bad request, auth refused, a compacted revision),
both `OrchestraError`s with one-line messages.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import msgspec
from aiohttp.http_exceptions import LineTooLong

from orchestra_sup.errors import OrchestraError

TIMEOUT_S = 2.0
"""How long one request waits for one endpoint before the next is tried (seconds)."""
REQUIRE_LEADER = {"Grpc-Metadata-hasleader": "true"}
READ_BUFSIZE = 8 << 20
"""The longest line a watch may send (bytes). A response batches up to 1,000 events, each up to
etcd's request limit (1.5 MiB): the tree's own values are small (a registration, a lane's key),
and a longer response is an `EtcdRefused` that sends the reader back to a fresh read, never a
watch that dies. aiohttp's default, 64 KiB, would refuse far smaller ones."""
RESUME_S = 0.1
"""Seconds before a watch is taken again after a stream that ended this soon."""
WATCH_QUIET_S = 5.0
"""Seconds a watch stream may send nothing before it is taken again, at the next endpoint."""


class EtcdUnavailable(OrchestraError):
    """No etcd endpoint answered a request: every one was down, timed out or had no leader."""


class EtcdRefused(OrchestraError):
    """etcd answered a request with an error (its gRPC status message is the text)."""


class EtcdAuthRefused(EtcdRefused):
    """etcd refused who asked: its user or password (`/v3/auth/authenticate`), a role that
    does not allow the request (403), or no user where etcd's auth is on."""


class KeyValue(msgspec.Struct, frozen=True):
    """One key as etcd holds it: `create_revision` is the revision that created it (a lane's
    fencing token, ADR 0021), `lease` the lease it is attached to (0: none)."""

    key: bytes
    value: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0


class Event(msgspec.Struct, frozen=True):
    """A watched change: `kind` is "PUT" or "DELETE" (an expired lease's keys are DELETEs)."""

    kind: str
    kv: KeyValue


class _Header(msgspec.Struct):
    revision: int = 0


class _Range(msgspec.Struct):
    header: _Header = msgspec.field(default_factory=_Header)
    kvs: list[KeyValue] = []


class _Grant(msgspec.Struct):
    ID: int = 0
    TTL: int = 0
    error: str = ""


class _Put(msgspec.Struct):
    header: _Header = msgspec.field(default_factory=_Header)


class _TxnResponse(msgspec.Struct):
    response_range: _Range | None = None


class _Txn(msgspec.Struct):
    header: _Header = msgspec.field(default_factory=_Header)
    succeeded: bool = False
    responses: list[_TxnResponse] = []


class _Delete(msgspec.Struct):
    deleted: int = 0


class _KeepAlive(msgspec.Struct):
    TTL: int = 0


class _KeepAliveReply(msgspec.Struct):
    result: _KeepAlive = msgspec.field(default_factory=_KeepAlive)


class _WatchEvent(msgspec.Struct):
    kv: KeyValue
    type: str = "PUT"


class _WatchResult(msgspec.Struct):
    header: _Header = msgspec.field(default_factory=_Header)
    events: list[_WatchEvent] = []
    created: bool = False
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""


class _WatchReply(msgspec.Struct):
    result: _WatchResult | None = None
    error: dict[str, Any] | None = None


class _Token(msgspec.Struct):
    token: str


class Status(msgspec.Struct, frozen=True):
    """One member's answer to `status`: its version, and the member id of the leader it
    follows (0: none)."""

    version: str = ""
    leader: int = 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def prefix_end(prefix: bytes) -> bytes:
    """The `range_end` that makes a range or a watch cover every key starting with `prefix`
    (etcd's rule: the prefix with its last byte below 0xff incremented)."""
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


class Etcd:
    """A client of the etcd cluster at `endpoints` (URLs such as "http://10.0.0.5:2379"; at
    least one). `timeout_s` bounds one request at one endpoint (seconds, default `TIMEOUT_S`).
    `ssl` is the TLS context for https endpoints (CA, and a client certificate where etcd asks
    for one); `user` and `password` authenticate (etcd's `/v3/auth/authenticate`, once, the
    token sent with every request). A watch stream silent for `watch_quiet_s` seconds is
    taken again at the next endpoint (default `WATCH_QUIET_S`). Use as
    `async with Etcd(...) as etcd:`.

    Raises `ValueError` at construction for no endpoints or one that is not http(s)://.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float = TIMEOUT_S,
        ssl: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
        watch_quiet_s: float = WATCH_QUIET_S,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        for url in endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {url!r} is not an http:// or https:// URL")
        self.endpoints = [url.rstrip("/") for url in endpoints]
        self.timeout_s = timeout_s
        self.watch_quiet_s = watch_quiet_s
        self._ssl = ssl
        self._auth = (user, password) if user is not None else None
        self._token: str | None = None
        self._at = 0  # the endpoint that last answered
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Etcd:
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True)
        self._session = aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- keys -----------------------------------------------------------------------------------

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Set `key` to `value` (under `lease`, 0: none); returns the revision it made."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return (await self._call("/v3/kv/put", body, _Put)).header.revision

    async def put_if_lease(
        self, key: bytes, value: bytes, *, lease: int, expected_lease: int
    ) -> bool:
        """Set `key` to `value` under `lease`, only if `key` is attached to `expected_lease`
        now (0: absent, or under no lease), in one transaction; returns whether it was set. A
        registration made this way cannot be undone by an older request of the same host that
        etcd applies late (a member frozen with it queued): that one expected another lease."""
        put = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        compare = {"key": _b64(key), "target": "LEASE", "result": "EQUAL"}
        compare["lease"] = str(expected_lease)
        body = {"compare": [compare], "success": [{"requestPut": put}]}
        return (await self._call("/v3/kv/txn", body, _Txn)).succeeded

    async def create(self, key: bytes, value: bytes, *, lease: int) -> KeyValue:
        """Create `key` with `value` under `lease` unless it exists, in one transaction;
        returns the key as etcd then holds it: the one made, or the one that was there. Sent
        again (a timeout, then the next endpoint) it finds its own key and makes no other."""
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        put = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        body = {
            "compare": [compare],
            "success": [{"requestPut": put}],
            "failure": [{"requestRange": {"key": _b64(key)}}],
        }
        reply = await self._call("/v3/kv/txn", body, _Txn)
        if reply.succeeded:
            revision = reply.header.revision
            return KeyValue(key, value, revision, revision, 1, lease)
        kvs = [kv for r in reply.responses if r.response_range for kv in r.response_range.kvs]
        if not kvs:
            raise EtcdUnavailable("etcd answered a failed create with no key")
        return kvs[0]

    async def delete_created(self, key: bytes, create_revision: int) -> bool:
        """Delete `key` only while it is the one created at `create_revision` (not one made
        again since), in one transaction; returns whether it was deleted."""
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL"}
        compare["create_revision"] = str(create_revision)
        body = {"compare": [compare], "success": [{"requestDeleteRange": {"key": _b64(key)}}]}
        return (await self._call("/v3/kv/txn", body, _Txn)).succeeded

    async def get_prefix(self, prefix: bytes) -> tuple[int, list[KeyValue]]:
        """Every key starting with `prefix`, in key order, and the revision they were read at
        (the one to watch from, plus one)."""
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        reply = await self._call("/v3/kv/range", body, _Range)
        return reply.header.revision, reply.kvs

    async def get(self, key: bytes) -> KeyValue | None:
        """`key` as etcd holds it, or None."""
        reply = await self._call("/v3/kv/range", {"key": _b64(key)}, _Range)
        return reply.kvs[0] if reply.kvs else None

    async def delete(self, key: bytes) -> int:
        """Delete `key`; returns how many keys went (0 or 1)."""
        return (await self._call("/v3/kv/deleterange", {"key": _b64(key)}, _Delete)).deleted

    # --- leases ---------------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds (etcd's unit; >= 1); returns its id."""
        reply = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)}, _Grant)
        if reply.error:
            raise EtcdRefused(f"etcd refused a lease of {ttl_s} s: {reply.error}")
        return reply.ID

    async def keepalive(self, lease: int, *, timeout_s: float | None = None) -> int:
        """Renew `lease`; returns the seconds it now has left, 0 when it is gone (expired or
        revoked: etcd has deleted its keys). `timeout_s` bounds each endpoint's try (default
        the client's): a lease's keep-alive must reach the next member well within its TTL."""
        body = {"ID": str(lease)}
        reply = await self._call("/v3/lease/keepalive", body, _KeepAliveReply, timeout_s)
        return reply.result.TTL

    async def revoke(self, lease: int) -> None:
        """End `lease` now: etcd deletes every key attached to it."""
        await self._call("/v3/lease/revoke", {"ID": str(lease)}, _Put)

    # --- the cluster ----------------------------------------------------------------------------

    async def status(self, endpoint: str) -> Status:
        """`endpoint`'s own status (one member, no failover, no leader required: a member cut
        off from the quorum says so, `leader` 0). Raises `EtcdUnavailable` when it does not
        answer."""
        return await self._one(endpoint, "/v3/maintenance/status", {}, Status, leader=False)

    # --- watches --------------------------------------------------------------------------------

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[Event]:
        """The changes to keys starting with `prefix` from `start_revision` on, in revision
        order, for as long as the caller reads. A member that goes (or loses its leader) ends
        its stream: the watch goes on at the next endpoint from the revision after the last
        one seen, so nothing is missed or repeated. So does a stream that sends nothing for
        `watch_quiet_s` (a member frozen, or cut off behind a connection the kernel still
        holds open): a healthy member answers the new watch at once. Raises `EtcdUnavailable`
        when no endpoint takes the watch, `EtcdRefused` when the revision to go on from was
        compacted away, or one response is over `READ_BUFSIZE` (read afresh, then watch)."""
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        next_revision = start_revision
        failures = 0  # endpoints in a row that did not take the watch
        while True:
            body["create_request"]["start_revision"] = str(next_revision)
            url = self.endpoints[self._at]
            took = False  # the member answered this watch (it ended quiet or cut, not refused)
            began = time.monotonic()
            try:
                async for result in self._stream(url, body):
                    took = True
                    for event in result.events:
                        next_revision = event.kv.mod_revision + 1
                        yield Event(kind=event.type, kv=event.kv)
            except LineTooLong:
                raise EtcdRefused(
                    f"a watch response over {READ_BUFSIZE >> 20} MiB from {url}: read afresh"
                ) from None
            except EtcdUnavailable:
                took = False
            except (TimeoutError, aiohttp.ClientError):
                pass
            failures = 0 if took else failures + 1
            if failures >= len(self.endpoints):
                raise EtcdUnavailable(
                    f"no etcd endpoint takes a watch of {prefix!r} ({', '.join(self.endpoints)})"
                )
            self._at = (self._at + 1) % len(self.endpoints)
            if took and time.monotonic() - began < RESUME_S:
                await asyncio.sleep(RESUME_S)  # a member that ends each watch at once: no spin

    async def _stream(self, url: str, body: dict[str, Any]) -> AsyncIterator[_WatchResult]:
        session = self._open()
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout_s, sock_read=self.watch_quiet_s
        )
        async with session.post(
            url + "/v3/watch", json=body, headers=self._headers(), timeout=timeout
        ) as reply:
            if reply.status >= 500:
                raise EtcdUnavailable(f"{url} answered {reply.status}")
            async for line in reply.content:
                if not line.strip():
                    continue
                try:
                    message = msgspec.json.decode(line, type=_WatchReply, strict=False)
                except msgspec.DecodeError:  # ValidationError included
                    raise EtcdUnavailable(f"{url} sent what is not etcd's JSON") from None
                if message.error is not None:
                    raise EtcdUnavailable(f"{url}: {message.error.get('message', '')}")
                if message.result is not None:
                    if message.result.compact_revision:  # before `canceled`, which it sets
                        raise EtcdRefused(
                            f"etcd compacted the revisions asked for away (oldest kept: "
                            f"{message.result.compact_revision}): read afresh, then watch"
                        )
                    if message.result.canceled:
                        raise EtcdUnavailable(
                            f"{url} ended the watch: {message.result.cancel_reason}"
                        )
                    yield message.result

    # --- one request, with failover -------------------------------------------------------------

    async def _call(
        self, path: str, body: dict[str, Any], kind: type[Any], timeout_s: float | None = None
    ) -> Any:
        problems = []
        for step in range(len(self.endpoints)):
            at = (self._at + step) % len(self.endpoints)
            try:
                reply = await self._one(self.endpoints[at], path, body, kind, timeout_s=timeout_s)
            except EtcdUnavailable as exc:
                problems.append(str(exc))
                continue
            self._at = at
            return reply
        raise EtcdUnavailable(f"etcd did not answer {path}: {'; '.join(problems)}")

    async def _one(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        kind: type[Any],
        *,
        leader: bool = True,
        timeout_s: float | None = None,
    ) -> Any:
        session = self._open()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            if self._auth is not None and self._token is None:
                await self._authenticate(url)
            async with session.post(
                url + path,
                json=body,
                headers=self._headers(leader),
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as reply:
                data = await reply.read()
        except TimeoutError:
            raise EtcdUnavailable(f"{url}: no answer within {timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            code = exc.os_error.errno
            why = os.strerror(code).lower() if code else str(exc.os_error)
            raise EtcdUnavailable(f"{url}: cannot connect ({why})") from None
        except aiohttp.ClientError as exc:
            raise EtcdUnavailable(f"{url}: {type(exc).__name__} {exc}".strip()) from None
        if reply.status >= 500 or reply.status == 408:
            raise EtcdUnavailable(f"{url} answered {reply.status}: {_message(data)}")
        if reply.status == 401 and self._token is not None:
            # etcd's tokens expire (--auth-token-ttl, 300 s by default): authenticate again
            self._token = None
            raise EtcdUnavailable(f"{url}: auth token expired ({_message(data)})")
        if reply.status != 200:
            message = f"etcd refused {path} ({reply.status}): {_message(data)}"
            if reply.status in (401, 403) or b"user name is empty" in data:
                raise EtcdAuthRefused(message)
            raise EtcdRefused(message)
        try:
            return msgspec.json.decode(data, type=kind, strict=False)
        except msgspec.DecodeError:  # ValidationError included
            raise EtcdUnavailable(f"{url} answered what is not etcd's JSON") from None

    async def _authenticate(self, url: str) -> None:
        assert self._auth is not None
        user, password = self._auth
        async with self._open().post(
            url + "/v3/auth/authenticate",
            json={"name": user, "password": password or ""},
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        ) as reply:
            data = await reply.read()
        if reply.status != 200:
            raise EtcdAuthRefused(f"etcd refused user {user!r}: {_message(data)}")
        try:
            self._token = msgspec.json.decode(data, type=_Token).token
        except msgspec.DecodeError:
            raise EtcdUnavailable(f"{url} answered an authentication with no token") from None

    def _headers(self, leader: bool = True) -> dict[str, str]:
        headers = dict(REQUIRE_LEADER) if leader else {}
        if self._token is not None:
            headers["Authorization"] = self._token
        return headers

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Etcd is used outside `async with`")
        return self._session


MESSAGE_MAX = 200
"""Characters of an error body a message keeps."""


def _message(data: bytes) -> str:
    """etcd's error text from a gateway error body ({"error": ..., "message": ...}), else the
    start of the body (whatever answered may not be etcd: an HTML page), on one line."""
    try:
        body = msgspec.json.decode(data)
    except msgspec.DecodeError:
        body = None
    text = body.get("message") or body.get("error") if isinstance(body, dict) else None
    if not isinstance(text, str):
        text = data[: MESSAGE_MAX * 4].decode("utf-8", "replace")
    text = " ".join(text.split())
    if len(text) > MESSAGE_MAX:
        text = text[:MESSAGE_MAX] + "..."
    return text or "no reason given"
