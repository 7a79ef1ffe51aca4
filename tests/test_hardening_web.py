"""Hardening (issue 30) of the dashboard's and the metrics endpoint's own sockets.

The real server process, attacked over raw sockets: half-sent requests, more connections
than the cap, a malformed request carrying a token. See tests/test_hardening.py for the
protocol port.
"""

from __future__ import annotations

import re
import socket
import time

import pytest
from rawpeer import Raw
from serverproc import ServerProcess

from delaywheel.net.httpsite import IDLE_TIMEOUT_S
from delaywheel.net.limits import WEB_CONNECTIONS

pytestmark = pytest.mark.process

TOKEN = "s3cret-token-for-hardening"
HALF_SENT = b"GET / HTTP/1.1\r\nHost: x\r\n"  # the headers never finish


def dashboard_address(server: ServerProcess) -> tuple[str, int]:
    deadline = time.monotonic() + 10
    while True:
        match = re.search(r"dashboard on http://(\S+):(\d+)", server.log_text())
        if match:
            return match.group(1), int(match.group(2))
        assert time.monotonic() < deadline, "no dashboard line"
        time.sleep(0.05)


def test_half_sent_requests_cannot_starve_the_protocol_port() -> None:
    # Before: with an open-files limit of 400, 420 half-sent dashboard requests held 420
    # descriptors for aiohttp's 3,630 s keep-alive and the protocol port failed accept with
    # EMFILE. Now the dashboard serves at most WEB_CONNECTIONS (128) at once, answers the
    # rest 503, and the open-files sizing counts them.
    server = ServerProcess(
        "--token", TOKEN, "--web-port", "0", "--max-connections", "200",
        prefix=["prlimit", "--nofile=400:400"],
    )  # fmt: skip
    socks: list[socket.socket] = []
    try:
        web = dashboard_address(server)
        for _ in range(420):
            sock = socket.create_connection(web, timeout=10)
            sock.sendall(HALF_SENT)
            socks.append(sock)
        time.sleep(0.5)
        refused = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                reply = sock.recv(1000)
            except BlockingIOError:
                continue  # held: waiting for the rest of its headers
            if reply.startswith(b"HTTP/1.1 503"):
                assert b"Content-Security-Policy" in reply
                refused += 1
        print(f"420 half-sent requests: {420 - refused} held, {refused} answered 503")
        assert refused == 420 - WEB_CONNECTIONS
        with Raw(server.address) as client:  # the protocol port still accepts
            assert client.call("auth", TOKEN) is True
            assert client.call("ping") == "pong"
        assert "cannot accept" not in server.log_text()
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def test_headers_that_never_finish_are_cut_off_in_seconds() -> None:
    # Before: 3,630 s (aiohttp's keep-alive default). Now IDLE_TIMEOUT_S.
    server = ServerProcess("--token", TOKEN, "--web-port", "0")
    try:
        web = dashboard_address(server)
        sock = socket.create_connection(web, timeout=IDLE_TIMEOUT_S + 10)
        sock.sendall(HALF_SENT)
        start = time.monotonic()
        with sock:
            assert sock.recv(1000) == b""  # closed
        held_s = time.monotonic() - start
        print(f"a half-sent request was held {held_s:.1f} s")
        assert IDLE_TIMEOUT_S - 1 < held_s < IDLE_TIMEOUT_S + 5
    finally:
        server.stop()


def test_a_malformed_request_gets_the_headers_and_logs_no_header() -> None:
    # Before: aiohttp's own 400 without the CSP and the other headers, and an ERROR
    # traceback quoting the header block, the bearer token included.
    server = ServerProcess("--token", TOKEN, "--web-port", "0")
    try:
        web = dashboard_address(server)
        sock = socket.create_connection(web, timeout=10)
        sock.sendall(
            b"GET /api/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nBad Header\x01: y\r\n\r\n"
        )
        reply = sock.recv(4000).decode(errors="replace")
        sock.close()
        assert reply.startswith("HTTP/1.0 400")
        for header in ("Content-Security-Policy: default-src 'none'", "X-Content-Type-Options",
                       "Referrer-Policy: no-referrer", "X-Frame-Options: DENY"):  # fmt: skip
            assert header in reply
        time.sleep(0.3)
    finally:
        server.stop()
    log = server.log_text()
    assert TOKEN not in log and "Bad Header" not in log
    assert " ERROR " not in log
    lines = [line for line in server.log if "malformed request" in line]
    assert (
        lines and "WARNING delaywheel.http: dashboard: malformed request from 127.0.0.1" in lines[0]
    )
