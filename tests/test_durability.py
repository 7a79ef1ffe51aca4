"""Nothing acknowledged is lost: kill -9 of the server, Redis going away, restarts.

Every test runs real processes: the server, and a private redis-server on a
free port with AOF and ``appendfsync always`` (so a Redis crash loses nothing
that Redis acknowledged, which is what the server's promise builds on).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisCluster, RedisServer
from rawpeer import Raw
from serverproc import ServerProcess
from waiting import wait_until


@pytest.fixture(scope="module")
def fsync_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-fsync"), ["--appendfsync", "always"])
    server.start()
    yield server
    server.stop()


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
        "sqlite",
    ]
)
def store_args(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """A fresh, empty durable store per test: its own Redis prefix, or its own file.

    On the cluster, the server is pointed at a node that does not hold its key.
    """
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    if request.param == "redis":
        fsync_redis: RedisServer = request.getfixturevalue("fsync_redis")
        fsync_redis.start()  # a previous test may have left it stopped
        return ["--store", fsync_redis.url, "--redis-prefix", prefix]
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return ["--store", cluster.far_node_url(f"{{{prefix}}}:tasks"), "--redis-prefix", prefix]
    return ["--store", f"sqlite:///{tmp_path / 'tasks.db'}"]


def start(store_args: list[str], *extra: str) -> ServerProcess:
    return ServerProcess(*store_args[2:], *extra, store=store_args[1])


def all_tasks(peer: Raw) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        page = peer.call("list", {"limit": 1000, "cursor": cursor})
        tasks.update((task["id"], task) for task in page["tasks"])
        cursor = page["next"]
        if cursor is None:
            return tasks


MID_STREAM_ADDS = 200  # per worker before the kill; the checks below need 50


class Worker(threading.Thread):
    """Adds, updates, deletes, reserves and acks until the server dies, noting
    what was acknowledged."""

    def __init__(self, name: str, address: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.tag = name
        self.address = address
        self.sent: set[str] = set()  # every id an add was sent for
        self.added: set[str] = set()  # adds the server acknowledged
        self.deleted: set[str] = set()  # acknowledged deletes
        self.acked: set[str] = set()  # acknowledged acks
        self.removal_sent: set[str] = set()  # a delete or ack went out, answered or not
        self.reserved: set[str] = set()
        self.updated: dict[str, float] = {}  # acknowledged updates: id -> the new at

    def run(self) -> None:
        try:
            with Raw(self.address, timeout_s=5) as peer:
                for i in range(100_000):
                    task_id = f"{self.tag}-{i}"
                    self.sent.add(task_id)
                    # A third go straight to ready; of the rest, half are due
                    # within the hour and half days away (loaded packed).
                    delay = 0 if i % 3 == 0 else 3600 if i % 2 else 3 * 86400
                    if peer.call("add", {"id": task_id, "topic": self.tag, "delay": delay}) is None:
                        raise AssertionError("add answered nil")
                    self.added.add(task_id)
                    if i % 7 == 2 and i % 3 != 0:
                        updated = peer.call("update", task_id, {"delay": 2 * 86400 + i})
                        self.updated[task_id] = updated["at"]
                    if i % 5 == 1:
                        self.removal_sent.add(task_id)
                        assert peer.call("delete", task_id) is True
                        self.deleted.add(task_id)
                    if i % 3 == 0:
                        task = peer.call("reserve", [self.tag], 0)
                        if isinstance(task, dict):
                            self.reserved.add(task["id"])
                            if i % 2 == 0:
                                self.removal_sent.add(task["id"])
                                assert peer.call("ack", task["id"]) is True
                                self.acked.add(task["id"])
        except (OSError, ConnectionError):
            return  # the server was killed under us: expected


@pytest.mark.slow
@pytest.mark.process
def test_kill_9_mid_stream_loses_nothing_acknowledged(store_args: list[str]) -> None:
    server = start(store_args)
    workers = [Worker(f"w{n}", server.address) for n in range(4)]
    for worker in workers:
        worker.start()
    wait_until(
        lambda: all(len(w.added) > MID_STREAM_ADDS and len(w.updated) > 5 for w in workers),
        what=f"every worker to have {MID_STREAM_ADDS} adds acknowledged",
    )
    server.kill()
    for worker in workers:
        worker.join(10)
    assert all(len(w.added) > 50 for w in workers), [len(w.added) for w in workers]

    again = start(store_args)
    with Raw(again.address) as peer:
        wheel = peer.call("stats")["wheel"]
        # list must decode the packed ones (and read the far ones: SQLite keeps
        # tasks days away only in the store, engine/horizon.py)
        assert wheel["packed"] + wheel["far"] > 0
        found = all_tasks(peer)
    again.stop()
    for w in workers:
        gone = w.deleted | w.acked
        assert not gone & found.keys(), "a deleted or acked task came back"
        # A delete or ack cut off by the kill may have landed unanswered.
        missing = (w.added - w.removal_sent) - found.keys()
        assert not missing, f"acknowledged adds lost: {sorted(missing)[:5]}"
        assert len(w.updated) > 5, len(w.updated)
        for task_id, at_s in w.updated.items():
            if task_id not in w.removal_sent:
                assert found[task_id]["at"] == at_s, f"update of {task_id} lost"
    sent = set().union(*(w.sent for w in workers))
    assert found.keys() <= sent, "a task nobody added appeared"


@pytest.mark.slow
@pytest.mark.process
def test_tasks_due_during_downtime_are_delivered_at_restart(store_args: list[str]) -> None:
    server = start(store_args)
    with Raw(server.address) as peer:
        for i in range(20):
            peer.call("add", {"id": f"due{i}", "topic": "downtime", "delay": 0.3})
    server.kill()
    time.sleep(0.6)  # stays: they fall due while the server is down, which is the test
    again = start(store_args)
    with Raw(again.address) as peer:
        got = {peer.call("reserve", ["downtime"], 2)["id"] for _ in range(20)}
    again.stop()
    assert got == {f"due{i}" for i in range(20)}


@pytest.mark.slow
@pytest.mark.process
def test_a_task_laps_away_keeps_its_due_time_across_a_restart(store_args: list[str]) -> None:
    # 10 slots of 0.2 s: a lap is 2 s, and the task is 2.5 laps away. Firing a
    # lap early or late would be 2 s off; the margins below are far tighter.
    # The second task is 4.5 laps away: still more than two laps away after
    # the restart, it is loaded packed and must be decoded in time.
    wheel = {"store": store_args[1], "tick": "0.2"}
    server = ServerProcess(*store_args[2:], "--slots", "10", **wheel)
    with Raw(server.address) as peer:
        added = peer.call("add", {"id": "laps", "topic": "laps", "delay": 5.0})
        assert added["cycle"] == 2
        packed = peer.call("add", {"id": "packed", "topic": "laps", "delay": 9.0})
    time.sleep(2.0)  # stays: a lap goes by before the restart, as the test means
    server.stop()
    again = ServerProcess(*store_args[2:], "--slots", "10", **wheel)
    fired_s = {}
    with Raw(again.address, timeout_s=15) as peer:
        assert peer.call("stats")["wheel"]["packed"] >= 1
        for task in added, packed:
            reserved = peer.call("reserve", ["laps"], 10)
            fired_s[reserved["id"]] = time.time()
            assert reserved["id"] == task["id"]
    again.stop()
    for task in added, packed:
        late_s = fired_s[task["id"]] - task["at"]
        assert late_s >= 0, f"{task['id']} fired {-late_s:.2f} s early"
        assert late_s < 1.0, f"{task['id']} fired {late_s:.2f} s late"


@pytest.mark.process
def test_corrupt_record_is_logged_and_skipped(fsync_redis: RedisServer) -> None:
    fsync_redis.start()
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    store = ["--store", fsync_redis.url, "--redis-prefix", prefix]
    server = start(store)
    with Raw(server.address) as peer:
        peer.call("add", {"id": "good", "topic": "t", "delay": 60})
    server.stop()
    with fsync_redis.client() as redis:
        redis.hset(f"{{{prefix}}}:tasks", "broken", b"\x93not a record")
    again = start(store)
    with Raw(again.address) as peer:
        assert peer.call("get", "good")["topic"] == "t"
        assert peer.call("get", "broken") is None
    again.stop()
    assert "skipping corrupt record for task 'broken'" in again.log_text()


@pytest.mark.process
def test_redis_outage_under_load(fsync_redis: RedisServer) -> None:
    fsync_redis.start()
    store = ["--store", fsync_redis.url, "--redis-prefix", f"t-{uuid.uuid4().hex[:8]}"]
    server = start(store)
    acknowledged: list[str] = []
    outcomes: dict[str, int] = {"ok": 0, "unavailable": 0}
    with Raw(server.address, timeout_s=30) as peer:
        for i in range(200):
            peer.call("add", {"id": f"before{i}", "topic": "outage", "delay": 3600})
            acknowledged.append(f"before{i}")
        fsync_redis.kill()
        for i in range(20):
            started = time.monotonic()
            reply = peer.call("add", {"id": f"during{i}", "topic": "outage", "delay": 3600})
            assert time.monotonic() - started < 25, "a write hung while Redis was down"
            if isinstance(reply, dict):
                outcomes["ok"] += 1
                acknowledged.append(f"during{i}")
            else:
                assert reply[:2] == ("error", "unavailable"), reply
                outcomes["unavailable"] += 1
            # Reads go on from memory while the store is down.
            assert peer.call("get", "before0")["id"] == "before0"
            assert peer.call("ping") == "pong"
        assert outcomes["unavailable"] > 0, outcomes
        fsync_redis.start()
        deadline = time.monotonic() + 30
        while True:  # the server reconnects by itself
            reply = peer.call("add", {"id": f"after{time.monotonic()}", "topic": "outage"})
            if isinstance(reply, dict):
                break
            assert time.monotonic() < deadline, f"no recovery: {reply}"
            time.sleep(0.2)
        stats = peer.call("stats")
    server.stop()
    again = start(store)
    with Raw(again.address) as peer:
        found = all_tasks(peer)
    again.stop()
    missing = set(acknowledged) - found.keys()
    assert not missing, f"acknowledged adds lost: {sorted(missing)[:5]}"
    # An add answered unavailable may still have landed (Redis can die after
    # applying a write but before answering it); the protocol allows that.
    assert stats["flushes"] > 0


@pytest.mark.process
def test_a_failed_write_answers_its_pipeline_in_order(fsync_redis: RedisServer) -> None:
    """A pipeline whose writes fail: each add waiting on them is answered
    ``unavailable`` under its own msgid, in request order, and the reads between
    them keep their answers (the connection's line, grouped by batch)."""
    fsync_redis.start()
    server = start(["--store", fsync_redis.url, "--redis-prefix", f"t-{uuid.uuid4().hex[:8]}"])
    with Raw(server.address, timeout_s=30) as peer:
        assert isinstance(peer.call("add", {"id": "kept", "topic": "p", "delay": 3600}), dict)
        fsync_redis.kill()
        sent = []
        for i in range(3):
            sent.append((peer.send("add", {"id": f"a{i}", "topic": "p", "delay": 3600}), "add"))
        sent.append((peer.send("ping"), "ping"))
        sent.append((peer.send("get", "kept"), "get"))
        for i in range(3, 6):
            sent.append((peer.send("add", {"id": f"a{i}", "topic": "p", "delay": 3600}), "add"))
        replies = [peer.recv() for _ in sent]
        assert [reply[1] for reply in replies] == [msgid for msgid, _ in sent]
        for (_, method), (_, _, error, result) in zip(sent, replies, strict=True):
            if method == "add":
                assert error is not None and error[0] == "unavailable", error
            elif method == "ping":
                assert (error, result) == (None, "pong")
            else:
                assert error is None and result["id"] == "kept"
        assert peer.call("get", "a0") is None  # undone with its failed write
    server.stop()


def test_a_failed_write_leaves_no_half_applied_change(fsync_redis: RedisServer) -> None:
    """In-process engine on a real Redis that goes away between two changes."""
    import asyncio

    from delaywheel.engine.engine import Engine
    from delaywheel.errors import RequestError
    from delaywheel.store import open_store

    async def scenario() -> None:
        fsync_redis.start()
        store = open_store(fsync_redis.url, redis_prefix=f"t-{uuid.uuid4().hex[:8]}")
        await store.open()
        now_s = time.time()
        engine = Engine(store, now_s=now_s)
        engine.add({"id": "kept", "topic": "t", "delay": 100, "body": "old"}, now_s)
        engine.add({"id": "ready", "topic": "t"}, now_s)
        await engine.journal.drain()
        before = engine.stats(now_s)
        place = engine.get("kept")

        fsync_redis.stop()
        failures: list[object] = []
        engine.add({"id": "new", "topic": "t"}, now_s)
        engine.update("kept", {"delay": 5000, "body": "new", "topic": "u"}, now_s)
        engine.try_reserve(["t"], now_s)
        engine.delete("kept")  # builds on the update in the same batch
        batch = engine.journal.pending()
        assert batch is not None
        batch.add_callback(failures.append)
        await engine.journal.drain()
        assert len(failures) == 1 and failures[0] is not None

        assert engine.get("new") is None
        assert engine.get("kept") == place
        assert engine.get("ready")["state"] == "ready"  # type: ignore[index]
        after = engine.stats(now_s)
        for key in ("tasks", "states", "topics"):
            assert after[key] == before[key], key
        # "kept" was packed once durable; undone, it is back decoded in the wheel.
        scheduled = [s["wheel"]["pending"] + s["wheel"]["packed"] for s in (before, after)]
        assert scheduled == [1, 1]
        with pytest.raises(RequestError):
            engine.ack("ready")  # the reservation was undone too

        fsync_redis.start()  # the next write connects again
        engine.add({"id": "later", "topic": "t"}, now_s)
        await engine.journal.drain()
        assert engine.get("later") is not None
        await store.close()

    asyncio.run(scenario())


@pytest.mark.process
def test_serve_without_redis_exits_with_one_line_suggesting_sqlite() -> None:
    """The default store is Redis; when it is not there, say so and what to do instead.

    An explicit URL on a dead port stands in for the default one: the default
    (127.0.0.1:6379) is a shared Redis on our machines, which tests never touch.
    """
    import subprocess
    import sys

    from conftest import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run(
        [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3, done.stderr
    assert len(lines) == 1, done.stderr
    assert url in lines[0] and "--store sqlite:///delaywheel.db" in lines[0]
    assert "Traceback" not in done.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "delaywheel", "serve", "--help"], capture_output=True, text=True
    ).stdout
    assert "redis://127.0.0.1:6379/0" in help_text
