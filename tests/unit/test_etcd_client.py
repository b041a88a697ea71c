"""The etcd client's answers to a member that misbehaves (`cluster.etcd`): HTTP servers on
loopback that answer what a broken or hostile member might, beside one that answers as etcd's
gateway does. Each bad answer is an `EtcdUnavailable` that moves to the next endpoint, or an
`EtcdRefused` with etcd's own text, never a decoding traceback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from orchestra_sup.cluster.etcd import Etcd, EtcdRefused, EtcdUnavailable, prefix_end

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(answer: Answer) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def good(request: web.Request) -> web.Response:
    """What etcd's gateway answers to a range of one key: header, kvs, int64s as strings."""
    kv = {"key": "YQ==", "value": "MQ==", "create_revision": "7", "mod_revision": "9"}
    return web.json_response({"header": {"revision": "9"}, "kvs": [kv], "count": "1"})


async def garbage(request: web.Request) -> web.Response:
    return web.Response(body=b"\x00<html>not etcd", content_type="text/html")


async def wrong_shape(request: web.Request) -> web.Response:
    return web.json_response({"kvs": "not a list", "header": []})


async def refused(request: web.Request) -> web.Response:
    body = {
        "error": "etcdserver: permission denied",
        "code": 7,
        "message": "etcdserver: permission denied",
    }
    return web.json_response(body, status=403)


async def no_leader(request: web.Request) -> web.Response:
    return web.json_response(
        {"error": "etcdserver: no leader", "message": "etcdserver: no leader"}, status=503
    )


def run(answers: list[Answer], body: Callable[[Etcd], Awaitable[object]]) -> object:
    async def main() -> object:
        served = [await serve(a) for a in answers]
        try:
            urls = [url for _, url in served]
            async with Etcd(urls, timeout_s=2.0, watch_quiet_s=0.5) as etcd:
                return await body(etcd)
        finally:
            for runner, _ in served:
                await runner.cleanup()

    return asyncio.run(main())


@pytest.mark.parametrize("bad", [garbage, wrong_shape, no_leader], ids=["garbage", "shape", "503"])
def test_a_bad_answer_moves_to_the_next_endpoint(bad: Answer) -> None:
    async def body(etcd: Etcd) -> object:
        return await etcd.get(b"a")

    kv = run([bad, good], body)
    assert kv is not None and (kv.value, kv.create_revision) == (b"1", 7)  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [garbage, wrong_shape, no_leader], ids=["garbage", "shape", "503"])
def test_every_endpoint_bad_is_unavailable_in_one_line(bad: Answer) -> None:
    async def body(etcd: Etcd) -> object:
        with pytest.raises(EtcdUnavailable) as caught:
            await etcd.get(b"a")
        return str(caught.value)

    message = run([bad, bad], body)
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith("etcd did not answer /v3/kv/range: http://127.0.0.1:")


def test_a_refusal_carries_etcds_words_and_is_not_retried_elsewhere() -> None:
    async def body(etcd: Etcd) -> object:
        with pytest.raises(
            EtcdRefused, match=r"etcd refused /v3/kv/put \(403\): etcdserver: permission denied"
        ):
            await etcd.put(b"a", b"1")
        return True

    assert run([refused, good], body)


async def html_page(request: web.Request) -> web.Response:
    page = "<!DOCTYPE HTML>\n<html>\n<body>\n" + "Not Found " * 100 + "</body></html>"
    return web.Response(text=page, status=404, content_type="text/html")


async def empty_404(request: web.Request) -> web.Response:
    return web.Response(status=404)


@pytest.mark.parametrize("bad", [html_page, empty_404], ids=["html", "empty"])
def test_what_is_not_etcd_is_refused_in_one_short_line_with_its_status(bad: Answer) -> None:
    async def body(etcd: Etcd) -> object:
        with pytest.raises(EtcdRefused) as caught:
            await etcd.get(b"a")
        return str(caught.value)

    message = run([bad], body)
    assert isinstance(message, str) and "\n" not in message and len(message) < 260, message
    assert message.startswith("etcd refused /v3/kv/range (404): "), message
    assert message.endswith(("...", "no reason given")), message


