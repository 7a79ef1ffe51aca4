"""``--replicas N`` and the start-up warnings about Redis's settings (issue 16, item 7),
with real servers: private redis-servers (a primary and its replica) and
``delaywheel serve`` processes on them.

- At start a node warns, one log line each, when AOF is off, when the
  eviction policy is not ``noeviction`` and when ``--replicas`` exceeds the
  replicas connected.
- With ``--replicas 1`` a change is answered only once the replica has it
  (read from the replica right after the reply); with the replica stopped, an
  add answers ``unavailable`` after WAIT's timeout, and the node keeps serving
  the requests that write nothing, as the primary holds them.
"""

from __future__ import annotations

import signal
import threading
import time
import zlib
from pathlib import Path

import pytest
from conftest import RedisCluster, RedisServer, primary_with_replica
from delaywheel_client import Client
from delaywheel_client.errors import Exists, Unavailable
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.ha.replicas import CHECK_EVERY_S
from delaywheel.store.redis.layout import Layout
from delaywheel.store.redis.store import REPLICAS_WAIT_S

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]

LEASE = "3"  # L = 3 s, as the tests
PARTITIONS = 16
# An add with the replica stopped waits out WAIT's timeout; the bound leaves
# room for a loaded 2-core machine.
UNAVAILABLE_BOUND_S = REPLICAS_WAIT_S + 4.0


