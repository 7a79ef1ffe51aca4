"""The HTTP API's add against the native protocol's, in one run on one server.

One ``delaywheel serve --store memory:// --api-port P`` (the memory store: what is
measured is the way in, not the store). Four loads, each adding tasks of the same
100-character str body to one topic for ``seconds``:

- ``http_one``: ``POST /v1/tasks`` one at a time on one keep-alive connection. The
  client is a raw socket sending the same request bytes each time and reading the
  reply's head and ``Content-Length`` bytes: as little client as HTTP allows, so that
  the figure is the server's.
- ``http_8``: the same from 8 connections at once (8 asyncio streams in this process).
- ``native_one``: the Python ``Client.add``, one at a time on one connection.
- ``native_8``: 8 ``AsyncClient``s adding at once, one call in flight each.

Loads alternate round by round (``rounds`` of each); each figure is the median round,
every round listed, with the server's CPU per add (``/proc/PID/stat`` around the
round) beside it, and the HTTP/native ratio of each pair. The client and the server
share the machine's CPUs, as they would. ``run(quick=True)``: 0.3 s rounds, one each.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from delaywheel_client import AsyncClient, Client

from bench import Figure, Report, progress
from bench._loads import cpu_s
from bench._procs import free_port, server_process

TOPIC = "bench-http"
BODY = "x" * 100
CONCURRENCY = 8
WARMUP_CALLS = 50


@dataclass(frozen=True)
class Plan:
    seconds: float
    rounds: int


FULL = Plan(seconds=4.0, rounds=3)
QUICK = Plan(seconds=0.3, rounds=1)


def _request(port: int) -> bytes:
    body = json.dumps({"topic": TOPIC, "body": BODY, "delay": 3600}).encode()
    head = (
        f"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            return int(line[15:])
    raise RuntimeError(f"no Content-Length in {head!r}")


class RawHttp:
    """One keep-alive connection sending the same request and reading each reply."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = _request(port)
        self.buffer = b""

    def add(self) -> None:
        self.sock.sendall(self.request)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 201"):
            raise RuntimeError(f"add over HTTP failed: {head!r}")
        length = _content_length(head)
        while len(rest) < length:
            rest += self._recv()
        self.buffer = rest[length:]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


@contextmanager
def load_http_add(port: int) -> Iterator[tuple[Callable[[], None], int]]:
    """``RawHttp.add`` as a load of bench/tools/callgrind.py (``http_add``): one
    ``POST /v1/tasks`` a call on one keep-alive connection to the API port ``port``."""
    http = RawHttp(port)
    try:
        yield http.add, 1
    finally:
        http.close()


def _timed(step: Callable[[], object], seconds: float) -> int:
    deadline = time.perf_counter() + seconds
    done = 0
    while time.perf_counter() < deadline:
        for _ in range(50):
            step()
        done += 50
    return done


def http_one(port: int, seconds: float) -> int:
    client = RawHttp(port)
    try:
        for _ in range(WARMUP_CALLS):
            client.add()
        return _timed(client.add, seconds)
    finally:
        client.close()


async def _http_worker(port: int, seconds: float, start: asyncio.Event) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = _request(port)

    async def add() -> None:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 201"):
            raise RuntimeError(f"add over HTTP failed: {head!r}")
        await reader.readexactly(_content_length(head))

    try:
        for _ in range(WARMUP_CALLS):
            await add()
        await start.wait()
        deadline = time.perf_counter() + seconds
        done = 0
        while time.perf_counter() < deadline:
            await add()
            done += 1
        return done
    finally:
        writer.close()


async def _native_worker(address: tuple[str, int], seconds: float, start: asyncio.Event) -> int:
    async with AsyncClient(*address) as dw:
        for _ in range(WARMUP_CALLS):
            await dw.add(TOPIC, BODY, delay=3600)
        await start.wait()
        deadline = time.perf_counter() + seconds
        done = 0
        while time.perf_counter() < deadline:
            await dw.add(TOPIC, BODY, delay=3600)
            done += 1
        return done


async def _concurrent(workers: list[asyncio.Task[int]], start: asyncio.Event) -> int:
    await asyncio.sleep(0.2)  # every worker connected and warmed up
    start.set()
    return sum(await asyncio.gather(*workers))


def http_many(port: int, seconds: float) -> int:
    async def main() -> int:
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(_http_worker(port, seconds, start)) for _ in range(CONCURRENCY)
        ]
        return await _concurrent(tasks, start)

    return asyncio.run(main())


def native_one(address: tuple[str, int], seconds: float) -> int:
    with Client(*address) as dw:
        for _ in range(WARMUP_CALLS):
            dw.add(TOPIC, BODY, delay=3600)
        return _timed(lambda: dw.add(TOPIC, BODY, delay=3600), seconds)


def native_many(address: tuple[str, int], seconds: float) -> int:
    async def main() -> int:
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(_native_worker(address, seconds, start)) for _ in range(CONCURRENCY)
        ]
        return await _concurrent(tasks, start)

    return asyncio.run(main())


@dataclass
class Rounds:
    rates: list[float]
    cpu_us: list[float]


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    api_port = free_port()
    args = ("--api-port", str(api_port), "--api-max-requests", "1024")
    with server_process("memory://", args=args) as (pid, address):
        loads = {
            "http_one": lambda: http_one(api_port, plan.seconds),
            "native_one": lambda: native_one(address, plan.seconds),
            "http_8": lambda: http_many(api_port, plan.seconds),
            "native_8": lambda: native_many(address, plan.seconds),
        }
        results = {name: Rounds([], []) for name in loads}
        for round_no in range(plan.rounds):
            for name, load in loads.items():
                progress(f"round {round_no + 1}/{plan.rounds}: {name}")
                cpu_before = cpu_s(pid)
                done = load()  # adds within plan.seconds (the warm-up's CPU is counted too)
                results[name].rates.append(done / plan.seconds)
                results[name].cpu_us.append((cpu_s(pid) - cpu_before) / done * 1e6)
    labels = {
        "http_one": "HTTP POST /v1/tasks, one at a time (keep-alive)",
        "native_one": "native add, one at a time (Client)",
        "http_8": f"HTTP POST /v1/tasks, {CONCURRENCY} connections",
        "native_8": f"native add, {CONCURRENCY} connections (AsyncClient)",
    }
    figures: list[Figure] = []
    median = {name: statistics.median(r.rates) for name, r in results.items()}
    for name, rounds in results.items():
        figures.append(
            Figure(
                f"{name}_rate",
                labels[name],
                median[name],
                "adds/s",
                runs=tuple(rounds.rates),
                note=f"server CPU {statistics.median(rounds.cpu_us):.0f} us/add",
            )
        )
    for kind in ("one", "8"):
        figures.append(
            Figure(
                f"http_vs_native_{kind}",
                "HTTP / native, "
                + ("one at a time" if kind == "one" else f"{CONCURRENCY} connections"),
                median[f"http_{kind}"] / median[f"native_{kind}"],
                "x",
            )
        )
    return Report(
        "http_api",
        f"the HTTP API's add against the native protocol's{' (quick)' if quick else ''}: "
        f"memory store, {plan.seconds:g} s rounds, median of {plan.rounds}",
        figures,
        params={
            "quick": quick,
            "seconds": plan.seconds,
            "rounds": plan.rounds,
            "concurrency": CONCURRENCY,
            "body": "a 100-character str",
            "store": "memory://",
        },
        elapsed_s=time.perf_counter() - started,
    )
