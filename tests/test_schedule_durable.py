"""Saved schedules in a real server process on SQLite and on a private
redis-server: kill -9 at random points of a schedule firing every second, and
restarts, lose no occurrence and double none (the ids are the proof); two
nodes on one Redis keyspace fire each occurrence once (docs/schedules.md)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from delaywheel_client import Client, ClusterClient

from tests.serverproc import ServerProcess
from tests.waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.slow]

SCHEDULE = {"every": 1, "topic": "occ", "ttr": 0, "catchup": "all"}


def _take(address: tuple[str, int], until_s: float, got: list[str]) -> None:
    """Reserve occurrences until ``until_s`` (ttr 0: each is gone once handed out)."""
    with Client(*address) as dw:
        while time.time() < until_s:
            task = dw.reserve("occ", timeout=0.2)
            if task is not None:
                got.append(task["id"])


def _nominals(ids: list[str], schedule_id: str) -> list[int]:
    prefix = f"s:{schedule_id}:"
    return sorted(int(task_id[len(prefix) :]) for task_id in ids if task_id.startswith(prefix))


def _assert_each_once(ids: list[str], schedule_id: str, fired: int) -> None:
    nominals = _nominals(ids, schedule_id)
    assert len(nominals) == len(set(nominals)), f"an occurrence came twice: {nominals}"
    assert nominals == list(range(nominals[0], nominals[0] + len(nominals))), nominals
    assert len(nominals) == fired


def _drain_fired(address: tuple[str, int], schedule_id: str, got: list[str]) -> int:
    """Pause the schedule, then take every occurrence it fired; its count of fired."""
    with Client(*address) as dw:
        state = dw.schedule_pause(schedule_id)

    def all_taken() -> bool:
        _take(address, time.time() + 0.3, got)
        return len(_nominals(got, schedule_id)) >= state["counts"]["fired"]

    wait_until(all_taken, 10, "every fired occurrence to be taken")
    return int(state["counts"]["fired"])


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    url: str = request.getfixturevalue("redis_url")
    return url


def test_kill_9_and_restart_lose_no_occurrence_and_double_none(store_url: str) -> None:
    proc = ServerProcess(store=store_url)
    try:
        with Client(*proc.address) as dw:
            dw.schedule_add({"id": "beat", **SCHEDULE})
        got: list[str] = []
        rng = random.Random(17)
        for _ in range(3):
            # A kill at a random point of a second: before, during or after a fire.
            _take(proc.address, time.time() + 1.5 + rng.random(), got)
            proc.kill()
            time.sleep(rng.random())
            proc.start()
        _take(proc.address, time.time() + 1.5, got)
        fired = _drain_fired(proc.address, "beat", got)
    finally:
        proc.kill()
    assert fired >= 5
    _assert_each_once(got, "beat", fired)


def test_a_restart_loads_the_schedule_and_its_state(store_url: str) -> None:
    proc = ServerProcess(store=store_url)
    try:
        with Client(*proc.address) as dw:
            dw.schedule_add({"id": "kept", "every": 3600, "topic": "t", "jitter": 30})
            dw.schedule_update("kept", {"max_runs": 3}, 1)
            dw.schedule_pause("kept", "for the restart")
            before = dw.schedule_get("kept")
        proc.stop()
        proc.start()
        with Client(*proc.address) as dw:
            after = dw.schedule_get("kept")
            stats = dw.stats()
    finally:
        proc.kill()
    assert after == before and after["version"] == 3 and after["note"] == "for the restart"
    assert stats["schedules"] == {"count": 1, "paused": 1}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node(redis_url: str, name: str) -> ServerProcess:
    # A real port: a node's address is what the others send clients to.
    return ServerProcess(
        "--port", str(_free_port()), "--node", name, "--lease", "1.5", store=redis_url
    )


@pytest.mark.redis
def test_two_nodes_on_one_redis_fire_each_occurrence_once(redis_url: str) -> None:
    nodes = [_node(redis_url, "a"), _node(redis_url, "b")]
    try:
        seeds = [f"{node.host}:{node.port}" for node in nodes]

        def settled() -> bool:
            with ClusterClient(seeds) as dw:
                owners = {entry["node"] for entry in dw.cluster()["owners"]}
            return owners == {"a", "b"}

        wait_until(settled, 15, "the two nodes to share the partitions")
        names = [f"sched-{n}" for n in range(8)]
        with ClusterClient(seeds) as dw:
            for name in names:
                dw.schedule_add({"id": name, **SCHEDULE})
        got: list[str] = []
        takers = [
            threading.Thread(target=_take, args=(node.address, time.time() + 4, got))
            for node in nodes
        ]
        for taker in takers:
            taker.start()
        for taker in takers:
            taker.join()
        fired: dict[str, int] = {}
        with ClusterClient(seeds) as dw:
            for name in names:
                fired[name] = dw.schedule_pause(name)["counts"]["fired"]

        def collected() -> bool:
            for node in nodes:
                _take(node.address, time.time() + 0.3, got)
            return all(len(_nominals(got, n)) >= fired[n] for n in names)

        wait_until(collected, 10, "every fired occurrence to be taken")
    finally:
        for node in nodes:
            node.kill()
    for name in names:
        assert fired[name] >= 3
        _assert_each_once(got, name, fired[name])
