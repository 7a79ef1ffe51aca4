"""Broker tests' helpers: deliveries to send, brokers started, queues and streams made.

For tests/test_delivery_brokers.py (each sender against a real broker) and
tests/test_delivery_headers.py. RabbitMQ and NATS are the machine's own
(services.py); each helper makes its own queue, exchange or stream under a
unique name and deletes it afterwards.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aio_pika
import msgpack
import nats
from nats.js.api import StreamConfig
from services import AMQP_URL as AMQP_URL
from services import NATS_URL as NATS_URL

from delaywheel.delivery.base import Delivery
from delaywheel.delivery.brokers import Brokers

# Long enough for a first connection on a busy 2-core machine; a test that
# needs longer has found a bug.
TEST_TIMEOUT_S = 60.0

T = TypeVar("T")
AT_S = 1_700_000_000.25


def run(work: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(work, TEST_TIMEOUT_S)

    return asyncio.run(bounded())


def unique(prefix: str) -> str:
    return f"dw-test-{prefix}-{uuid.uuid4().hex[:12]}"


def delivery(target: dict[str, Any], body: Any = None, **fields: Any) -> Delivery:
    values: dict[str, Any] = {
        "task_id": "task-1",
        "topic": "emails",
        "attempt": 1,
        "at_s": AT_S,
        "body_packed": msgpack.packb(
            {"to": "a@example.com", "n": [1, 2]} if body is None else body
        ),
        "target": target,
    }
    values.update(fields)
    return Delivery(**values)


@asynccontextmanager
async def started(brokers: Brokers) -> AsyncIterator[Brokers]:
    await brokers.start()
    try:
        yield brokers
    finally:
        await brokers.close()


async def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def rabbit_queue(
    exchange: str = "", routing_key: str | None = None
) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """A fresh queue (bound to a fresh ``exchange`` when one is named), deleted after."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("q"), durable=True)
        if exchange:
            declared = await channel.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT)
            await queue.bind(declared, routing_key=routing_key)
        try:
            yield queue
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            if exchange:
                await channel.exchange_delete(exchange)
    finally:
        await connection.close()


def amqp_target(routing_key: str, exchange: str = "") -> dict[str, Any]:
    return {"type": "amqp", "broker": "mq", "exchange": exchange, "routing_key": routing_key}


@asynccontextmanager
async def jetstream_stream() -> AsyncIterator[tuple[Any, str, str]]:
    """``(jetstream, stream name, subject prefix)`` of a fresh stream, deleted after."""
    client = await nats.connect(NATS_URL)
    try:
        js = client.jetstream()
        name, prefix = unique("s").replace("-", "_"), unique("subj")
        await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.>"]))
        try:
            yield js, name, prefix
        finally:
            await js.delete_stream(name)
    finally:
        await client.close()


def nats_target(subject: str) -> dict[str, Any]:
    return {"type": "nats", "broker": "bus", "subject": subject}
