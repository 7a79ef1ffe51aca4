"""HTTP deliveries end to end: the real server calls a real HTTP endpoint.

The endpoint is a stdlib ``ThreadingHTTPServer`` on a free port in this
process; what it answers depends on the path (``/ok``, ``/fail-once``,
``/fail``, ``/slow``). The server runs as its own process with a 50 ms tick
and a short retry base, so retries take a fraction of a second.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from delaywheel_client import Client
from delaywheel_client.errors import BadRequest
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from serverproc import ServerProcess
from waiting import wait_until as wait_for

pytestmark = pytest.mark.process  # every test runs the server in a process of its own

SECRET = "s3cret-for-tests"


DELIVERY_ARGS = ("--http-allow", "127.0.0.1", "--retry-base", "0.2", "--retry-cap", "1")


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(*DELIVERY_ARGS, "--signing-secret", SECRET)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def durable_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """The same on a SQLite file, for tests that stop or kill it and start it again."""
    proc = ServerProcess(*DELIVERY_ARGS, store=f"sqlite:///{tmp_path / 'tasks.db'}")
    try:
        yield proc
    finally:
        proc.stop()


def client_of(proc: ServerProcess) -> Client:
    return Client(*proc.address)


def test_a_due_task_is_posted_with_its_headers_and_then_removed(
    server: ServerProcess, endpoint: Endpoint
) -> None:
    with client_of(server) as client:
        added = client.add(
            "orders",
            {"order": 42, "items": ["a"]},
            delay=0.2,
            target={"type": "http", "url": endpoint.url("/ok"), "headers": {"X-Trace": "t1"}},
        )
        (seen,) = wait_for(lambda: endpoint.requests("/ok"), what="the callback")
        assert seen.at_s >= added["at"]
        assert seen.method == "POST"
        assert json.loads(seen.body) == {"order": 42, "items": ["a"]}
        assert seen.headers["Content-Type"] == "application/json"
        assert seen.headers["X-Trace"] == "t1"
        assert seen.headers["Delaywheel-Id"] == added["id"]
        assert seen.headers["Delaywheel-Topic"] == "orders"
        assert seen.headers["Delaywheel-Attempt"] == "1"
        wait_for(lambda: client.get(added["id"]) is None, what="the task to be removed")
        assert client.stats()["deliveries"]["delivered"] == 1


def test_the_signature_verifies_as_the_docs_say(server: ServerProcess, endpoint: Endpoint) -> None:
    with client_of(server) as client:
        client.add("t", b"\x00raw", target={"type": "http", "url": endpoint.url("/ok")})
        (seen,) = wait_for(lambda: endpoint.requests("/ok"))
    assert seen.headers["Content-Type"] == "application/octet-stream"
    assert seen.body == b"\x00raw"
    # The receiver's recipe (docs/delivery.md): t=<unix s>,v1=<hex HMAC-SHA256 of "t." + body>.
    parts = dict(item.split("=", 1) for item in seen.headers["Delaywheel-Signature"].split(","))
    expected = hmac.new(SECRET.encode(), parts["t"].encode() + b"." + seen.body, hashlib.sha256)
    assert hmac.compare_digest(parts["v1"], expected.hexdigest())
    assert abs(int(parts["t"]) - time.time()) < 60


def test_a_500_is_retried_with_the_next_attempt_number(
    server: ServerProcess, endpoint: Endpoint
) -> None:
    with client_of(server) as client:
        target = {"type": "http", "url": endpoint.url("/fail-once")}
        task_id = client.add("t", "hi", target=target)["id"]
        first, second = wait_for(lambda: len(seen := endpoint.requests("/fail-once")) == 2 and seen)
        assert [first.headers["Delaywheel-Attempt"], second.headers["Delaywheel-Attempt"]] == [
            "1",
            "2",
        ]
        assert second.at_s - first.at_s >= 0.2  # the retry base
        assert second.headers["Content-Type"] == "text/plain; charset=utf-8"
        wait_for(lambda: client.get(task_id) is None)


def test_after_max_attempts_the_task_is_dead_and_kick_sends_it_again(
    server: ServerProcess, endpoint: Endpoint
) -> None:
    with client_of(server) as client:
        target = {"type": "http", "url": endpoint.url("/fail")}
        task_id = client.add("hooks", 1, target=target, max_attempts=2)["id"]
        dead = wait_for(lambda: (task := client.get(task_id)) and task["state"] == "dead" and task)
        assert dead["attempts"] == 2 and "HTTP 500" in dead["last_error"]
        assert [t["id"] for t in client.list(state="dead")["tasks"]] == [task_id]
        assert len(endpoint.requests("/fail")) == 2
        assert client.kick("hooks", 5) == 1
        wait_for(lambda: len(endpoint.requests("/fail")) == 3, what="the kicked attempt")
        assert endpoint.requests("/fail")[-1].headers["Delaywheel-Attempt"] == "1"


def test_a_timeout_and_a_refused_connection_are_failed_attempts(
    server: ServerProcess, endpoint: Endpoint
) -> None:
    with client_of(server) as client:
        slow = {"type": "http", "url": endpoint.url("/slow"), "timeout": 0.2}
        closed = {"type": "http", "url": "http://127.0.0.1:9/nothing-listens"}
        slow_id = client.add("t", 1, target=slow, max_attempts=1)["id"]
        closed_id = client.add("t", 1, target=closed, max_attempts=1)["id"]
        for task_id, words in ((slow_id, "timed out"), (closed_id, "127.0.0.1:9")):
            dead = wait_for(lambda i=task_id: (t := client.get(i)) and t["state"] == "dead" and t)
            assert words in dead["last_error"], dead["last_error"]


def test_destinations_the_allow_list_refuses_are_bad_requests_at_add() -> None:
    proc = ServerProcess()  # the default: public addresses only
    try:
        with client_of(proc) as client:
            for url in ("http://127.0.0.1:8080/", "http://10.0.0.7/", "http://[::1]/"):
                with pytest.raises(BadRequest) as caught:
                    client.add("t", 1, target={"type": "http", "url": url})
                assert url.split("/")[2].rsplit(":", 1)[0].strip("[]") in str(caught.value)
            assert client.stats()["tasks"] == 0
    finally:
        proc.stop()


@pytest.mark.slow
def test_a_slow_endpoint_delays_neither_queue_tasks_nor_clients(
    server: ServerProcess, endpoint: Endpoint
) -> None:
    with client_of(server) as client:
        due_s = time.time() + 1.0
        slow = {"type": "http", "url": endpoint.url("/slow")}
        client.add_many([{"topic": "slow", "at": due_s, "target": slow}] * 1000)
        client.add("urgent", "now", at=due_s)
        task = client.reserve("urgent", timeout=10)
        got_s = time.time()
        assert task is not None and task["body"] == "now"
        wait_for(lambda: endpoint.in_flight >= 32, what="callbacks in flight")
        rtts = []
        for _ in range(20):
            sent_s = time.perf_counter()
            client.ping()
            rtts.append(time.perf_counter() - sent_s)
        in_flight = client.stats()["deliveries"]["in_flight"]
    # Generous margins: the point is seconds (a queue behind 1,000 one-second
    # callbacks) against well under one.
    assert got_s - due_s < 0.75
    assert max(rtts) < 0.25
    assert 1 <= in_flight <= 64  # --http-concurrency bounds one destination


@pytest.mark.slow
def test_a_restart_in_the_middle_of_retries_keeps_the_attempt_count(
    endpoint: Endpoint, durable_server: ServerProcess
) -> None:
    proc = durable_server
    with client_of(proc) as client:
        target = {"type": "http", "url": endpoint.url("/fail")}
        task_id = client.add("t", 1, target=target, max_attempts=4)["id"]
        wait_for(lambda: len(endpoint.requests("/fail")) == 2)
    assert proc.stop() == 0
    proc.start()
    with client_of(proc) as client:
        dead = wait_for(lambda: (t := client.get(task_id)) and t["state"] == "dead" and t)
    numbers = [seen.headers["Delaywheel-Attempt"] for seen in endpoint.requests("/fail")]
    # An attempt cut off by the stop is repeated with its own number.
    assert numbers[:2] == ["1", "2"] and numbers[-2:] == ["3", "4"]
    assert dead["attempts"] == 4


@pytest.mark.slow
def test_kill_9_during_300_deliveries_then_every_task_is_delivered(
    endpoint: Endpoint, durable_server: ServerProcess
) -> None:
    endpoint.slow_s = 0.5
    proc = durable_server
    with client_of(proc) as client:
        target = {"type": "http", "url": endpoint.url("/slow")}
        ids = {task["id"] for task in client.add_many([{"topic": "t", "target": target}] * 300)}
        wait_for(lambda: endpoint.in_flight >= 32, what="deliveries in flight")
    proc.kill()
    proc.start()
    with client_of(proc) as client:
        wait_for(lambda: client.stats()["tasks"] == 0, timeout_s=60, what="all delivered")
    delivered = {seen.headers["Delaywheel-Id"] for seen in endpoint.requests("/slow")}
    assert delivered == ids


@pytest.mark.slow
def test_sigterm_lets_a_delivery_in_flight_finish_and_it_is_not_repeated(
    endpoint: Endpoint, durable_server: ServerProcess
) -> None:
    proc = durable_server
    with client_of(proc) as client:
        target = {"type": "http", "url": endpoint.url("/slow")}
        task_id = client.add("t", 1, target=target)["id"]
        wait_for(lambda: endpoint.in_flight == 1)
    assert proc.stop() == 0  # within --shutdown-grace (10 s) of the 1 s request
    proc.start()
    with client_of(proc) as client:
        assert client.get(task_id) is None
        time.sleep(0.5)  # stays: a repeat would come at once; none may
    assert len(endpoint.requests("/slow")) == 1
