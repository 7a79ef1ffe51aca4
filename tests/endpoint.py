"""A real HTTP endpoint for delivery tests, keeping each request it gets.

The ``endpoint`` fixture is a stdlib ``ThreadingHTTPServer`` on a free port in
the test's process; what it answers depends on the path (``/ok``,
``/fail-once``, ``/fail``, ``/slow``; ``/echo`` answers the request's body).
Import the fixture into a test module by name: ``from endpoint import endpoint``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    at_s: float


@dataclass
class Endpoint:
    port: int
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    max_in_flight: int = 0  # the most requests it held at once
    slow_s: float = 1.0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self, path: str | None = None) -> list[Seen]:
        with self.lock:
            return [seen for seen in self.seen if path is None or seen.path == path]


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    state = Endpoint(0)

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with state.lock:
                state.seen.append(
                    Seen(self.path, self.command, dict(self.headers), body, time.time())
                )
                earlier = sum(1 for seen in state.seen if seen.path == self.path)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if self.path == "/slow":
                    time.sleep(state.slow_s)
                status = 200
                if self.path == "/fail" or (self.path == "/fail-once" and earlier == 1):
                    status = 500
                answer = body if self.path == "/echo" else b"ok"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            finally:
                with state.lock:
                    state.in_flight -= 1

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.request_queue_size = 1024
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
