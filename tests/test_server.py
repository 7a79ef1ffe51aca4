"""The real server process, spoken to in raw MessagePack over plain sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from rawpeer import Raw
from serverproc import ServerProcess
from waiting import wait_until


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--max-body", "1024", "--max-message", "65536")
    yield proc
    assert proc.stop() == 0, proc.log_text()


@pytest.fixture
def raw(server: ServerProcess) -> Iterator[Raw]:
    peer = Raw(server.address)
    yield peer
    peer.close()


def test_every_method(raw: Raw) -> None:
    assert raw.call("ping") == "pong"
    assert raw.call("auth", "anything") is True  # no token set: auth is a no-op
    added = raw.call("add", {"id": "m1", "topic": "methods", "delay": 3600, "body": {"k": [1]}})
    # cycle counts laps of ticks: 3600 s at this server's 0.05 s tick is 20 laps.
    assert added["id"] == "m1" and added["cycle"] == 20
    many = raw.call("add_many", [{"topic": "methods"}, {"topic": "methods", "delay": 60}])
    assert [set(r) for r in many] == [{"id", "at", "cycle", "slot"}] * 2
    task = raw.call("get", "m1")
    assert task["state"] == "delayed" and task["body"] == {"k": [1]}
    assert raw.call("update", "m1", {"delay": 0, "body": "now"})["state"] == "ready"
    assert raw.call("list", {"topic": "methods"})["next"] is None
    reserved = raw.call("reserve", ["methods"], 0)
    assert reserved["state"] == "reserved"
    assert raw.call("touch", reserved["id"]) >= reserved["deadline"]
    assert raw.call("release", reserved["id"], 0) is True
    again = raw.call("reserve", "methods", 0)
    assert raw.call("ack", again["id"]) is True
    assert raw.call("delete", many[1]["id"]) is True
    assert raw.call("delete", many[1]["id"]) is False
    assert raw.call("kick", "methods", 5) == 0
    stats = raw.call("stats")
    assert stats["connections"] >= 1 and stats["slots"] == 3600 and stats["store"] == "memory://"


@pytest.mark.parametrize(
    ("method", "params", "code", "in_message"),
    [
        ("add", [{"topic": "t", "delay": -5}], "bad_request", "-5"),
        ("add", [], "bad_request", "add takes [task]"),
        ("get", [42], "bad_request", "42"),
        ("ack", ["missing"], "not_found", "missing"),
        ("update", ["missing", {}], "not_found", "missing"),
        ("add", [{"topic": "t", "body": b"x" * 2000}], "too_large", "1024-byte limit"),
        ("frobnicate", [], "no_method", "frobnicate"),
    ],
)
def test_error_codes_name_the_value(
    raw: Raw, method: str, params: list[Any], code: str, in_message: str
) -> None:
    result = raw.call(method, *params)
    assert result[:2] == ("error", code)
    assert in_message in result[2]


def test_exists_and_conflict(raw: Raw) -> None:
    raw.call("add", {"id": "dup", "topic": "errs", "delay": 100})
    assert raw.call("add", {"id": "dup", "topic": "errs"})[:2] == ("error", "exists")
    assert raw.call("ack", "dup")[:2] == ("error", "conflict")
    assert "delayed" in raw.call("ack", "dup")[2]


def test_a_thousand_pipelined_requests_come_back_in_order(raw: Raw) -> None:
    payload = b"".join(
        msgpack.packb([0, i, "add" if i % 2 else "ping", [{"topic": "pipe"}] if i % 2 else []])
        for i in range(1000)
    )
    raw.sock.sendall(payload)
    replies = [raw.recv() for _ in range(1000)]
    assert [r[1] for r in replies] == list(range(1000))
    assert all(r[2] is None for r in replies)


def test_fifty_concurrent_clients(server: ServerProcess) -> None:
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            peer = Raw(server.address)
            for i in range(20):
                peer.call("add", {"id": f"c{n}-{i}", "topic": "crowd"})
            assert peer.call("get", f"c{n}-19")["topic"] == "crowd"
            peer.close()
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    peer = Raw(server.address)
    assert peer.call("stats")["topics"]["crowd"]["ready"] == 1000
    peer.close()


def test_reserve_blocks_then_gets_a_task_added_later(server: ServerProcess, raw: Raw) -> None:
    waiting = raw.send("reserve", ["block"], 10)
    with Raw(server.address) as other:
        assert other.call("ping") == "pong"  # the blocked reserve stalls nobody
        other.call("add", {"id": "b1", "topic": "block", "delay": 0.2})
        started = time.monotonic()
        _kind, msgid, error, task = raw.recv()
        assert (msgid, error, task["id"]) == (waiting, None, "b1")
        assert time.monotonic() - started < 5


def test_reserve_timeout_answers_nil_and_later_requests_overtake(raw: Raw) -> None:
    blocked = raw.send("reserve", ["nothing-here"], 0.5)
    pinged = raw.send("ping")
    first, second = raw.recv(), raw.recv()
    assert (first[1], first[3]) == (pinged, "pong")
    assert (second[1], second[3]) == (blocked, None)


def test_waiting_consumers_are_served_in_arrival_order(server: ServerProcess) -> None:
    peers = [Raw(server.address) for _ in range(3)]
    producer = Raw(server.address)
    waiting = producer.call("stats")["waiting_reserves"]  # other tests' may be there too
    for peer in peers:
        peer.send("reserve", ["fair"], 10)
        waiting += 1  # each is blocked before the next is sent: arrival order is the test
        wait_until(
            lambda n=waiting: producer.call("stats")["waiting_reserves"] == n,
            what=f"{waiting} blocked reserves",
        )
    for i in range(3):
        producer.call("add", {"id": f"f{i}", "topic": "fair"})
    got = [peer.recv()[3]["id"] for peer in peers]
    assert got == ["f0", "f1", "f2"]
    for peer in [*peers, producer]:
        peer.close()


def test_ttr_redelivery_dead_and_kick(raw: Raw) -> None:
    raw.call("add", {"id": "ttr", "topic": "ttr", "ttr": 0.3, "max_attempts": 2})
    first = raw.call("reserve", ["ttr"], 0)
    assert first["attempts"] == 1
    second = raw.call("reserve", ["ttr"], 5)  # comes back once the TTR runs out
    assert (second["id"], second["attempts"]) == ("ttr", 2)
    wait_until(lambda: raw.call("get", "ttr")["state"] == "dead", 5, "the task to be dead")
    assert raw.call("kick", "ttr", 10) == 1
    assert raw.call("reserve", ["ttr"], 0)["attempts"] == 1


def test_release_with_delay(raw: Raw) -> None:
    raw.call("add", {"id": "rel", "topic": "rel"})
    raw.call("reserve", ["rel"], 0)
    raw.call("release", "rel", 0.4)
    assert raw.call("reserve", ["rel"], 0) is None
    assert raw.call("reserve", ["rel"], 5)["id"] == "rel"


# -- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xc1\xc1\xc1", "bad_request"),  # 0xc1 is never valid MessagePack
        (msgpack.packb({"not": "an array"}), "bad_request"),
        (msgpack.packb([7, 1, "ping", []]), "bad_request"),  # no such type code
        (msgpack.packb([0, 1, "add", [{"topic": "t", "body": b"x" * 70_000}]]), "too_large"),
        # A 4 GiB str header: refused once what is buffered passes --max-message.
        (b"\xdb\xff\xff\xff\xff" + b"x" * 70_000, "too_large"),
    ],
)
def test_bad_input_gets_a_notification_and_a_close(
    server: ServerProcess, data: bytes, code: str
) -> None:
    task_id = f"safe-{code}-{len(data)}"
    with Raw(server.address) as bystander, Raw(server.address) as bad:
        bystander.call("add", {"id": task_id, "topic": "safe"})
        bad.sock.sendall(data)
        kind, method, (got_code, message) = bad.recv()
        assert (kind, method, got_code) == (2, "error", code)
        assert isinstance(message, str) and message
        assert bad.closed()
        assert bystander.call("get", task_id)["topic"] == "safe"


def test_truncated_message_then_close_harms_nobody(server: ServerProcess) -> None:
    bad = Raw(server.address)
    bad.sock.sendall(msgpack.packb([0, 1, "add", [{"topic": "t"}]])[:-3])
    bad.close()
    peer = Raw(server.address)
    assert peer.call("ping") == "pong"
    peer.close()


def test_client_notifications_are_ignored(raw: Raw) -> None:
    raw.sock.sendall(msgpack.packb([2, "hello", [1, 2]]))
    assert raw.call("ping") == "pong"


def test_method_name_as_bin(raw: Raw) -> None:
    raw.sock.sendall(msgpack.packb([0, 99, b"ping", []], use_bin_type=True))
    assert raw.recv() == [1, 99, None, "pong"]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_client_that_never_reads_cannot_grow_the_server(server: ServerProcess) -> None:
    assert server.proc is not None
    before = rss_bytes(server.proc.pid)
    request = msgpack.packb([0, 1, "stats", []])  # 10 bytes in, ~600 bytes out
    chunk = request * 10_000
    sent = 0
    with socket.create_connection(server.address) as hog:
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.settimeout(1.0)
        try:
            for _ in range(1000):  # at most 100 MB of requests, 6 GB of replies
                hog.sendall(chunk)
                sent += len(chunk)
        except TimeoutError:
            pass  # the server stopped reading from us: backpressure works
        grown = rss_bytes(server.proc.pid) - before
        assert sent < 1000 * len(chunk)
        assert grown < 200 * 1024 * 1024, f"server grew by {grown} bytes"
        with Raw(server.address) as peer:
            assert peer.call("ping") == "pong"
