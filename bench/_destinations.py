"""The deliveries section's destinations: where a run sends its tasks, and
how to ask each what it got.

- the HTTP sink (``bench/http_sink.py``), one endpoint answering at once and
  one taking ``SLOW_S``; what arrived is the sink's count of answered requests;
- a Redis list and a Redis stream on a private redis-server (``LLEN``, ``XLEN``);
- RabbitMQ at 127.0.0.1:5672 (guest): a durable queue of our own, uniquely
  named, published to by name through the default exchange; what arrived is
  its message count; deleted afterwards;
- NATS JetStream at 127.0.0.1:4222: a stream of our own on a unique subject;
  what arrived is its message count; deleted afterwards.

RabbitMQ and NATS are the machine's own, not ours to start: when one does
not answer, or making our queue or stream there fails, ``broker_destinations``
leaves it out and says why. Everything made on a broker is deleted when the
caller's ``ExitStack`` closes.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aio_pika
import nats
import nats.errors
import redis
from aio_pika.abc import AbstractChannel
from delaywheel_client import targets
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from bench import progress
from bench._procs import private_redis_process
from bench.http_sink import SLOW_S, Sink

CONNECT_TIMEOUT_S = 5.0  # to RabbitMQ or NATS, for our own setup and counts
AMQP_HOST_PORT = ("127.0.0.1", 5672)
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
NATS_HOST_PORT = ("127.0.0.1", 4222)
NATS_URL = "nats://127.0.0.1:4222"
# The --broker names the server is given.
REDIS_BROKER, AMQP_BROKER, NATS_BROKER = "cache", "mq", "bus"

T = TypeVar("T")


@dataclass(frozen=True)
class Destination:
    """Where one run delivers, and how to ask it what it got."""

    key: str  # figure keys: <key>_rate, <key>_cpu_us
    label: str
    target: dict[str, Any]
    tasks: int
    arrived: Callable[[], int]  # what the destination holds
    peer: tuple[str, int] | None = None  # (name, pid) of the other side, when ours

    @property
    def broker(self) -> str | None:
        """The server's broker it goes through (None for HTTP)."""
        return self.target.get("broker")


def unique(prefix: str) -> str:
    return f"dw-bench-{prefix}-{uuid.uuid4().hex[:12]}"


def answers(host_port: tuple[str, int]) -> bool:
    """Whether something accepts a TCP connection there (nats-py would wait forever)."""
    try:
        with socket.create_connection(host_port, timeout=1.0):
            return True
    except OSError:
        return False


# -- the destinations -----------------------------------------------------------------


def http_destinations(sink: Sink, tasks: int, slow_tasks: int) -> list[Destination]:
    """The sink's at-once and 100 ms endpoints, ``tasks`` and ``slow_tasks`` to each."""
    peer = ("sink", sink.pid)
    found = []
    for key, label, kind, count in (
        ("http", "HTTP, endpoint answering at once", "ok", tasks),
        ("http_slow", f"HTTP, endpoint taking {SLOW_S * 1e3:g} ms", "slow", slow_tasks),
    ):
        url = sink.url(kind, "at-once")
        found.append(
            Destination(key, label, targets.http(url), count, partial(sink.answered, url), peer)
        )
    return found


def redis_destinations(stack: ExitStack, tasks: int) -> tuple[list[Destination], str]:
    """The list and the stream on a private redis-server; and its ``--broker`` URL."""
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dw-deliveries-")))
    started = stack.enter_context(private_redis_process(directory))
    assert started is not None  # the caller looked for redis-server
    pid, url = started
    client = redis.Redis.from_url(url)
    stack.callback(client.close)
    list_key, stream_key = unique("list"), unique("stream")
    to_list = targets.redis_list(list_key, broker=REDIS_BROKER)
    to_stream = targets.redis_stream(stream_key, broker=REDIS_BROKER)

    def in_list() -> int:
        return int(client.llen(list_key))

    def in_stream() -> int:
        return int(client.xlen(stream_key))

    peer = ("redis-server", pid)
    found = [
        Destination("redis_list", "Redis list (LPUSH)", to_list, tasks, in_list, peer),
        Destination("redis_stream", "Redis stream (XADD)", to_stream, tasks, in_stream, peer),
    ]
    return found, url


@contextmanager
def made(create: Callable[[], object], remove: Callable[[], object]) -> Iterator[None]:
    """What ``create`` makes on a broker, for the block; ``remove`` deletes it after."""
    create()
    try:
        yield
    finally:
        remove()


