"""Graceful shutdown: SIGTERM or SIGINT under load loses nothing acknowledged and exits 0.

Clients add tasks as fast as they can while the server is told to stop; every
add that got an answer must be there after a restart on the same store. What
happens to deliveries in flight at the stop is in tests/test_deliveries.py.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RedisServer
from delaywheel_client import Client
from delaywheel_client.errors import DelaywheelError
from rawpeer import Raw
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = pytest.mark.process

CLIENTS = 4
UNDER_LOAD_ADDS = 50  # acknowledged per client before the signal: all of them are adding


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    if request.param == "sqlite":
        yield ["--store", f"sqlite:///{tmp_path / 'tasks.db'}"]
        return
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    redis_server.start()
    yield ["--store", request.getfixturevalue("redis_url"), "--redis-prefix", uuid.uuid4().hex[:8]]


def add_until_refused(
    address: tuple[str, int], acknowledged: list[str], start: threading.Event
) -> None:
    """Add tasks one call at a time until the server stops answering; keep the acked ids."""
    try:
        with Client(*address, timeout_s=5.0) as client:
            start.wait()
            while True:
                added = client.add("t", b"x" * 100, delay=3600)
                acknowledged.append(added["id"])
    except (DelaywheelError, OSError):
        return  # the server went away: what it answered before is what counts


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_under_load_loses_nothing_acknowledged(
    store: list[str], signum: signal.Signals
) -> None:
    proc = ServerProcess(*store[2:], store=store[1])
    try:
        acknowledged: list[list[str]] = [[] for _ in range(CLIENTS)]
        start = threading.Event()
        threads = [
            threading.Thread(target=add_until_refused, args=(proc.address, acked, start))
            for acked in acknowledged
        ]
        for thread in threads:
            thread.start()
        start.set()
        wait_until(
            lambda: all(len(acked) >= UNDER_LOAD_ADDS for acked in acknowledged),
            what=f"every client to have {UNDER_LOAD_ADDS} adds acknowledged",
        )
        assert proc.proc is not None
        proc.proc.send_signal(signum)
        assert proc.proc.wait(15) == 0
        for thread in threads:
            thread.join(10)
        ids = {task_id for acked in acknowledged for task_id in acked}
        assert len(ids) > 100, "the load never got going"
        assert "shutting down" in proc.log_text()

        proc.start()
        with Client(*proc.address) as client:
            assert client.stats()["tasks"] >= len(ids)
            missing = [task_id for task_id in ids if client.get(task_id) is None]
        assert missing == []
    finally:
        proc.stop()


def test_a_blocked_reserve_is_answered_nil_at_sigterm() -> None:
    proc = ServerProcess()
    try:
        with Raw(proc.address) as peer, Raw(proc.address) as watcher:
            msgid = peer.send("reserve", "nothing-comes", 30)
            wait_until(
                lambda: watcher.call("stats")["waiting_reserves"] == 1,
                what="the reserve to be blocked in the server",
            )
            started_s = time.monotonic()
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            assert peer.recv() == [1, msgid, None, None]  # as if it had timed out
            assert time.monotonic() - started_s < 5
            assert proc.proc.wait(15) == 0
    finally:
        proc.stop()


def test_an_add_waiting_on_the_store_at_sigterm_is_answered_once_durable(
    redis_server: RedisServer, redis_url: str
) -> None:
    store = ["--store", redis_url, "--redis-prefix", uuid.uuid4().hex[:8]]
    proc = ServerProcess(*store[2:], store=store[1])
    assert redis_server.proc is not None
    try:
        with Raw(proc.address) as peer, Raw(proc.address) as watcher:
            assert peer.call("ping") == "pong"
            redis_server.proc.send_signal(signal.SIGSTOP)  # the write cannot complete
            try:
                msgid = peer.send("add", {"id": "in-flight", "topic": "t", "delay": 60})
                wait_until(  # reads are answered while the store is away
                    lambda: watcher.call("stats")["tasks"] == 1,
                    what="the add to be taken, its write waiting on the store",
                )
                assert proc.proc is not None
                proc.proc.send_signal(signal.SIGTERM)
                wait_until(
                    lambda: "shutting down" in proc.log_text(), what="the server to take SIGTERM"
                )
            finally:
                redis_server.proc.send_signal(signal.SIGCONT)
            kind, got_id, error, result = peer.recv()
            assert (kind, got_id, error) == (1, msgid, None) and result["id"] == "in-flight"
            assert peer.closed()
        assert proc.proc.wait(15) == 0
        proc.start()
        with Client(*proc.address) as client:
            task = client.get("in-flight")
        assert task is not None and task["state"] == "delayed"
    finally:
        proc.stop()


@pytest.mark.slow
def test_a_sigterm_just_after_the_listening_line_is_a_clean_stop() -> None:
    """Scripts and tests (serverproc.py) take the listening line for "up"; a SIGTERM
    then must be a clean stop, not the signal's default action (exit code -15)."""
    codes = []
    for _ in range(10):
        proc = ServerProcess()
        codes.append(proc.stop())
    assert codes == [0] * 10
