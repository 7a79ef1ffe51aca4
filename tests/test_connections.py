"""Connections at scale (issue 19), against the real server process.

5,000 connections held by client processes (the bench's, bench/_holder.py, 500 each, so
that each stays under a soft limit of 1,024 open files) to a server started
with a soft limit of 1,024: the server raises its own and serves them all,
in under 12 kB of RSS each (read from /proc; the bench has the precise
figure). 5,000 blocked reserves each get their own task after one add_many
(within a generous bound; the bench measures how soon). A
connection cut in the middle of a message leaves nothing: no connection, no
descriptor, no task, no memory. Under ``prlimit --nofile=256:256`` the
server says in one line what the limit keeps it from, and, on uvloop and on
asyncio's own loop alike, clients past the limit wait to be accepted (the
failed accepts counted in the metrics, logged once) while the open
connections are served.
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest
from delaywheel_client import Client
from rawpeer import Raw
from serverproc import ServerProcess

# The bench section's holder processes (python -m bench._holder), run from the repository.
REPOSITORY = Path(__file__).resolve().parent.parent
CONNECTIONS = 5_000
PER_HOLDER = 500
# The server's RSS per connection may not pass this. Measured 2.9 kB idle and
# 4.5 kB with a blocked reserve (52 kB and 54 kB before issue 19); the bound is
# the 8 kB with room for an allocator's mood.
MAX_BYTES_PER_CONNECTION = 12_000
# The issue asks for 1 s for 5,000 blocked reserves after an add_many. From the
# holder processes here: 0.41-0.43 s on a quiet 2-CPU machine, but 0.78 and
# 1.02 s with two CPU hogs beside it, so the test bound is generous and the
# bench measures the figure (reserves_answered_5000_s).
MAX_RESERVES_ANSWERED_S = 5.0
# Descriptors the server needs besides the connections, on the memory store
# with the default --http-concurrency (net/limits.py), and some to spare.
SERVER_OVERHEAD = 300
# Every holder connects from 127.0.0.1: one address may hold them all (by default a
# quarter of --max-connections, docs/operations.md "Connections").
ONE_ADDRESS = ("--max-connections-per-address", "10000")
# Runs uvloop's server, or asyncio's own loop (uvloop made unimportable).
ON_ASYNCIO = (
    "-c",
    "import sys; sys.modules['uvloop'] = None; from delaywheel.cli import main; main()",
)


def hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return sys.maxsize if hard == resource.RLIM_INFINITY else hard


def needs_descriptors(count: int) -> None:
    if hard_limit() < count:
        pytest.skip(f"the hard open files limit ({hard_limit()}) is below the {count} needed")


def proc_status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def rss_bytes(pid: int) -> int:
    return proc_status(pid, "VmRSS") * 1024


def open_files_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no open files limit")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(check: object, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def server_pid(server: ServerProcess) -> int:
    """The server's own pid (under ``prlimit`` the child execs it, same pid)."""
    assert server.proc is not None
    return server.proc.pid