def _warnings(log: str, phrase: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING" in line and phrase in line]


def test_each_unsafe_redis_setting_is_one_warning_line_at_start(tmp_path: Path) -> None:
    """AOF off, allkeys-lru and --replicas 1 with no replica: three lines, once each."""
    unsafe = RedisServer(tmp_path, ["--appendonly", "no", "--maxmemory-policy", "allkeys-lru"])
    unsafe.start()
    try:
        node = ServerProcess("--replicas", "1", "--lease", LEASE, store=unsafe.url)
        try:
            wait_until(lambda: "loaded" in node.log_text(), what="the node to load")
            log = node.log_text()
        finally:
            node.stop()
    finally:
        unsafe.kill()
    for phrase in (
        "Redis has AOF off (appendonly no)",
        "Redis maxmemory-policy is allkeys-lru",
        "--replicas 1 but the Redis primary has 0 replica(s) connected",
    ):
        assert len(_warnings(log, phrase)) == 1, f"{phrase!r} in:\n{log}"


def test_safe_settings_and_enough_replicas_start_warning_only_of_a_failover(
    tmp_path: Path,
) -> None:
    """One replica and ``--replicas 1``: the only warning is the one docs/ha.md
    gives for that layout (a failover would stop writes), once the replica
    watch has looked (its first look comes after the listening line)."""
    risk = "a failover of it would stop every write"
    with primary_with_replica(tmp_path) as (primary, _replica):
        node = ServerProcess("--replicas", "1", "--lease", LEASE, store=primary.url)
        try:
            wait_until(lambda: risk in node.log_text(), 10, "the replica watch's first look")
            log = node.log_text()
        finally:
            node.stop()
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and risk in warnings[0], log


def _on_replica(replica: RedisServer, task_id: str) -> bytes | None:
    key = Layout("delaywheel", PARTITIONS).of(task_id).tasks
    with replica.client() as client:
        value: bytes | None = client.hget(key, task_id)
        return value


def test_replicas_one_answers_after_the_replica_has_it_and_unavailable_without_it(
    tmp_path: Path,
) -> None:
    with primary_with_replica(tmp_path) as (primary, replica):
        node = ServerProcess("--replicas", "1", "--lease", LEASE, store=primary.url)
        try:
            with Client(*node.address, timeout_s=30) as dw:
                # Up: each reply comes after WAIT 1, so the replica has the change.
                for n in range(20):
                    dw.add("t", {"n": n}, id=f"up-{n}", delay=3600)
                    assert _on_replica(replica, f"up-{n}") is not None, f"up-{n}"
                assert dw.delete("up-0") is True
                assert _on_replica(replica, "up-0") is None

                # Stopped: WAIT 1 times out; the add is answered unavailable.
                assert replica.proc is not None
                replica.proc.send_signal(signal.SIGSTOP)
                try:
                    reads = _Reads(node.address)
                    started_s = time.monotonic()
                    with pytest.raises(Unavailable, match="WAIT 1: 0 replica"):
                        dw.add("t", {}, id="down-1", delay=3600)
                    took_s = time.monotonic() - started_s
                    assert REPLICAS_WAIT_S * 0.9 <= took_s < UNAVAILABLE_BOUND_S, took_s
                    reads.stop()
                    with pytest.raises(Unavailable):
                        dw.delete("up-1")
                    # The node still serves what writes nothing, at once, and
                    # as the primary holds it: the delete reached the primary.
                    assert dw.ping() == "pong"
                    assert dw.get("up-1") is None
                    assert dw.get("up-2") is not None
                    assert reads.answered > 0 and reads.worst_s < 1.0, reads
                finally:
                    replica.proc.send_signal(signal.SIGCONT)
                # Back: the next change is acknowledged (the client retries with the id).
                wait_until(lambda: _added(dw, "down-1"), 20, "an add with the replica back")
                assert _on_replica(replica, "down-1") is not None
                print(f"--replicas 1, replica stopped: add answered unavailable in {took_s:.2f} s")
        finally:
            node.stop()


def test_exists_is_answered_only_once_the_replicas_confirm_the_task(tmp_path: Path) -> None:
    """``exists`` acknowledges a task, so it waits for the task's record to be
    confirmed again (rewritten, WAIT 1): a node may hold a task loaded from a
    primary about to be demoted, which no replica has. With the replica
    stopped, a resent add is ``unavailable``, not ``exists``; with it back,
    ``exists``. Both kinds of task: one in the wheel, one packed (far away)."""
    with primary_with_replica(tmp_path) as (primary, replica):
        node = ServerProcess("--replicas", "1", "--lease", LEASE, store=primary.url)
        try:
            with Client(*node.address, timeout_s=30) as dw:
                dw.add("t", {}, id="near", delay=30)
                dw.add("t", {}, id="far", delay=7 * 86_400)
                with pytest.raises(Exists):  # confirmed now: the replica is up
                    dw.add("t", {}, id="near", delay=30)
                assert replica.proc is not None
                replica.proc.send_signal(signal.SIGSTOP)
                try:
                    for task_id in ("near", "far"):
                        with pytest.raises(Unavailable, match="WAIT 1: 0 replica"):
                            dw.add("t", {}, id=task_id, delay=30)
                        assert dw.get(task_id) is not None  # nothing changed
                    with pytest.raises(Unavailable, match="WAIT 1: 0 replica"):
                        dw.add_many([{"topic": "t", "id": "far", "delay": 30}])
                finally:
                    replica.proc.send_signal(signal.SIGCONT)
                for task_id in ("near", "far"):
                    wait_until(lambda t=task_id: _exists(dw, t), 20, f"exists for {task_id}")
                assert dw.stats()["tasks"] == 2
        finally:
            node.stop()


def _exists(dw: Client, task_id: str) -> bool:
    try:
        dw.add("t", {}, id=task_id, delay=30)
    except Exists:
        return True
    except Unavailable:
        return False
    raise AssertionError(f"add of {task_id} was accepted: it existed")


def _added(dw: Client, task_id: str) -> bool:
    try:
        dw.add("t", {}, id=task_id, delay=3600)
    except Unavailable:
        return False
    except Exception as exc:  # exists: the earlier unknown add had landed after all
        return "exists" in str(exc).lower()
    return True


class _Reads:
    """``get`` and ``stats`` from a thread of their own, timed, until ``stop()``."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.answered = 0
        self.worst_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Client(*self.address, timeout_s=10) as dw:
            while not self._stop.is_set():
                started_s = time.monotonic()
                dw.get("up-2")
                dw.stats()
                self.worst_s = max(self.worst_s, time.monotonic() - started_s)
                self.answered += 1
                self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __repr__(self) -> str:
        return f"{self.answered} reads answered, worst {self.worst_s:.3f} s"


def test_stats_show_a_lost_replica_within_a_look_every_2_s(tmp_path: Path) -> None:
    """``stats``' ``replicas.connected`` is read from the primary every 2 s:
    a replica gone shows as 0 by the next look (with room for a loaded machine)."""
    with primary_with_replica(tmp_path) as (primary, replica):
        node = ServerProcess("--replicas", "1", "--lease", LEASE, store=primary.url)
        try:
            with Client(*node.address, timeout_s=30) as dw:
                ours = f"127.0.0.1:{primary.port}"

                def connected() -> object:
                    return dw.stats()["replicas"]["connected"]

                wait_until(lambda: connected() == {ours: 1}, 10, "the replica counted")
                replica.kill()
                gone_s = time.monotonic()
                wait_until(lambda: connected() == {ours: 0}, 10, "the replica gone from stats")
                took_s = time.monotonic() - gone_s
        finally:
            node.stop()
    print(f"a lost replica showed in stats {took_s:.2f} s after its kill")
    assert took_s < CHECK_EVERY_S + 3.0, took_s  # one look, and room for a loaded machine


def test_on_a_cluster_the_start_up_checks_read_the_primary_holding_meta(
    redis_cluster: RedisCluster,
) -> None:
    """AOF off on another primary: no warning; on the one that holds
    ``{prefix}:meta``: the warning (docs/ha.md, "Start-up checks")."""
    prefix = "startchk"
    home = redis_cluster.owner_of(f"{{{prefix}}}:meta")
    other = next(node for node in redis_cluster.nodes if node is not home)

    def aof_warnings() -> list[str]:
        node = ServerProcess(
            "--lease", LEASE, "--redis-prefix", prefix, store=redis_cluster.nodes[0].url
        )
        try:
            wait_until(lambda: "loaded" in node.log_text(), what="the node to load")
            return _warnings(node.log_text(), "Redis has AOF off (appendonly no)")
        finally:
            node.stop()

    try:
        with other.client() as client:
            client.config_set("appendonly", "no")
        assert aof_warnings() == []
        with home.client() as client:
            client.config_set("appendonly", "no")
        assert len(aof_warnings()) == 1
    finally:
        for node in (home, other):
            with node.client() as client:
                client.config_set("appendonly", "yes")


def test_without_its_replica_a_partition_is_written_about_once_a_second(tmp_path: Path) -> None:
    """Four clients adding to one partition while the replica is stopped: the
    journal keeps one write of the partition in flight, each waits out WAIT's
    second and carries every add gathered meanwhile, so the primary sees about
    one WAIT a second and every add is answered unavailable (docs/ha.md)."""
    ids = [i for i in (f"w{n}" for n in range(20_000)) if zlib.crc32(i.encode()) % PARTITIONS == 0]
    window_s, clients = 4.0, 4
    refused: list[int] = []
    accepted: list[str] = []

    def adding(first: int, until_s: float, address: tuple[str, int]) -> None:
        count = 0
        with Client(*address, timeout_s=30) as dw:
            for task_id in ids[first::clients]:
                if time.monotonic() >= until_s:
                    break
                try:
                    dw.add("t", {}, id=task_id, delay=3600)
                    accepted.append(task_id)
                except Unavailable:
                    count += 1
        refused.append(count)

    with primary_with_replica(tmp_path) as (primary, replica):
        node = ServerProcess("--replicas", "1", "--lease", LEASE, store=primary.url)
        try:
            with Client(*node.address, timeout_s=30) as dw:
                dw.add("t", {}, id=ids[0], delay=3600)  # the partition's link is up
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGSTOP)
            try:
                with primary.client() as client:
                    client.config_resetstat()
                until_s = time.monotonic() + window_s
                threads = [
                    threading.Thread(target=adding, args=(1 + k, until_s, node.address))
                    for k in range(clients)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                with primary.client() as client:
                    waits = client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
            finally:
                replica.proc.send_signal(signal.SIGCONT)
        finally:
            node.stop()
    print(f"replica stopped {window_s:g} s: {waits} WAITs, adds refused {refused}")
    assert accepted == []
    # One a second, give or take the one in flight at each end; fewer on a
    # loaded machine, never one per add.
    assert 2 <= waits <= window_s + 2, waits
    assert sum(refused) > waits, (refused, waits)  # a write carries several adds