def on_amqp(work: Callable[[AbstractChannel], Awaitable[T]]) -> T:
    """``work`` on a channel of a fresh connection to RabbitMQ, closed after."""

    async def session() -> T:
        connection = await aio_pika.connect(AMQP_URL, timeout=CONNECT_TIMEOUT_S)
        async with connection:
            return await work(await connection.channel())

    return asyncio.run(asyncio.wait_for(session(), 2 * CONNECT_TIMEOUT_S))


async def queued(channel: AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    return declared.declaration_result.message_count or 0


def amqp_destination(stack: ExitStack, tasks: int) -> Destination:
    """A durable queue of our own, published to by name through the default exchange."""
    name = unique("q")
    stack.enter_context(
        made(
            lambda: on_amqp(lambda channel: channel.declare_queue(name, durable=True)),
            lambda: on_amqp(lambda channel: channel.queue_delete(name)),
        )
    )
    label = "RabbitMQ, durable queue (confirms)"
    target = targets.amqp(name, broker=AMQP_BROKER)
    return Destination("amqp", label, target, tasks, lambda: on_amqp(partial(queued, name=name)))


def on_jetstream(work: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    """``work`` on the JetStream context of a fresh connection to NATS, closed after."""

    async def quiet(error: Exception) -> None:
        pass  # a failure shows as the exception work raises

    async def session() -> T:
        client = await nats.connect(
            NATS_URL,
            connect_timeout=round(CONNECT_TIMEOUT_S),
            allow_reconnect=False,
            error_cb=quiet,
        )
        try:
            return await work(client.jetstream())
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(session(), 2 * CONNECT_TIMEOUT_S))


async def stored(js: JetStreamContext, stream: str) -> int:
    info = await js.stream_info(stream)
    return info.state.messages


def nats_destination(stack: ExitStack, tasks: int) -> Destination:
    """A JetStream stream of our own, taking one unique subject."""
    stream = unique("s").replace("-", "_")
    subject = f"{unique('subj')}.due"
    config = StreamConfig(name=stream, subjects=[subject])
    stack.enter_context(
        made(
            lambda: on_jetstream(lambda js: js.add_stream(config)),
            lambda: on_jetstream(lambda js: js.delete_stream(stream)),
        )
    )
    label = "NATS JetStream (PubAck)"
    target = targets.nats(subject, broker=NATS_BROKER)
    return Destination(
        "nats", label, target, tasks, lambda: on_jetstream(partial(stored, stream=stream))
    )


@dataclass(frozen=True)
class MachineBroker:
    """A broker of the machine's own (not started by us), and how we use it."""

    who: str
    host_port: tuple[str, int]
    name: str  # the server's --broker NAME
    url: str
    destination: Callable[[ExitStack, int], Destination]  # (stack, tasks)
    setting_up: str  # what making our queue or stream is, for the skip message
    # Setting it up fails with these when it is down or refuses us: its figures are
    # then left out. A failure after that is an error of the run.
    down: tuple[type[Exception], ...]


MACHINE_BROKERS = (
    MachineBroker(
        "RabbitMQ", AMQP_HOST_PORT, AMQP_BROKER, AMQP_URL, amqp_destination,
        "declaring a queue", (OSError, asyncio.TimeoutError, aio_pika.exceptions.AMQPError),
    ),
    MachineBroker(
        "NATS", NATS_HOST_PORT, NATS_BROKER, NATS_URL, nats_destination,
        "adding a JetStream stream", (OSError, asyncio.TimeoutError, nats.errors.Error),
    ),
)  # fmt: skip


def broker_destinations(
    stack: ExitStack, tasks: int, skipped: list[str]
) -> tuple[list[Destination], list[str]]:
    """Every broker that can be measured here, ``tasks`` to each, and the server's
    ``--broker`` options; why the others cannot goes to ``skipped``."""
    found: list[Destination] = []
    options: list[str] = []
    if shutil.which("redis-server") is None:
        skipped.append("no redis-server installed: the Redis figures are left out")
    else:
        redis_ones, url = redis_destinations(stack, tasks)
        found += redis_ones
        options += ["--broker", f"{REDIS_BROKER}={url}"]
    for broker in MACHINE_BROKERS:
        host, port = broker.host_port
        if not answers(broker.host_port):
            skipped.append(f"{broker.who} figures skipped: nothing answers on {host}:{port}")
            continue
        try:
            found.append(broker.destination(stack, tasks))
        except broker.down as exc:
            skipped.append(f"{broker.who} figures skipped: {broker.setting_up} failed: {exc!r}")
            continue
        options += ["--broker", f"{broker.name}={broker.url}"]
    for message in skipped:
        progress(message)
    return found, options
