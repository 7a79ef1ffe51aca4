"""The API port's own HTTP/1.1 (delaywheel/httpapi/wire.py) and its router, in-process:
heads as RFC 9112 has them (and the smuggler's tricks refused), chunked bodies, the
routes, and a real listener on port 0: pipelining, 100-continue, HEAD, HTTP/1.0, a
malformed request, a body over the limit, a long poll held and left."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.httpapi.operations import OPERATIONS
from delaywheel.httpapi.routes import Router
from delaywheel.httpapi.site import HttpApi
from delaywheel.httpapi.wire import Chunks, Malformed, parse_head
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore

# -- heads ----------------------------------------------------------------------------------


def test_a_head_is_read_as_rfc_9112_has_it() -> None:
    head = parse_head(
        b"POST /v1/tasks?x=1&y=%20 HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n"
        b"X-Twice: first\r\nx-twice: second\r\nAuthorization:  Bearer t \r\n"
        b"Expect: 100-Continue"
    )
    assert (head.method, head.path, head.query) == ("POST", "/v1/tasks", "x=1&y=%20")
    assert head.length == 12 and head.keep_alive and head.expect_continue
    assert head.headers["x-twice"] == "first" and head.headers["authorization"] == "Bearer t"
    absolute = parse_head(b"GET http://example.com:8081/v1/ping HTTP/1.1\r\nHost: x")
    assert absolute.path == "/v1/ping" and absolute.length == 0
    assert parse_head(b"GET http://example.com HTTP/1.1").path == "/"


@pytest.mark.parametrize(
    ("connection", "version", "kept"),
    [
        ("", "1.1", True),
        ("close", "1.1", False),
        ("Keep-Alive, Close", "1.1", False),
        ("", "1.0", False),
        ("keep-alive", "1.0", True),
    ],
)
def test_keep_alive_follows_the_version(connection: str, version: str, kept: bool) -> None:
    field = f"\r\nConnection: {connection}" if connection else ""
    head = parse_head(f"GET / HTTP/{version}{field}".encode())
    assert head.keep_alive is kept


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (b"GET /", "METHOD TARGET VERSION"),
        (b"GET  / HTTP/1.1", "METHOD TARGET VERSION"),
        (b"G(T / HTTP/1.1", "method"),
        (b"GET / HTTP/2.0", "version"),
        (b"GET /\x7f HTTP/1.1", "request target"),
        (b"GET / HTTP/1.1\r\nBad Name: x", "NAME: VALUE"),
        (b"GET / HTTP/1.1\r\nName : x", "NAME: VALUE"),  # a space before the colon
        (b"GET / HTTP/1.1\r\nA: b\r\n folded", "NAME: VALUE"),  # obsolete line folding
        (b"GET / HTTP/1.1\r\nA: b\nC: d", "control byte"),  # a bare LF
        (b"GET / HTTP/1.1\r\nA: b\rc", "control byte"),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", "both"),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6", "one number"),
        (b"POST / HTTP/1.1\r\nContent-Length: +5", "one number"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked", "other than chunked"),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked", "other than chunked"),
        (b"GET / HTTP/1.1" + b"\r\nA: b" * 101, "header fields"),
    ],
)
def test_a_malformed_head_is_refused_naming_the_part(raw: bytes, names: str) -> None:
    with pytest.raises(Malformed, match=names):
        parse_head(raw)


def test_the_same_content_length_twice_is_one() -> None:
    head = parse_head(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5")
    assert head.length == 5


# -- chunked bodies ---------------------------------------------------------------------------


def test_a_chunked_body_is_decoded_as_it_arrives() -> None:
    wire = (
        b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\nNEXT"
    )
    chunks, buffer = Chunks(), bytearray()
    for i in range(len(wire)):  # a byte at a time: every state waits for the rest
        buffer.append(wire[i])
        if chunks.feed(buffer, 1000):
            break
    assert bytes(chunks.body) == b"Wikipedia in\r\n\r\nchunks." and wire[i + 1 :] == b"NEXT"
    whole, buffer = Chunks(), bytearray(wire)
    assert whole.feed(buffer, 1000) and whole.body == chunks.body
    assert bytes(buffer) == b"NEXT"  # the next request's bytes are left


@pytest.mark.parametrize(
    ("wire", "names"),
    [(b"zz\r\n", "hex"), (b"3\r\nabcX\r\n", "CRLF"), (b"1" * 5000, "chunk line")],
)
def test_a_bad_chunk_is_malformed(wire: bytes, names: str) -> None:
    with pytest.raises(Malformed, match=names):
        Chunks().feed(bytearray(wire), 1_000_000)


# -- routes -----------------------------------------------------------------------------------


def test_the_router_matches_one_segment_per_param_decoded() -> None:
    router = Router(OPERATIONS)
    op, params = router.match("GET", "/v1/tasks/a%2Fb%20c%25d")  # type: ignore[misc]
    assert op.op_id == "getTask" and params == {"id": "a/b c%d"}
    op, params = router.match("POST", "/v1/schedules/preview")  # type: ignore[misc]
    assert op.op_id == "previewSchedule" and params == {}
    op, params = router.match("GET", "/v1/schedules/preview")  # type: ignore[misc]
    assert op.op_id == "getSchedule" and params == {"id": "preview"}
    assert router.match("PUT", "/v1/tasks/x") == 405
    assert router.match("GET", "/v1/tasks/x/y/z") == 404
    assert router.match("GET", "/v1/tasks//ack") == 404  # an empty param
    assert router.match("GET", "/v1/%74asks") is not None  # a literal may be encoded too


# -- a listener on port 0 ---------------------------------------------------------------------


@asynccontextmanager
async def api_port(**settings: object) -> AsyncIterator[tuple[HttpApi, tuple[str, int]]]:
    store = MemoryStore("memory://")
    await store.open()
    config = Settings(store_url="memory://", message_timeout_s=5.0, **settings)  # type: ignore[arg-type]
    engine = Engine(store, now_s=time.time(), tick_s=config.tick_s, limits=config.limits)
    api = HttpApi(Server(config, engine))
    try:
        yield api, await api.start("127.0.0.1", 0, None)
    finally:
        await api.stop()
        await store.close()


def on_port(
    scenario: Callable[[HttpApi, tuple[str, int]], Awaitable[None]], **settings: object
) -> None:
    async def main() -> None:
        async with api_port(**settings) as (api, address):
            await asyncio.wait_for(scenario(api, address), 20)

    asyncio.run(main())


@asynccontextmanager
async def connected(
    address: tuple[str, int],
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(*address)
    try:
        yield reader, writer
    finally:
        writer.close()
        await writer.wait_closed()


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One reply: its status, headers (lower-cased names) and body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    fields = dict(line.split(": ", 1) for line in head[1:] if line)
    headers = {name.lower(): value for name, value in fields.items()}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def test_pipelined_requests_are_answered_in_order() -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        body = b'{"topic": "piped", "id": "p1"}'
        async with connected(address) as (reader, writer):
            writer.write(
                b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                b"GET /v1/tasks/p1 HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /v1/ping HTTP/1.1\r\nHost: x\r\n\r\n" % (len(body), body)
            )
            added, got, ping = [await read_reply(reader) for _ in range(3)]
        assert added[0] == 201 and json.loads(added[2])["id"] == "p1"
        assert got[0] == 200 and json.loads(got[2])["topic"] == "piped"
        assert ping[0] == 200 and json.loads(ping[2]) == {"ping": "pong"}

    on_port(scenario)


def test_chunked_bodies_and_100_continue() -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        async with connected(address) as (reader, writer):
            writer.write(
                b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'9\r\n{"topic":\r\n8\r\n "chunk"\r\n1\r\n}\r\n0\r\n\r\n'
            )
            status, headers, _ = await read_reply(reader)
            assert status == 201 and headers["content-type"] == "application/json"
            writer.write(
                b"POST /v1/tasks HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 17\r\n\r\n"
            )
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b'{"topic": "late"}')
            assert (await read_reply(reader))[0] == 201

    on_port(scenario)


def test_head_http_1_0_and_what_closes_the_connection() -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        async with connected(address) as (reader, writer):
            writer.write(b"HEAD /v1/ping HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 405 ") and b"Content-Length: " in head
            writer.write(b"GET /v1/ping HTTP/1.0\r\n\r\n")  # no body came with the HEAD
            status, headers, _ = await read_reply(reader)
            assert status == 200 and headers["connection"] == "close"
            assert await reader.read() == b""  # closed
        for request, status in [
            (b"POST /v1/tasks HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
            (b"POST /v1/tasks HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", 413),
        ]:
            async with connected(address) as (reader, writer):
                writer.write(request)
                got, headers, body = await read_reply(reader)
                assert got == status and headers["connection"] == "close", body
                assert json.loads(body)["status"] == status
                assert await reader.read() == b""
        assert api._listener is not None and api._listener.malformed.count == 1

    on_port(scenario, max_message_bytes=65536, max_body_bytes=16384)


def test_a_long_poll_is_held_in_the_line_and_left_when_its_client_goes() -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        engine = api.server.engine
        poll = b"POST /v1/topics/held/reserve?timeout=30 HTTP/1.1\r\n\r\n"
        async with connected(address) as (reader, writer):
            async with connected(address) as (_, gone):
                gone.write(poll)
                writer.write(poll)
                while engine.queues.waiter_count() < 2:
                    await asyncio.sleep(0.01)
                assert len(api.calls.reserves.waiting) == 2  # a timer and a callback each
            while engine.queues.waiter_count() > 1:  # the one whose client went left
                await asyncio.sleep(0.01)
            engine.add({"topic": "held", "id": "for-the-one-left"}, time.time())
            status, _, body = await read_reply(reader)
            assert status == 200 and json.loads(body)["id"] == "for-the-one-left"
            writer.write(b"POST /v1/topics/held/reserve?timeout=0.05 HTTP/1.1\r\n\r\n")
            assert (await read_reply(reader))[0] == 204  # the same connection, again

    on_port(scenario)
