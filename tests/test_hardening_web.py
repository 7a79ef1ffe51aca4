"""Hardening (issue 30) of the dashboard's and the metrics endpoint's own sockets.

The real server process, attacked over raw sockets: half-sent requests, more connections
than the cap, a malformed request carrying a token. See tests/test_hardening.py for the
protocol port.
"""

from __future__ import annotations

import html
import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest
from delaywheel_client import Client
from rawpeer import Raw
from serverproc import ServerProcess

from delaywheel.net.httpsite import IDLE_TIMEOUT_S
from delaywheel.net.limits import WEB_CONNECTIONS
from delaywheel.web.context import back_of

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


@pytest.mark.slow  # waits IDLE_TIMEOUT_S
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


def signed_in(base: str) -> urllib.request.OpenerDirector:
    """A browser-like opener with the dashboard's session cookie."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    form = urllib.parse.urlencode({"token": TOKEN}).encode()
    with opener.open(base + "/login", data=form, timeout=10) as reply:
        assert reply.status == 200  # followed the 303 to /
    return opener


def fetch(opener: urllib.request.OpenerDirector, url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with opener.open(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


HOSTILE_IDS = ["a{b}", "{}", "a/b", "/lead", "50%", "a%2Fb", "with space", "a?b#c", "..", "é"]


def test_pages_render_any_body_and_id_the_protocol_accepts() -> None:
    # Before: a body nested 1,000 levels made /tasks/{id}, /tasks and /api/tasks answer 500
    # until it was deleted, and an id with { or } could not be opened (404).
    server = ServerProcess("--token", TOKEN, "--web-port", "0")
    try:
        host, port = dashboard_address(server)
        base = f"http://{host}:{port}"
        with Client(*server.address, token=TOKEN) as client:
            deep: list[object] = []
            for _ in range(1020):  # the deepest a body can be in a 1,024-level message
                deep = [deep]
            client.add("deep", deep, delay=3600, id="deep")
            for task_id in HOSTILE_IDS:
                client.add("ids", task_id, delay=3600, id=task_id)
        opener = signed_in(base)
        for path in ("/tasks/deep", "/tasks", "/tasks?topic=deep", "/api/tasks", "/api/tasks/deep"):
            status, text = fetch(opener, base + path)
            assert status == 200, (path, status)
            if path != "/tasks":
                assert "nested deeper than 64 levels" in text, path
        api = json.loads(fetch(opener, base + "/api/tasks/deep")[1])
        level, depth = api["body"], 0
        while isinstance(level, list):
            level, depth = level[0], depth + 1
        assert (depth, level) == (64, "[nested deeper than 64 levels: not shown]")
        for task_id in HOSTILE_IDS:
            quoted = urllib.parse.quote(task_id, safe="")
            status, text = fetch(opener, f"{base}/api/tasks/{quoted}")
            assert status == 200 and json.loads(text)["id"] == task_id, task_id
            status, text = fetch(opener, f"{base}/tasks/{quoted}")
            assert status == 200 and html.escape(task_id) in text, task_id
    finally:
        server.stop()
    assert " ERROR " not in server.log_text()


def test_back_is_only_a_path_on_this_site() -> None:
    # Before: /\evil.example and /<TAB>/evil.example passed, which browsers read as
    # //evil.example.
    for back in ("/\\evil.example", "/\t/evil.example", "//evil.example", "/\n/x", "https://x"):
        assert back_of({"back": back}, "/") == "/", back
    for back in ("/", "/tasks?topic=a&cursor=100", "/tasks/a%2Fb"):
        assert back_of({"back": back}, "/") == back


TRAVERSALS = [
    "/static/../site.py",
    "/static/%2e%2e/site.py",
    "/static/%2e%2e%2fsite.py",
    "/static/..%2f..%2fconfig.py",
    "/static/..%5csite.py",
    "/static/....//site.py",
    "/static//etc/passwd",
    "/static/%252e%252e/site.py",
]


def test_static_files_do_not_leave_their_directory() -> None:
    # Held when the issue was filed; kept so.
    server = ServerProcess("--token", TOKEN, "--web-port", "0")
    try:
        host, port = dashboard_address(server)
        for path in TRAVERSALS:
            sock = socket.create_connection((host, port), timeout=10)
            with sock:  # raw, so that no client library normalizes the path first
                sock.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            status = int(reply.split(b" ", 2)[1])
            assert status in (400, 403, 404), (path, status)
            assert b"import" not in reply and b"root:" not in reply, path
    finally:
        server.stop()
