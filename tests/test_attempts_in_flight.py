"""An attempt whose own write is in flight as its node lets go of it (a
handback to a joining node, a stop) is sent once, by one node.

In-process, on the real deliveries (aiohttp) to a real HTTP receiver:

- a handback: one node's engine and coordinator on a private redis-server,
  sending to an HTTP sink (tests/hacheck.py). The task fires and its attempt
  is begun (journaled ``delivering``, the write not yet done) in the same
  loop turn as the handback starts, so the handback finds an attempt that is
  not being sent yet and whose write is in flight. The handback did not
  wait for it: the write came back during its drain and sent it, the lease
  was released with the attempt ``delivering`` in the store (its outcome no
  write of a partition gone from here), and the next owner sent it again at
  its deadline. Scenarios 7 and 8 of tests/test_ha.py hit it on main in 2 of
  87 runs, one each (the first delivery with epoch 0, from the node handing
  back; the second from the new owner at the 1 s timeout).
- a stop: the dispatcher's drain waited only for the sends running when it
  began; one that started during it (its attempt's write came back then)
  was cut off at the end of the others, maybe after it had reached its
  receiver, its outcome never written.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from hacheck import Sink, sink
from owners import keyspace_node
from redis.asyncio import Redis

from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.base import Delivery
from delaywheel.delivery.dispatcher import Dispatcher
from delaywheel.delivery.http import HttpSender
from delaywheel.delivery.service import Deliveries
from delaywheel.delivery.targets import TargetRules
from delaywheel.engine.record import from_record
from delaywheel.engine.task import DEFAULT_PRIORITY
from delaywheel.ha.coordinator import Coordinator

pytestmark = pytest.mark.redis

PARTITIONS = 4
LEASE_S = 3.0
TASK_ID = "handed-1"
PARTITION = zlib.crc32(TASK_ID.encode()) % PARTITIONS
# The attempt's deadline: the next owner sends it again once this has passed.
TIMEOUT_S = 0.5


@pytest.fixture
def receiver() -> Iterator[Sink]:
    with sink() as running:
        yield running


async def _handed_back_while_journaled(url: str, receiver: Sink) -> tuple[int, int, str | None]:
    """Fire the task and hand its partition back in one loop turn; then take
    the partition again (as the next owner would) past the attempt's deadline.
    Returns the deliveries when the handback ended, at the end, and the
    task's state in the store after the handback (None: gone)."""
    rules = TargetRules(AllowList.parse("127.0.0.1"))
    deliveries = Deliveries(rules, http_concurrency=4, signing_secret=None)
    async with keyspace_node(
        url, partitions=PARTITIONS, lease_s=LEASE_S, now_s=time.time(), tick_s=0.05, targets=rules
    ) as node:
        sharing, keyspace, engine = node.sharing, node.keyspace, node.engine
        coordinator = Coordinator(engine, keyspace, sharing, node.rights)
        try:
            await coordinator.start()  # one node: it takes every partition
            rounds = coordinator._loop_task
            assert rounds is not None and len(sharing.serving) == PARTITIONS
            rounds.cancel()  # no round takes the partition back but the test's own
            await asyncio.wait({rounds})
            await deliveries.start(engine, lambda: None)
            target = {"type": "http", "url": receiver.url, "timeout": TIMEOUT_S}
            engine.add({"id": TASK_ID, "topic": "hooks", "delay": 0, "target": target}, time.time())
            await engine.drain()  # the add is durable: its attempt may begin
            fire_s = engine.next_fire_s()
            assert fire_s is not None
            # No await from here into the handback: the attempt is begun (its
            # write queued, not done) and the partition is handed back at once.
            engine.advance(max(fire_s, time.time()))
            assert TASK_ID in engine.table.delivering, "the attempt did not begin"
            await coordinator.moves.hand_back({PARTITION})
            at_handback = len(receiver.received())
            async with Redis.from_url(url) as client:
                record = await client.hget(keyspace.layout.partition(PARTITION).tasks, TASK_ID)
            state = None if record is None else from_record(TASK_ID, record).state
            # The next owner (this node again) loads the partition past the deadline.
            await asyncio.sleep(TIMEOUT_S + 0.2)
            await coordinator._round()
            assert PARTITION in sharing.serving
            until_s = time.monotonic() + 2.0
            while time.monotonic() < until_s:  # a resend would come within a tick
                engine.advance(time.time())
                await asyncio.sleep(0.05)
            return at_handback, len(receiver.received()), state
        finally:
            await coordinator.stop()
            await deliveries.stop(1.0)


def test_an_attempt_journaled_as_its_partition_is_handed_back_is_sent_once(
    redis_url: str, receiver: Sink
) -> None:
    at_handback, at_end, state = asyncio.run(_handed_back_while_journaled(redis_url, receiver))
    # Under the partition's epoch, as every delivery (it was 0: served no more).
    assert [(d.task_id, d.epoch) for d in receiver.received()] == [(TASK_ID, 1)], (
        at_handback,
        state,
    )
    # The handback waited for the send and wrote its outcome before it let go.
    assert (at_handback, at_end, state) == (1, 1, None)


async def _drained_while_a_send_starts(endpoint: Endpoint) -> tuple[int, list[tuple[str, Any]]]:
    """Two attempts to a slow receiver: the first sent before the drain, the
    second's write coming back during it. Returns the sends cut off and the
    outcomes reported (id, error)."""
    rules = TargetRules(AllowList.parse("127.0.0.1"))
    sender = HttpSender(rules.allow, concurrency=4)
    readies: dict[str, Callable[[Delivery | None], None]] = {}

    def begin(task_id: str, ready: Callable[[Delivery | None], None]) -> bool:
        readies[task_id] = ready  # its write in flight until the test says
        return True

    reported: list[tuple[str, Any]] = []
    dispatcher = Dispatcher(
        lambda target: sender,
        begin,
        lambda task_id, attempt, error, *_: reported.append((task_id, error)),
        http_lane_limit=4,
    )
    target = rules.check(
        {"type": "http", "url": endpoint.url("/slow"), "timeout": 5.0},
        b"\xc0",
        task_id=None,
        topic="hooks",
    )
    try:
        for task_id in ("first", "second"):
            dispatcher.queue(task_id, target, DEFAULT_PRIORITY)
        readies["first"](Delivery("first", "hooks", 1, time.time(), b"\xc0", target))
        draining = asyncio.get_running_loop().create_task(dispatcher.drain(5.0))
        await asyncio.sleep(endpoint.slow_s / 3)
        readies["second"](Delivery("second", "hooks", 1, time.time(), b"\xc0", target))
        cut = await draining
    finally:
        await sender.close()
    return cut, reported


def test_a_stop_lets_a_send_that_starts_during_its_grace_finish(endpoint: Endpoint) -> None:
    endpoint.slow_s = 0.3
    cut, reported = asyncio.run(_drained_while_a_send_starts(endpoint))
    assert [seen.path for seen in endpoint.requests()] == ["/slow", "/slow"]
    assert (cut, reported) == (0, [("first", None), ("second", None)])
