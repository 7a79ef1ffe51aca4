"""The API port's HTTP/1.1 (delaywheel/httpapi/wire.py, over httptools) and its router,
in-process, on a real listener on port 0: heads as RFC 9112 has them (and the smuggler's
tricks refused), chunked bodies, keep-alive, pipelining, 100-continue, HEAD, HTTP/1.0,
malformed requests, a body over the limit, a long poll held and left."""

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
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore

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


async def exchange(address: tuple[str, int], raw: bytes) -> tuple[int, bytes, bool]:
    """``raw`` sent on a connection of its own: the reply's status and body, and
    whether the server closed the connection after it."""
    async with connected(address) as (reader, writer):
        writer.write(raw)
        status, _, body = await read_reply(reader)
        closed = await asyncio.wait_for(reader.read(), 5) == b""
    return status, body, closed


# -- heads --------------------------------------------------------------------------------


def test_a_head_is_read_as_rfc_9112_has_it() -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        api.server.engine.add({"topic": "a b", "id": "spaced"}, time.time())
        # The query decoded, each name's first value; a header's first value, its
        # spaces trimmed, its name's case ignored.
        status, body, closed = await exchange(
            address,
            b"GET /v1/tasks?topic=a%20b&limit=5&topic=other HTTP/1.1\r\nHost: x\r\n"
            b"Authorization:  Bearer t \r\nauthorization: Bearer wrong\r\n"
            b"Connection: close\r\n\r\n",
        )
        assert status == 200 and closed, body
        assert [task["id"] for task in json.loads(body)["tasks"]] == ["spaced"]
        # The absolute form: the path is what follows the authority.
        for target, expected in [(b"http://example.com:8081/v1/ping", 200), (b"http://h", 404)]:
            raw = (
                b"GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                b"Connection: close\r\n\r\n" % target
            )
            status, body, _ = await exchange(address, raw)
            assert status == expected, body
        assert json.loads(body)["instance"] == "/"

    on_port(scenario, token="t")


@pytest.mark.parametrize(
    ("connection", "version", "kept"),
    [
        ("", "1.1", True),
        ("close", "1.1", False),
        ("Keep-Alive, Close", "1.1", False),
        ("", "1.0", False),
        ("keep-alive", "1.0", False),  # no HTTP/1.0 connection is kept
    ],
)
def test_keep_alive_follows_the_version(connection: str, version: str, kept: bool) -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        field = f"Connection: {connection}\r\n" if connection else ""
        raw = f"GET /v1/ping HTTP/{version}\r\nHost: x\r\n{field}\r\n".encode()
        async with connected(address) as (reader, writer):
            writer.write(raw)
            status, headers, _ = await read_reply(reader)
            assert status == 200 and (headers.get("connection") != "close") is kept
            if kept:
                writer.write(raw)
                assert (await read_reply(reader))[0] == 200
            else:
                assert await asyncio.wait_for(reader.read(), 5) == b""

    on_port(scenario)


