"""Server behaviour that needs a hand on the inside: a fault injected into the
engine, or settings too small for a subprocess test to wait out. The server
still listens on a real port and is spoken to over real sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgpack
from helpers import run

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore


@asynccontextmanager
async def running(**settings: Any) -> AsyncIterator[tuple[Server, tuple[str, int]]]:
    config = Settings(port=0, store_url="memory://", tick_s=0.05, **settings)
    store = MemoryStore("memory://")
    await store.open()
    engine = Engine(store, now_s=time.time(), tick_s=config.tick_s, limits=config.limits)
    server = Server(config, engine)
    address = await server.start()
    try:
        yield server, address
    finally:
        await server.stop()
        await store.close()


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.unpacker = msgpack.Unpacker(raw=False)

    @classmethod
    async def open(cls, address: tuple[str, int]) -> Peer:
        return cls(*await asyncio.open_connection(*address))

    async def recv(self) -> Any:
        while True:
            for message in self.unpacker:
                return message
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            if not data:
                return None  # closed
            self.unpacker.feed(data)

    async def call(self, msgid: int, method: str, *params: Any) -> Any:
        self.writer.write(msgpack.packb([0, msgid, method, list(params)]))
        return await self.recv()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def test_a_bug_in_a_handler_answers_internal_and_the_server_goes_on() -> None:
    async def scenario() -> None:
        async with running() as (server, address):

            def broken(conn: Any, params: list[Any], now_s: float) -> Any:
                raise RuntimeError(f"bug while getting {params[0]}")

            server.routes["get"].run = broken
            peer = await Peer.open(address)
            reply = await peer.call(1, "get", "x")
            assert reply[2][0] == "internal" and "bug while getting x" in reply[2][1]
            assert await peer.call(2, "ping") == [1, 2, None, "pong"]
            await peer.close()

    run(scenario)


def test_a_half_sent_message_is_cut_off_after_the_message_timeout() -> None:
    async def scenario() -> None:
        async with running(message_timeout_s=0.3) as (_, address):
            slow = await Peer.open(address)
            slow.writer.write(msgpack.packb([0, 1, "add", [{"topic": "t"}]])[:-2])
            busy = await Peer.open(address)
            for i in range(10):  # a busy, well-behaved peer is never cut off
                assert (await busy.call(i, "ping"))[3] == "pong"
                await asyncio.sleep(0.1)
            notification = await slow.recv()
            assert notification[:2] == [2, "error"] and notification[2][0] == "bad_request"
            assert "no complete message" in notification[2][1]
            assert await slow.recv() is None
            await busy.close()
            await slow.close()

    run(scenario)


def test_connections_over_the_limit_are_refused_with_a_reason() -> None:
    async def scenario() -> None:
        async with running(max_connections=2) as (_, address):
            first, second = await Peer.open(address), await Peer.open(address)
            assert (await first.call(1, "ping"))[3] == "pong"
            third = await Peer.open(address)
            refused = await third.recv()
            assert refused == [2, "error", ["unavailable", "too many connections (limit 2)"]]
            assert (await second.call(2, "ping"))[3] == "pong"
            for peer in (first, second, third):
                await peer.close()

    run(scenario)


def test_auth_gates_everything_but_ping_and_auth() -> None:
    async def scenario() -> None:
        async with running(token="s3cret") as (_, address):
            peer = await Peer.open(address)
            assert (await peer.call(1, "ping"))[3] == "pong"
            for msgid, method, params in [(2, "get", ["x"]), (3, "reserve", [["t"], 0])]:
                reply = await peer.call(msgid, method, *params)
                assert reply[2][0] == "unauthorized"
            assert (await peer.call(4, "auth", "wrong"))[2] == ["unauthorized", "wrong token"]
            assert (await peer.call(5, "auth", "s3cret"))[3] is True
            assert (await peer.call(6, "get", "x"))[2:] == [None, None]
            await peer.close()

    run(scenario)
