"""A node's graceful stop on a shared Redis keyspace always ends (docs/ha.md,
"Graceful handoff"): against the session's private redis-server, and a
redis-server of the test's own for the test that pauses it.

The bound counts from the signal and covers the server's own stop too: a
broker's connection attempt that swallowed its cancel once held the whole
stop for as long as Redis was paused (2 of 6 runs), and a journal that
cannot drain is given up on with the rest, losing nothing acknowledged.

The hang the first test keeps out: redis-py (8.2, on Python 3.11) swallows a
cancel that lands while a command is being sent, so a stop that cancelled the
coordinator's round loop and waited for it waited for ever, while the loop
went on running rounds (seen after SIGTERM on a node with 1,000,000 tasks).
"""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import RedisServer
from delaywheel_client import Client, DelaywheelError
from owners import keyspace_node
from redis.asyncio import Redis
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.ha.coordinator import Coordinator

PARTITIONS = 4
LEASE_S = 1.0
STOPS = 25
# The give-up's timer runs late by what else the loop has to do then, on a
# shared 2-core machine: a margin on the bound, not on the store's close.
GIVE_UP_LATE_S = 0.5


def _gave_up_after_s(text: str) -> float:
    """From the log's "shutting down" to its one give-up line (text log times)."""
    lines = text.splitlines()
    gave_up = [line for line in lines if "graceful stop gave up" in line]
    assert len(gave_up) == 1, text
    stopping = [line for line in lines if line.endswith(" shutting down")]
    assert len(stopping) == 1, text
    return _logged_s(gave_up[0]) - _logged_s(stopping[0])