# Requests refused, each on a connection of its own: the status, a word of the detail
# (llhttp's reason, or ours).
MALFORMED = [
    (b"GET /\r\n\r\n", 505, "0.9"),  # HTTP/0.9's request line: llhttp reads version 0.9
    (b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method"),
    (b"GET /\x7f HTTP/1.1\r\nHost: x\r\n\r\n", 400, "url"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "method"),  # TLS
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "version"),
    (b"GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505, "version"),
    (b"GET / HTTP/1.1\r\n\r\n", 400, "Host"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: x\r\n\r\n", 400, "header token"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nName : x\r\n\r\n", 400, "header token"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nA: b\rc\r\n\r\n", 400, "LF"),
    # Strict: no leniency of llhttp's is on. RFC 9112 lets a server read a bare LF as
    # a line's end (2.2) and unfold a folded field (5.2), or refuse them: refused.
    (b"GET /v1/ping HTTP/1.1\nHost: x\n\n", 400, "CRLF"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n folded\r\n\r\n", 400, "whitespace"),
    (b"GET / HTTP/1.1\r\nHost: x" + b"\r\nA: b" * 101 + b"\r\n\r\n", 431, "fields"),
    # Refused once the bytes wholly within the head pass 16 kB: by 20 kB at the latest.
    (b"GET / HTTP/1.1\r\nHost: x\r\nA: " + b"b" * 21_000, 431, "too long"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n", 501, "upgrade"),
    (b"CONNECT x:1 HTTP/1.1\r\nHost: x\r\n\r\n", 501, "upgrade"),
    # The smuggler's framing: two lengths (even equal ones: RFC 9112 6.3 lets a server
    # read those, llhttp refuses them), a length beside chunks, codings that a proxy in
    # front may read otherwise.
    (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
        400,
        "Content-Length",
    ),
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n", 400, "Content-Length"),
    (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        501,
        "chunked",
    ),
    # A coding named twice: llhttp refuses it as framing (400) where h11 answered 501.
    (
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        400,
        "Transfer-Encoding",
    ),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"),
    # Chunks: a size that is not hex, a chunk that does not end with CRLF.
    (
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        400,
        "chunk size",
    ),
    (
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
        400,
        "chunk data",
    ),
]


def test_a_malformed_request_is_a_problem_and_closes_its_connection() -> None:
    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        for raw, status, names in MALFORMED:
            got, body, closed = await exchange(address, raw)
            document = json.loads(body)
            assert (got, document["status"], closed) == (status, status, True), (raw, body)
            assert names in document["detail"], (raw, document)
            assert document["code"] == "bad_request"
        assert api._listener is not None and api._listener.malformed.count == len(MALFORMED)

    on_port(scenario)


def test_what_rfc_9112_lets_a_server_read_is_read() -> None:
    """An empty line before a request (skipped, RFC 9112 2.2), two spaces between the
    request line's parts (read on word boundaries, 3): llhttp reads them."""

    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        for raw in [
            b"\r\nGET /v1/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET  /v1/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ]:
            status, body, _ = await exchange(address, raw)
            assert status == 200, (raw, body)

    on_port(scenario)


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
            # Sent five bytes at a time, cutting size lines, chunks and their CRLFs;
            # extensions and a trailer field read past; the next request's bytes left.
            chunks = [b'{"topic": "c', b'hunk", "i', b'd": "ck"}']
            wire = b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            wire += b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks)
            wire += b"0\r\nTrailer: x\r\n\r\nGET /v1/tasks/ck HTTP/1.1\r\nHost: x\r\n\r\n"
            for i in range(0, len(wire), 5):
                writer.write(wire[i : i + 5])
                await writer.drain()
                await asyncio.sleep(0.001)
            status, headers, _ = await read_reply(reader)
            assert status == 201 and headers["content-type"] == "application/json"
            status, _, body = await read_reply(reader)
            assert status == 200 and json.loads(body)["topic"] == "chunk"
            writer.write(
                b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                b"Content-Length: 17\r\n\r\n"
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
        post = b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n"
        for request, status in [
            (post + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
            (post + b"Content-Length: 999999\r\n\r\n", 413),
            # Chunks past the limit: 413 as the byte over it comes (the last sent).
            (post + b"Transfer-Encoding: chunked\r\n\r\n10001\r\n" + b"x" * 65537, 413),
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
        poll = b"POST /v1/topics/held/reserve?timeout=30 HTTP/1.1\r\nHost: x\r\n\r\n"
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
            writer.write(b"POST /v1/topics/held/reserve?timeout=0.05 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_reply(reader))[0] == 204  # the same connection, again

    on_port(scenario)


def test_a_held_long_poll_answers_as_its_request_asked() -> None:
    """A waiting long poll lets its parser go (wire.py ``_start``): its reply still
    closes the connection when the request asked, and a request sent while it waits,
    or with it, is answered after it."""

    async def scenario(api: HttpApi, address: tuple[str, int]) -> None:
        engine = api.server.engine
        for version, field in [("1.1", "Connection: close\r\n"), ("1.0", "")]:
            async with connected(address) as (reader, writer):
                writer.write(
                    f"POST /v1/topics/held/reserve?timeout=0.05 HTTP/{version}\r\n"
                    f"Host: x\r\n{field}\r\n".encode()
                )
                status, headers, _ = await read_reply(reader)
                assert (status, headers["connection"]) == (204, "close")
                assert await reader.read() == b""
        poll = b"POST /v1/topics/held/reserve?timeout=30 HTTP/1.1\r\nHost: x\r\n\r\n"
        ping = b"GET /v1/ping HTTP/1.1\r\nHost: x\r\n\r\n"
        async with connected(address) as (reader, writer):
            for sent in ([poll, ping], [poll + ping]):  # the ping after the wait, or with it
                writer.write(sent[0])
                while engine.queues.waiter_count() < 1:
                    await asyncio.sleep(0.01)
                for more in sent[1:]:
                    writer.write(more)
                await asyncio.sleep(0.02)
                engine.add({"topic": "held"}, time.time())
                assert (await read_reply(reader))[0] == 200
                status, _, body = await read_reply(reader)
                assert status == 200 and json.loads(body) == {"ping": "pong"}

    on_port(scenario)