@contextmanager
def holders(server: ServerProcess, count: int, *mode: str) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` connections held by holder processes; they let go on the way out."""
    procs = []
    try:
        for first in range(0, count, PER_HOLDER):
            size = str(min(PER_HOLDER, count - first))
            holder = [sys.executable, "-m", "bench._holder", "dw", server.host, str(server.port)]
            procs.append(
                subprocess.Popen(
                    [*holder, size, *mode],
                    cwd=REPOSITORY,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        yield procs
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in procs:
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()


def first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def settled_rss(server: ServerProcess) -> int:
    with Client(*server.address) as client:
        client.ping()
        client.stats()
    return rss_bytes(server_pid(server))


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_5000_connections_are_served_from_a_soft_limit_of_1024() -> None:
    needs_descriptors(CONNECTIONS + SERVER_OVERHEAD)
    server = ServerProcess(*ONE_ADDRESS, prefix=["prlimit", f"--nofile=1024:{hard_limit()}"])
    try:
        pid = server_pid(server)
        assert open_files_limit(pid) >= CONNECTIONS  # raised at start
        assert "open files limit raised from 1024" in server.log_text()
        before = settled_rss(server)
        with holders(server, CONNECTIONS, "idle") as procs:
            served = [first_line(proc) for proc in procs]  # those answered pong
            assert served == [f"ready {PER_HOLDER}"] * len(procs)
            with Client(*server.address) as client:
                assert client.stats()["connections"] == CONNECTIONS + 1
            per_connection = (settled_rss(server) - before) / CONNECTIONS
            assert per_connection < MAX_BYTES_PER_CONNECTION, per_connection
        wait_for(lambda: descriptors(pid) < 100, what="the connections to close")
    finally:
        server.stop()
    assert "cannot accept" not in server.log_text()


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_5000_blocked_reserves_each_get_a_task_after_one_add_many() -> None:
    needs_descriptors(CONNECTIONS + SERVER_OVERHEAD)
    server = ServerProcess(*ONE_ADDRESS)
    try:
        before = settled_rss(server)
        with holders(server, CONNECTIONS, "block", "jobs") as procs:
            assert [first_line(proc) for proc in procs] == ["waiting"] * len(procs)
            with Client(*server.address) as client:
                wait_for(lambda: client.stats()["waiting_reserves"] == CONNECTIONS, what="reserves")
                per_connection = (settled_rss(server) - before) / CONNECTIONS
                assert per_connection < MAX_BYTES_PER_CONNECTION, per_connection
                sent_at = time.monotonic()
                added = client.add_many([{"topic": "jobs", "body": i} for i in range(CONNECTIONS)])
            lines = [first_line(proc).split(" ", 3) for proc in procs]
        # answered N LAST IDS: the reserves that got a task, the last one's clock, their ids
        reserved = [json.loads(ids) for *_, ids in lines]
        assert [int(count) for _, count, _, _ in lines] == [PER_HOLDER] * len(procs)
        every_id = [task_id for ids in reserved for task_id in ids]
        assert sorted(every_id) == sorted(task["id"] for task in added)  # each its own task
        answered_s = max(float(last) for _, _, last, _ in lines) - sent_at
        assert answered_s < MAX_RESERVES_ANSWERED_S, answered_s
    finally:
        server.stop()


@pytest.mark.process
@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_connection_cut_mid_message_leaves_nothing_behind(reset: bool) -> None:
    server = ServerProcess("--max-body", str(4 * 1024 * 1024 - 1024))
    try:
        pid = server_pid(server)
        body = os.urandom(3 * 1024 * 1024)  # under --max-message (4 MiB)
        message = msgpack.packb([0, 1, "add", [{"topic": "cut", "body": body}]])
        with Raw(server.address) as raw:  # warm: a whole one, then delete it
            task = raw.call("add", {"topic": "warm", "body": body})
            assert raw.call("delete", task["id"]) is not None
        with Client(*server.address) as client:
            wait_for(lambda: client.stats()["connections"] == 1, what="the warm-up to close")
            fds, before = descriptors(pid), rss_bytes(pid)  # this client's included
            for _ in range(40):
                sock = socket.create_connection(server.address)
                sock.sendall(message[: len(message) // 2 + 12345])
                if reset:  # RST instead of FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.close()
            wait_for(lambda: client.stats()["connections"] == 1, what="the cut connections")
            wait_for(lambda: descriptors(pid) == fds, what="the descriptors")
            assert client.stats()["tasks"] == 0
            added = client.add("after", body)
            assert client.get(added["id"])["body"] == body  # the shared unpackers are clean
        grown = rss_bytes(pid) - before
        # 40 buffers of 3 MiB (4 MiB grown, at least) kept would be 160 MB or more.
        assert grown < 40 * 1024 * 1024, grown
    finally:
        server.stop()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_low_hard_limit_is_logged_and_clients_past_it_wait(loop: str) -> None:
    server = ServerProcess(
        "--metrics-port",
        "0",
        prefix=["prlimit", "--nofile=256:256"],
        python_args=ON_ASYNCIO if loop == "asyncio" else ("-m", "delaywheel"),
    )
    socks: list[socket.socket] = []
    try:
        pid = server_pid(server)
        assert open_files_limit(pid) == 256
        (line,) = [line for line in server.log if "open files limit" in line]
        assert "WARNING" in line
        for needed in ("is 256 (hard limit 256)", "below the 10", "--max-connections 10000"):
            assert needed in line
        assert "LimitNOFILE=" in line and "ulimits" in line
        ping = msgpack.packb([0, 1, "ping", []])
        for _ in range(300):
            sock = socket.create_connection(server.address, timeout=10)
            sock.sendall(ping)
            socks.append(sock)
        first = socks[0]
        assert first.recv(100) == msgpack.packb([1, 1, None, "pong"])
        wait_for(lambda: "cannot accept connections" in server.log_text(), what="the log line")
        served = sum(1 for sock in socks[1:150] if sock.recv(100))
        assert served == 149  # the first ones, accepted before the limit
        for sock in socks[:150]:  # those being served go on being served
            sock.sendall(ping)
            assert sock.recv(100) == msgpack.packb([1, 1, None, "pong"])
        for sock in socks[:150]:
            sock.close()
        for sock in socks[150:]:  # the rest waited, and are served now
            assert sock.recv(100) == msgpack.packb([1, 1, None, "pong"])
        with urllib.request.urlopen(metrics_url(server), timeout=10) as scrape:
            text = scrape.read().decode()
        failed = re.search(r'^delaywheel_accept_errors_total\{errno="EMFILE"\} (\S+)$', text, re.M)
        assert failed is not None and float(failed.group(1)) >= 1
    finally:
        for sock in socks:
            sock.close()
        server.stop()
    lines = [line for line in server.log if "cannot accept connections" in line]
    assert 1 <= len(lines) <= 2  # at most one every 10 s
    assert "(EMFILE)" in lines[0] and "Open connections are still served" in lines[0]
    assert "socket.accept() out of system resource" not in server.log_text()  # asyncio's own


def metrics_url(server: ServerProcess) -> str:
    match = re.search(r"metrics on (http://\S+)", server.log_text())
    assert match is not None
    return match.group(1)