def _logged_s(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


async def _stop_in_mid_round(url: str, after_s: float) -> tuple[bool, bool, int]:
    """One node: start, let its rounds run back to back for ``after_s``, stop.
    Returns (stop ended in time, round loop ended, lease keys left)."""
    async with keyspace_node(
        url, partitions=PARTITIONS, lease_s=LEASE_S, now_s=time.time()
    ) as node:
        keyspace = node.keyspace
        coordinator = Coordinator(
            node.engine, keyspace, node.sharing, node.rights, handoff_wait_s=0.5
        )
        await coordinator.start()
        # Rounds back to back: a stop then nearly always lands inside a Redis
        # command of a round, the window where redis-py swallows a cancel.
        coordinator.period_s = 0.0
        await asyncio.sleep(after_s)
        stopping = asyncio.get_running_loop().create_task(coordinator.stop())
        done, _ = await asyncio.wait({stopping}, timeout=coordinator.stop_bound_s + 2.0)
        loop_task = coordinator._loop_task
        ended = loop_task is not None and loop_task.done()
        async with Redis.from_url(url) as client:
            leases = sum([await client.exists(keys.lease) for keys in keyspace.layout], start=0)
        return bool(done), ended, leases


@pytest.mark.slow
def test_a_stop_in_the_middle_of_a_round_ends_and_releases_every_lease(redis_url: str) -> None:
    rng = random.Random(16)
    results = []
    for _ in range(STOPS):
        # Not asyncio.run: it would wait for a round loop that never ends.
        loop = asyncio.new_event_loop()
        try:
            results.append(
                loop.run_until_complete(_stop_in_mid_round(redis_url, rng.uniform(0, 0.02)))
            )
        finally:
            loop.close()
    assert all(done for done, _, _ in results), results
    assert all(ended for _, ended, _ in results), results
    assert all(leases == 0 for _, _, leases in results), results  # handed back, not expired


@pytest.fixture
def own_redis(tmp_path: Path) -> RedisServer:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server  # type: ignore[misc]
    finally:
        server.kill()


def _pause(redis_server: RedisServer) -> None:
    """Pause every client of ``redis_server`` for 10 s: longer than the give-up
    bound (grace + 3 L = 4 s; it took 4.1 s), so no hand-back can get through;
    not much longer, since the test then waits the pause out (CLIENT UNPAUSE
    waits behind it too)."""
    with redis_server.client() as client:
        client.execute_command("CLIENT", "PAUSE", "10000", "ALL")


def _sigterm_and_wait(node: ServerProcess) -> tuple[int, float]:
    """SIGTERM ``node``; its exit code and how long it took to exit."""
    assert node.proc is not None
    node.proc.send_signal(signal.SIGTERM)
    started_s = time.monotonic()
    code = node.proc.wait(30)
    return code, time.monotonic() - started_s


@pytest.mark.process
@pytest.mark.redis
@pytest.mark.slow
def test_a_stop_that_cannot_hand_back_gives_up_within_its_bound_and_says_why(
    own_redis: RedisServer,
) -> None:
    grace_s = 1.0
    node = ServerProcess(
        "--node", "a", "--lease", str(LEASE_S), "--shutdown-grace", str(grace_s),
        store=own_redis.url,
    )  # fmt: skip
    try:
        deadline_s = time.monotonic() + 20
        while "serving partition 15" not in node.log_text():
            assert time.monotonic() < deadline_s, node.log_text()
            time.sleep(0.05)
        _pause(own_redis)
        code, took_s = _sigterm_and_wait(node)
    finally:
        with own_redis.client() as client:
            client.execute_command("CLIENT", "UNPAUSE")
        node.stop()
    text = node.log_text()
    assert code == 0, text
    # The bound (the grace and three lease periods) counts from the signal.
    assert _gave_up_after_s(text) < grace_s + 3 * LEASE_S + GIVE_UP_LATE_S, text
    # Then the store's close.
    assert took_s < grace_s + 3 * LEASE_S + 10, (took_s, text)


def _add_until_refused(client: Client, writer: int, acknowledged: list[str]) -> None:
    """Add tasks one at a time until the server stops answering; keep the ids acknowledged."""
    for i in range(1_000_000):
        task_id = f"w{writer}-{i}"
        try:
            client.add("stop", delay=3600, id=task_id)
        except DelaywheelError:  # closed, or unavailable: outcome unknown, not counted
            return
        acknowledged.append(task_id)


@pytest.mark.process
@pytest.mark.redis
@pytest.mark.slow
def test_a_stop_with_writes_stuck_in_a_paused_redis_gives_up_and_loses_nothing_acknowledged(
    own_redis: RedisServer,
) -> None:
    """The bound counts from the signal and covers the server's own stop: its
    wait for the journal (here, adds whose flush Redis holds) gives up with the
    rest. What was acknowledged before is all there for the next node."""
    grace_s = 1.0
    node = ServerProcess(
        "--node", "a", "--lease", str(LEASE_S), "--shutdown-grace", str(grace_s),
        store=own_redis.url,
    )  # fmt: skip
    acknowledged: list[list[str]] = [[] for _ in range(4)]
    clients = [Client(*node.address, timeout_s=60.0, retries=0) for _ in acknowledged]
    writers = [
        threading.Thread(target=_add_until_refused, args=(client, n, acknowledged[n]))
        for n, client in enumerate(clients)
    ]
    try:
        wait_until(lambda: "serving partition 15" in node.log_text(), 20, "the partitions")
        for writer in writers:
            writer.start()
        wait_until(lambda: sum(map(len, acknowledged)) >= 200, 20, "adds acknowledged")
        _pause(own_redis)
        time.sleep(0.2)  # the writers' next adds wait on a flush Redis holds
        code, took_s = _sigterm_and_wait(node)
    finally:
        with own_redis.client() as client:
            client.execute_command("CLIENT", "UNPAUSE")
        node.stop()
        for writer in writers:
            writer.join(30)
        for client in clients:
            client.close()
    text = node.log_text()
    assert code == 0, text
    assert _gave_up_after_s(text) < grace_s + 3 * LEASE_S + GIVE_UP_LATE_S, text
    assert "gave up after 4 s waiting for the journal to drain" in text, text
    # The bound (grace + 3 L = 4 s), then the store's close: the flush in flight
    # gets its connect and reply timeouts (5 s + 5 s), or Redis's answer.
    assert took_s < grace_s + 3 * LEASE_S + 10, (took_s, text)
    ids = [task_id for ours in acknowledged for task_id in ours]
    successor = ServerProcess("--node", "b", "--lease", str(LEASE_S), store=own_redis.url)
    try:
        wait_until(lambda: "serving partition 15" in successor.log_text(), 20, "the takeover")
        with Client(*successor.address) as client:
            missing = [task_id for task_id in ids if client.get(task_id) is None]
    finally:
        successor.stop()
    assert not missing, (len(missing), len(ids), missing[:5])