async def garbled_watch(request: web.Request) -> web.StreamResponse:
    reply = web.StreamResponse()
    await reply.prepare(request)
    await reply.write(b'{"result": {"created": true}}\n{"result": {"events": 12}}\n')
    await reply.write_eof()
    return reply


async def good_watch(request: web.Request) -> web.StreamResponse:
    reply = web.StreamResponse()
    await reply.prepare(request)
    start = int(json.loads(await request.read())["create_request"]["start_revision"])
    event = {"kv": {"key": "YQ==", "value": "MQ==", "mod_revision": str(start)}}
    await reply.write(b'{"result": {"created": true}}\n')
    await reply.write(json.dumps({"result": {"events": [event]}}).encode() + b"\n")
    await asyncio.sleep(1.0)  # a watch stays open (long enough for the client to read)
    return reply


def test_a_garbled_watch_goes_on_at_the_next_endpoint_from_the_same_revision() -> None:
    async def body(etcd: Etcd) -> object:
        async for event in etcd.watch_prefix(b"a", 42):
            return (event.kind, event.kv.key, event.kv.mod_revision)
        return None

    assert run([garbled_watch, good_watch], body) == ("PUT", b"a", 42)


def test_prefix_end() -> None:
    assert prefix_end(b"/hosts/") == b"/hosts0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"  # every key


async def compacted_watch(request: web.Request) -> web.StreamResponse:
    """What etcd sends a watch from a compacted revision: created, then canceled with the
    oldest revision it keeps."""
    reply = web.StreamResponse()
    await reply.prepare(request)
    await reply.write(b'{"result": {"created": true}}\n')
    await reply.write(b'{"result": {"canceled": true, "compact_revision": "6"}}\n')
    await reply.write_eof()
    return reply


def test_a_compacted_watch_is_refused_at_once_not_retried_for_ever() -> None:
    async def body(etcd: Etcd) -> object:
        with pytest.raises(EtcdRefused, match=r"compacted .* \(oldest kept: 6\): read afresh"):
            async for _ in etcd.watch_prefix(b"a", 2):
                pass
        return True

    assert run([compacted_watch, compacted_watch], body)


async def frozen_watch(request: web.Request) -> web.StreamResponse:
    """A member that takes the connection and never says a word (SIGSTOPped: the kernel still
    accepts for it)."""
    reply = web.StreamResponse()
    await reply.prepare(request)
    await asyncio.sleep(4)
    return reply


def test_a_watch_on_a_silent_member_goes_on_at_the_next() -> None:
    """Quiet for 0.5 s here: the next member's event arrives long before the frozen one would
    let its connection go (4 s)."""

    async def first(etcd: Etcd) -> object:
        async for event in etcd.watch_prefix(b"a", 42):
            return event.kv.mod_revision
        return None

    async def body(etcd: Etcd) -> object:
        return await asyncio.wait_for(first(etcd), 2.5)

    assert run([frozen_watch, good_watch], body) == 42


def test_a_quiet_watch_on_its_only_endpoint_is_taken_again_not_given_up() -> None:
    """One endpoint, a watch with nothing to say for longer than the quiet period (0.5 s
    here): it is taken again at the same member, and the change that comes next is seen."""
    watches: list[int] = []

    async def quiet_then_event(request: web.Request) -> web.StreamResponse:
        watches.append(1)
        reply = web.StreamResponse()
        await reply.prepare(request)
        await reply.write(b'{"result": {"created": true}}\n')
        if len(watches) >= 3:
            event = {"kv": {"key": "YQ==", "value": "MQ==", "mod_revision": "7"}}
            await reply.write(json.dumps({"result": {"events": [event]}}).encode() + b"\n")
        await asyncio.sleep(1.0)
        return reply

    async def body(etcd: Etcd) -> object:
        async for event in etcd.watch_prefix(b"a", 7):
            return event.kv.mod_revision
        return None

    assert run([quiet_then_event], body) == 7
    assert len(watches) == 3
