"""A local HTTP endpoint for the deliveries section: ``python -m bench.http_sink [PORT]``.

It listens on 127.0.0.1 (PORT 0, the default, picks a free one), prints
``http sink listening on 127.0.0.1:PORT`` on stdout, and serves until
SIGTERM: ``aiohttp.web`` on uvloop (plain asyncio when uvloop is missing),
no access log. Any method to

- ``/ok/NAME`` answers 200, empty, at once;
- ``/slow/NAME`` answers the same after ``SLOW_S`` (an ``asyncio.sleep``, so
  thousands wait at once and the sink itself stays idle);
- ``GET /counts`` answers a JSON map of each path to the requests answered
  there, which is how the bench checks that every delivery arrived;
- ``GET /arrivals/NAME`` answers a JSON list of the times (``time.monotonic()``
  in the sink, s) at which each request to ``/ok/NAME`` came in, in order:
  how steadily a rate-limited topic's deliveries arrive. Only ``/ok/`` is
  timed (a list append per request); ``/slow/`` is not.

It runs as a process of its own so that its CPU time is not the bench's,
nor the server's that the bench reads from ``/proc``. ``running()`` starts
it as a child process and stops it again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from bench._procs import listening_child

HOST = "127.0.0.1"
SLOW_S = 0.1
BACKLOG = 1024  # a burst opens --http-concurrency connections at once


def application() -> web.Application:
    counts: dict[str, int] = {}
    arrivals: dict[str, list[float]] = {}  # by /ok/ path: each request's monotonic time

    def answer(request: web.Request) -> web.Response:
        counts[request.path] = counts.get(request.path, 0) + 1
        return web.Response()

    async def ok(request: web.Request) -> web.Response:
        arrivals.setdefault(request.path, []).append(time.monotonic())
        return answer(request)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(SLOW_S)
        return answer(request)

    async def answered(request: web.Request) -> web.Response:
        return web.json_response(counts)

    async def arrived(request: web.Request) -> web.Response:
        return web.json_response(arrivals.get(f"/ok/{request.match_info['name']}", []))

    app = web.Application()
    app.router.add_route("*", "/ok/{name}", ok)
    app.router.add_route("*", "/slow/{name}", slow)
    app.router.add_get("/counts", answered)
    app.router.add_get("/arrivals/{name}", arrived)
    return app


async def serve(port: int) -> None:
    runner = web.AppRunner(application(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port, backlog=BACKLOG).start()
    bound_host, bound_port = runner.addresses[0][:2]
    print(f"http sink listening on {bound_host}:{bound_port}", flush=True)
    await asyncio.Event().wait()  # until SIGTERM ends the process


def main(argv: list[str]) -> None:
    port = int(argv[0]) if argv else 0
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(port))
    else:
        uvloop.run(serve(port))


@dataclass(frozen=True)
class Sink:
    """The running sink: its process, and the URLs a target can name."""

    pid: int
    port: int

    def url(self, kind: str, name: str) -> str:
        """``kind`` is ``ok`` or ``slow``; ``name`` keeps one run's count apart."""
        return f"http://{HOST}:{self.port}/{kind}/{name}"

    def answered(self, url: str) -> int:
        """How many requests the sink has answered at ``url`` (one ``url`` made)."""
        counts: dict[str, int] = self._get("/counts")
        return counts.get(urlsplit(url).path, 0)

    def arrivals(self, name: str) -> list[float]:
        """When each request to ``/ok/NAME`` came in (the sink's monotonic clock, s)."""
        times: list[float] = self._get(f"/arrivals/{name}")
        return times

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}{path}", timeout=10) as reply:
            return json.load(reply)


@contextmanager
def running() -> Iterator[Sink]:
    command = [sys.executable, "-m", "bench.http_sink", "0"]
    with listening_child(command, r"http sink listening on (\S+):(\d+)") as (pid, address):
        yield Sink(pid, address[1])


if __name__ == "__main__":
    main(sys.argv[1:])
