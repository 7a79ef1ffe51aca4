"""The Worker against the real server: ack, release with backoff, dead, stop, signals."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import pytest
from delaywheel_client import Client, Worker
from serverproc import ServerProcess
from waiting import wait_until


def test_success_acks(client: Client, topic: str) -> None:
    ids = [client.add(topic, n)["id"] for n in range(3)]
    seen: list[Any] = []
    worker = Worker(client, reserve_timeout_s=0.2)

    @worker.handler(topic)
    def handle(task: dict[str, Any]) -> None:
        seen.append(task["body"])

    assert worker.run(max_tasks=3) == 3
    assert seen == [0, 1, 2]
    assert [client.get(i) for i in ids] == [None, None, None]


def test_one_reserve_serves_every_registered_topic(client: Client, topic: str) -> None:
    seen: list[str] = []
    worker = Worker(client, reserve_timeout_s=0.2)
    worker.register(f"{topic}-a", lambda task: seen.append(task["topic"]))
    worker.register(f"{topic}-b", lambda task: seen.append(task["topic"]))
    client.add(f"{topic}-b")
    client.add(f"{topic}-a")
    assert worker.run(max_tasks=2) == 2
    assert seen == [f"{topic}-b", f"{topic}-a"]


def test_failure_releases_with_backoff_until_dead(
    client: Client, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    task_id = client.add(topic, "boom", max_attempts=2)["id"]
    calls: list[tuple[float, int]] = []
    worker = Worker(client, reserve_timeout_s=1.0, retry_base_s=0.3, retry_cap_s=10)

    @worker.handler(topic)
    def fail(task: dict[str, Any]) -> None:
        calls.append((time.monotonic(), task["attempts"]))
        raise ValueError("handler failed")

    with caplog.at_level(logging.ERROR, logger="delaywheel_client.worker"):
        assert worker.run(max_tasks=2) == 2
    assert [attempts for _, attempts in calls] == [1, 2]
    assert calls[1][0] - calls[0][0] >= 0.25  # released for retry_base_s * 2**0
    task = client.get(task_id)
    assert task is not None
    assert (task["state"], task["attempts"]) == ("dead", 2)
    failures = [r for r in caplog.records if "handler failed" in (r.exc_text or "")]
    assert len(failures) == 2
    assert "releasing it for 0.3 s" in failures[0].getMessage()


def test_retry_delay_doubles_up_to_the_cap(client: Client) -> None:
    worker = Worker(client, retry_base_s=0.05, retry_cap_s=0.3)
    assert [worker.retry_delay_s(n) for n in (1, 2, 3, 4, 5, 1000)] == [
        0.05,
        0.1,
        0.2,
        0.3,
        0.3,
        0.3,
    ]


def test_stop_from_another_thread_ends_run(client: Client, topic: str) -> None:
    started = threading.Event()
    worker = Worker(client, reserve_timeout_s=0.1)

    @worker.handler(topic)
    def slow(task: dict[str, Any]) -> None:
        started.set()
        time.sleep(0.2)  # stays: the handler's work, in hand while stop() is called

    for n in range(5):
        client.add(topic, n)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(worker.run()))
    runner.start()
    assert started.wait(5)
    worker.stop()
    runner.join(5)
    assert not runner.is_alive()
    assert result == [1]  # finished the task in hand, took no more
    assert len(list(client.iter_tasks(topic=topic, state="ready"))) == 4


def test_stop_while_idle(client: Client, topic: str) -> None:
    worker = Worker(client, reserve_timeout_s=0.1)
    worker.register(topic, lambda task: None)
    threading.Timer(0.2, worker.stop).start()
    assert worker.run() == 0


def test_max_tasks(client: Client, topic: str) -> None:
    for n in range(5):
        client.add(topic, n)
    worker = Worker(client, reserve_timeout_s=0.2)
    worker.register(topic, lambda task: None)
    assert worker.run(max_tasks=2) == 2
    assert len(list(client.iter_tasks(topic=topic))) == 3
    assert worker.run(max_tasks=3) == 3  # run() can be called again


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_after_the_task_in_hand(
    client: Client, topic: str, signum: signal.Signals
) -> None:
    for n in range(3):
        client.add(topic, n)
    before = signal.getsignal(signum)
    worker = Worker(client, reserve_timeout_s=0.2)
    done: list[int] = []

    @worker.handler(topic)
    def handle(task: dict[str, Any]) -> None:
        os.kill(os.getpid(), signum)  # delivered to our handler, installed by run()
        time.sleep(0.05)  # stays: the task's work goes on after the signal
        done.append(task["body"])

    assert worker.run() == 1
    assert done == [0]
    assert signal.getsignal(signum) is before
    assert len(list(client.iter_tasks(topic=topic))) == 2  # the first one was acked


@pytest.mark.process
def test_lost_connection_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = ServerProcess("--port", str(port))  # the last --port wins over serverproc's 0
    try:
        with Client(*proc.address, retries=0) as dw, Client(*proc.address) as watcher:
            handled: list[Any] = []
            worker = Worker(dw, reserve_timeout_s=0.2)
            worker.register("lost", lambda task: handled.append(task["body"]))
            result: list[int] = []
            runner = threading.Thread(target=lambda: result.append(worker.run(max_tasks=1)))
            with caplog.at_level(logging.WARNING, logger="delaywheel_client.worker"):
                runner.start()
                wait_until(
                    lambda: watcher.stats()["waiting_reserves"] == 1, what="the worker's reserve"
                )
                proc.stop()
                wait_until(
                    lambda: any("reserve failed" in r.getMessage() for r in caplog.records),
                    what="the worker to notice the server is gone",
                )
                proc.start()
                assert proc.port == port
                dw.add("lost", "after restart")
                runner.join(15)
            assert not runner.is_alive()
            assert result == [1]
            assert handled == ["after restart"]
            assert any("reserve failed" in r.getMessage() for r in caplog.records)
    finally:
        proc.stop()


def test_run_needs_a_handler(client: Client) -> None:
    with pytest.raises(ValueError, match="no handlers"):
        Worker(client).run()
