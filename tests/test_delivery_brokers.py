"""Broker targets: the registry, and each sender against a real broker.

Redis is the private redis-server of conftest.py (``redis_url``), RabbitMQ and
NATS JetStream are the machine's own, which CI starts (.ci/run): a test that
needs one is marked ``brokers``, and skips when it is not answering
(tests/services.py), or fails in CI. Each test makes its own queue, exchange
or stream under a unique name and deletes it afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from typing import Any, TypeVar
from urllib.parse import unquote

import aio_pika
import aiormq.connection
import msgpack
import pytest
import redis
from brokerkit import (
    AMQP_URL,
    AT_S,
    NATS_URL,
    TEST_TIMEOUT_S,
    amqp_target,
    delivery,
    eventually,
    jetstream_stream,
    nats_target,
    rabbit_queue,
    run,
    started,
    unique,
)
from conftest import RedisServer, free_port

from delaywheel.delivery.base import Delivery, DeliveryFailed, Sender
from delaywheel.delivery.brokers import Brokers, parse_broker_specs, redact, split_env
from delaywheel.errors import RequestError

PASSWORD = "hunter2-secret"
T = TypeVar("T")


# -- the registry: specs, redaction, target checks --------------------------------


def test_parse_broker_specs_and_env() -> None:
    specs = split_env(
        f" jobs=amqp://guest:{PASSWORD},x@127.0.0.1:5672/ , ,events=nats://127.0.0.1:4222,"
        "cache=rediss://h:6380/2,secure=tls://h:4443"
    )
    assert specs == [
        f"jobs=amqp://guest:{PASSWORD},x@127.0.0.1:5672/",  # the comma in the password stays
        "events=nats://127.0.0.1:4222",
        "cache=rediss://h:6380/2",
        "secure=tls://h:4443",
    ]
    urls = parse_broker_specs(specs)
    assert list(urls) == ["jobs", "events", "cache", "secure"]
    brokers = Brokers(urls, "sqlite:///x.db")
    assert [brokers.kind_of(name) for name in urls] == ["amqp", "nats", "redis", "nats"]
    assert brokers.kind_of("store") is None  # the store is not Redis
    assert Brokers({}, "redis://127.0.0.1:6379/0").kind_of("store") == "redis"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("nourl", "must be NAME=URL"),
        ("a=", "must be NAME=URL"),
        (f"bad name=redis://u:{PASSWORD}@h/0", "must be 1 to 64 of"),
        (f"{'n' * 65}=redis://h/0", "must be 1 to 64 of"),
        (f"store=redis://:{PASSWORD}@h/0", "reserved"),
        (f"a=http://u:{PASSWORD}@h/", "must start with one of redis://"),
        (f"a=redis://:{PASSWORD}@/0", "has no host"),
        (f"a=amqp://u:{PASSWORD}@h:99999/", "malformed"),
    ],
)
def test_parse_refusals_name_the_spec_without_the_password(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as caught:
        parse_broker_specs([spec])
    message = str(caught.value)
    assert PASSWORD not in message
    assert message.startswith(f"broker {spec.replace(PASSWORD, '***')!r}: ")


def test_parse_refuses_a_name_given_twice() -> None:
    with pytest.raises(ValueError, match="given twice"):
        parse_broker_specs(["a=redis://h/0", f"a=amqp://u:{PASSWORD}@h/"])


def test_brokers_refuse_the_store_name_and_bad_urls() -> None:
    with pytest.raises(ValueError, match="reserved") as caught:
        Brokers({"store": f"redis://:{PASSWORD}@h/0"})
    assert str(caught.value).startswith("broker 'store=redis://:***@h/0': ")
    with pytest.raises(ValueError, match="must start with one of") as caught:
        Brokers({"web": f"https://u:{PASSWORD}@h/"})
    assert PASSWORD not in str(caught.value)


def test_redact() -> None:
    assert redact(f"amqp://guest:{PASSWORD}@h:5672/vh") == "amqp://guest:***@h:5672/vh"
    assert redact(f"redis://:{PASSWORD}@h/0") == "redis://:***@h/0"
    assert redact(f"rediss://h/0?password={PASSWORD}") == "rediss://h/0?password=***"
    assert redact(f"nats://{PASSWORD}@h:4222") == "nats://***@h:4222"  # a token
    assert redact(f"nats://user:{PASSWORD}@h:4222") == "nats://user:***@h:4222"
    assert redact("amqp://guest@h/") == "amqp://guest@h/"  # a user alone is no secret
    assert redact("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


def registry() -> Brokers:
    return Brokers(
        {"mq": AMQP_URL, "bus": NATS_URL, "cache": "redis://127.0.0.1:1/0"},
        f"redis://:{PASSWORD}@127.0.0.1:1/0",
    )


def test_check_target_fills_in_every_field() -> None:
    brokers = registry()
    assert brokers.check_target({"type": "redis", "key": "jobs"}) == {
        "type": "redis",
        "key": "jobs",
        "mode": "list",
        "broker": "store",
    }
    assert brokers.check_target(
        {"type": "redis", "key": "k", "mode": "stream", "broker": "cache"}
    ) == {"type": "redis", "key": "k", "mode": "stream", "broker": "cache"}
    assert brokers.check_target({"type": "amqp", "broker": "mq", "routing_key": "rk"}) == {
        "type": "amqp",
        "broker": "mq",
        "exchange": "",
        "routing_key": "rk",
    }
    assert brokers.check_target({"type": "nats", "broker": "bus", "subject": "a.b-c.d_e"}) == {
        "type": "nats",
        "broker": "bus",
        "subject": "a.b-c.d_e",
    }


@pytest.mark.parametrize(
    ("target", "shown", "why"),
    [
        ({"type": "redis", "key": "k", "url": "redis://x"}, "'url'", "unknown field"),
        ({"type": "redis"}, "None", "key must be a str of 1 to 1024 bytes"),
        ({"type": "redis", "key": ""}, "''", "key must be a str of 1 to 1024 bytes"),
        ({"type": "redis", "key": 7}, "7", "key must be a str"),
        ({"type": "redis", "key": "k" * 1025}, "'kkkk", "1 to 1024 bytes"),
        ({"type": "redis", "key": "k", "mode": "set"}, "'set'", "mode must be 'list' or 'stream'"),
        ({"type": "redis", "key": "{delaywheel}:tasks"}, "{delaywheel}:tasks", "store's own keys"),
        ({"type": "redis", "key": "k", "broker": "nope"}, "'nope'", "'bus' (nats), 'cache'"),
        ({"type": "redis", "key": "k", "broker": "mq"}, "'mq'", "is amqp, not redis"),
        ({"type": "amqp", "routing_key": "rk"}, "None", "broker must be a broker's name"),
        ({"type": "amqp", "broker": "bus", "routing_key": "rk"}, "'bus'", "is nats, not amqp"),
        ({"type": "amqp", "broker": "mq"}, "None", "routing_key must be a str of 1 to 255"),
        ({"type": "amqp", "broker": "mq", "routing_key": "r" * 256}, "'rrr", "1 to 255 bytes"),
        ({"type": "amqp", "broker": "mq", "routing_key": "r", "exchange": 1}, "1", "exchange"),
        ({"type": "nats", "broker": "bus", "subject": "a b"}, "'a b'", "without spaces"),
        ({"type": "nats", "broker": "bus", "subject": "a.*"}, "'a.*'", "wildcards"),
        ({"type": "nats", "broker": "bus", "subject": "a.>"}, "'a.>'", "wildcards"),
        ({"type": "nats", "broker": "bus", "subject": "a..b"}, "'a..b'", "empty tokens"),
        ({"type": "nats", "broker": "bus", "subject": "a\r\nb"}, "'a\\r\\nb'", "without spaces"),
        ({"type": "nats", "broker": "bus", "subject": "$JS.API.INFO"}, "'$JS.API.INFO'", "'$'"),
        ({"type": "nats", "broker": "mq", "subject": "a"}, "'mq'", "is amqp, not nats"),
        ({"type": "kafka", "broker": "mq"}, "'kafka'", "type must be one of"),
    ],
)
def test_check_target_refusals(target: dict[str, Any], shown: str, why: str) -> None:
    with pytest.raises(RequestError) as caught:
        registry().check_target(target)
    assert caught.value.code == "bad_request"
    assert why in caught.value.message
    assert shown in caught.value.message
    assert PASSWORD not in caught.value.message


def test_store_is_unknown_when_the_store_is_not_redis() -> None:
    brokers = Brokers({"mq": AMQP_URL}, "sqlite:///tasks.db")
    with pytest.raises(RequestError, match="the store is not Redis; this server has 'mq'"):
        brokers.check_target({"type": "redis", "key": "k"})
    with pytest.raises(RequestError, match="this server has no brokers"):
        Brokers({}).check_target({"type": "nats", "broker": "bus", "subject": "s"})


def test_state_before_start_shows_no_password() -> None:
    state = registry().state()
    assert set(state) == {"store", "mq", "bus", "cache"}
    assert state["store"] == {
        "kind": "redis",
        "url": "redis://:***@127.0.0.1:1/0",
        "connected": False,
        "failing_since": None,
        "last_error": None,
    }
    assert PASSWORD not in repr(state)


# -- Redis ------------------------------------------------------------------------


def test_redis_list_pushes_the_packed_map(redis_url: str) -> None:
    body = {"to": "a@example.com", "n": [1, 2.5], "raw": b"\x00\xff"}
    sent = delivery({"type": "redis", "key": "jobs", "mode": "list", "broker": "store"}, body)
    second = delivery(
        {"type": "redis", "key": "jobs", "mode": "list", "broker": "cache"}, "plain", attempt=3
    )

    async def scenario() -> None:
        async with started(Brokers({"cache": redis_url}, redis_url)) as brokers:
            await brokers.sender("store").send(sent)
            await brokers.sender("cache").send(second)
            assert brokers.state()["store"]["connected"] is True

    run(scenario())
    with redis.Redis.from_url(redis_url) as client:
        entries = [msgpack.unpackb(raw) for raw in client.lrange("jobs", 0, -1)]
    assert entries == [  # LPUSH: the newest first
        {"id": "task-1", "topic": "emails", "body": "plain", "attempt": 3, "at": AT_S, "epoch": 0},
        {"id": "task-1", "topic": "emails", "body": body, "attempt": 1, "at": AT_S, "epoch": 0},
    ]


@pytest.mark.parametrize(
    ("body", "stored"),
    [
        (b"\x00raw\xff", b"\x00raw\xff"),
        ("héllo", "héllo".encode()),
        ({"a": [1, None]}, msgpack.packb({"a": [1, None]})),
    ],
)
def test_redis_stream_adds_the_fields(redis_url: str, body: Any, stored: bytes) -> None:
    sent = delivery({"type": "redis", "key": "events", "mode": "stream", "broker": "r"}, body)

    async def scenario() -> None:
        async with started(Brokers({"r": redis_url})) as brokers:
            await brokers.sender("r").send(sent)

    run(scenario())
    with redis.Redis.from_url(redis_url) as client:
        [(_entry_id, fields)] = client.xrange("events")
    assert fields == {
        **{b"id": b"task-1", b"topic": b"emails", b"attempt": b"1", b"epoch": b"0"},
        b"body": stored,
    }


def test_redis_refusal_fails_the_attempt_only(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.set("taken", "a string, not a list")
    refused = delivery({"type": "redis", "key": "taken", "mode": "list", "broker": "r"})
    fine = delivery({"type": "redis", "key": "free", "mode": "list", "broker": "r"})

    async def scenario() -> None:
        async with started(Brokers({"r": redis_url})) as brokers:
            with pytest.raises(DeliveryFailed, match=r"LPUSH 'taken' refused: .*WRONGTYPE"):
                await brokers.sender("r").send(refused)
            await brokers.sender("r").send(fine)
            assert brokers.state()["r"]["connected"] is True  # a refusal is not a lost link

    run(scenario())


def test_redis_restart_is_noticed_and_recovered(
    redis_server: RedisServer, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sent = delivery({"type": "redis", "key": "jobs", "mode": "list", "broker": "r"})
    caplog.set_level(logging.INFO, logger="delaywheel.delivery.brokers")

    async def scenario() -> None:
        async with started(Brokers({"r": redis_url})) as brokers:
            sender = brokers.sender("r")
            await sender.send(sent)
            redis_server.stop()
            try:
                with pytest.raises(DeliveryFailed, match="redis broker 'r'"):
                    await sender.send(sent)
                state = brokers.state()["r"]
                assert state["connected"] is False
                assert state["failing_since"] is not None
                assert state["last_error"]
            finally:
                redis_server.start()
            await eventually(lambda: brokers.state()["r"]["connected"])
            await sender.send(sent)

    run(scenario())
    with redis.Redis.from_url(redis_url) as client:
        assert client.llen("jobs") == 2
    assert "unreachable" in caplog.text
    assert "is back after" in caplog.text


# -- a broker that is down ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            f"amqp://guest:{PASSWORD}@127.0.0.1:{{port}}/",
            {"type": "amqp", "broker": "b", "exchange": "", "routing_key": "q"},
        ),
        (
            f"redis://:{PASSWORD}@127.0.0.1:{{port}}/0",
            {"type": "redis", "broker": "b", "key": "k", "mode": "list"},
        ),
        (
            f"nats://user:{PASSWORD}@127.0.0.1:{{port}}",
            {"type": "nats", "broker": "b", "subject": "s"},
        ),
    ],
    ids=["amqp", "redis", "nats"],
)
def test_a_broker_that_is_down(
    url: str, target: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = url.format(port=free_port())

    async def scenario() -> None:
        brokers = Brokers({"b": url}, connect_timeout_s=2.0)
        began = time.monotonic()
        await brokers.start()
        try:
            assert time.monotonic() - began < 1.0  # start-up never waits for a broker
            began = time.monotonic()
            with pytest.raises(DeliveryFailed, match="broker 'b': not connected") as caught:
                await brokers.sender("b").send(delivery(target))
            assert time.monotonic() - began < 15.0
            assert PASSWORD not in str(caught.value)
            await eventually(lambda: brokers.state()["b"]["failing_since"] is not None)
            state = brokers.state()["b"]
            assert state["connected"] is False
            assert state["failing_since"] <= time.time()
            assert state["last_error"]
            assert PASSWORD not in repr(state)
            assert "***" in state["url"]
        finally:
            await brokers.close()

    run(scenario())
    assert "unreachable" in caplog.text
    assert PASSWORD not in caplog.text


# -- RabbitMQ -----------------------------------------------------------------------


@pytest.mark.brokers("rabbitmq")
@pytest.mark.parametrize(
    ("body", "payload", "content_type"),
    [
        (b"\x00raw", b"\x00raw", "application/octet-stream"),
        ("héllo", "héllo".encode(), "text/plain; charset=utf-8"),
        ({"a": [1, "b"]}, b'{"a":[1,"b"]}', "application/json"),
    ],
)
def test_amqp_publishes_to_the_default_exchange(
    body: Any, payload: bytes, content_type: str
) -> None:
    async def scenario() -> None:
        async with rabbit_queue() as queue, started(Brokers({"mq": AMQP_URL})) as brokers:
            sent = delivery(amqp_target(queue.name), body, task_id="t-42", attempt=2)
            await brokers.sender("mq").send(sent)
            got = await queue.get(timeout=5, no_ack=True)
            assert got is not None
            assert got.body == payload
            assert got.content_type == content_type
            assert got.message_id == "t-42"
            assert got.headers == {
                "delaywheel-topic": "emails",
                "delaywheel-attempt": 2,
                "delaywheel-epoch": 0,
            }
            assert got.delivery_mode == aio_pika.DeliveryMode.PERSISTENT

    run(scenario())


@pytest.mark.brokers("rabbitmq")
def test_amqp_publishes_to_a_named_exchange() -> None:
    exchange = unique("x")

    async def scenario() -> None:
        async with (
            rabbit_queue(exchange, "bound-key") as queue,
            started(Brokers({"mq": AMQP_URL})) as brokers,
        ):
            await brokers.sender("mq").send(delivery(amqp_target("bound-key", exchange)))
            got = await queue.get(timeout=5, no_ack=True)
            assert got is not None
            assert got.message_id == "task-1"
            assert got.routing_key == "bound-key"
            assert got.exchange == exchange

    run(scenario())


@pytest.mark.brokers("rabbitmq")
def test_amqp_unroutable_is_a_failed_attempt() -> None:
    async def scenario() -> None:
        async with started(Brokers({"mq": AMQP_URL})) as brokers:
            with pytest.raises(DeliveryFailed, match="no queue is bound to routing key"):
                await brokers.sender("mq").send(delivery(amqp_target(unique("nobody"))))

    run(scenario())


@pytest.mark.brokers("rabbitmq")
def test_amqp_a_missing_exchange_fails_only_the_pushes_aimed_at_it() -> None:
    """100 pushes in flight beside one to a missing exchange are all delivered: the
    exchange is looked up on a channel of its own, which its 404 closes instead of
    the publishing one. It is looked up again each time, so once declared it works."""
    missing = unique("missing")
    bad = delivery(amqp_target("rk", missing), task_id="bad")

    async def scenario() -> None:
        async with rabbit_queue() as queue, started(Brokers({"mq": AMQP_URL})) as brokers:
            sender = brokers.sender("mq")
            goods = [delivery(amqp_target(queue.name), task_id=f"good-{n}") for n in range(100)]
            for _ in range(2):
                results = await asyncio.gather(
                    *(sender.send(sent) for sent in goods[:50]),
                    sender.send(bad),
                    *(sender.send(sent) for sent in goods[50:]),
                    return_exceptions=True,
                )
                failure = results.pop(50)
                assert results == [None] * 100
                assert isinstance(failure, DeliveryFailed)
                assert str(failure) == (
                    f"amqp broker 'mq': exchange {missing!r} does not exist (ChannelNotFoundEntity:"
                    f" NOT_FOUND - no exchange {missing!r} in vhost '/')"
                )
            async with await aio_pika.connect(AMQP_URL) as connection:
                channel = await connection.channel()
                await queue.bind(await channel.declare_exchange(missing), "rk")
                try:
                    await sender.send(bad)
                finally:
                    await channel.exchange_delete(missing)
            arrived = await take_all(queue)
            assert sorted(arrived) == sorted([sent.task_id for sent in goods] * 2 + ["bad"])
            assert brokers.state()["mq"]["connected"] is True

    run(scenario())


@pytest.mark.brokers("rabbitmq")
def test_amqp_a_publishing_channel_closed_anyway_is_blamed_and_reopened() -> None:
    """An exchange deleted after it was looked up still closes the publishing channel
    (404). The pushes that fails say that the channel closed, not that their own
    exchange is missing; the channel comes back, and the exchange is looked up again."""
    exchange = unique("x")
    doomed = delivery(amqp_target("rk", exchange), task_id="doomed")

    async def scenario() -> None:
        async with (
            rabbit_queue() as queue,
            started(Brokers({"mq": AMQP_URL})) as brokers,
            await aio_pika.connect(AMQP_URL) as connection,
        ):
            channel = await connection.channel()
            await channel.declare_exchange(exchange)
            sender = brokers.sender("mq")
            with pytest.raises(DeliveryFailed, match="no queue is bound"):
                await sender.send(doomed)  # the exchange is found, and remembered
            await channel.exchange_delete(exchange)
            goods = [delivery(amqp_target(queue.name), task_id=f"good-{n}") for n in range(20)]
            failure, *results = await asyncio.gather(
                sender.send(doomed), *(sender.send(sent) for sent in goods), return_exceptions=True
            )
            assert isinstance(failure, DeliveryFailed)
            assert str(failure) == (
                "amqp broker 'mq': the broker closed the channel: ChannelNotFoundEntity:"
                f" NOT_FOUND - no exchange {exchange!r} in vhost '/'"
            )
            for result in results:  # sent before the close (delivered) or failed by it
                assert result is None or (
                    isinstance(result, DeliveryFailed)
                    and "closed" in str(result)
                    and "does not exist" not in str(result)
                    and "default exchange" not in str(result)
                ), result
            # aiormq may publish once more on the closed channel, and RabbitMQ then
            # closes the whole connection (504): it is back after a reconnect.
            await eventually_sent(sender, delivery(amqp_target(queue.name), task_id="after"))
            with pytest.raises(DeliveryFailed, match=f"exchange {exchange!r} does not exist"):
                await sender.send(doomed)
            arrived = await take_all(queue)
            delivered = [
                sent.task_id for sent, got in zip(goods, results, strict=True) if got is None
            ]
            assert set(delivered) | {"after"} <= set(arrived)

    run(scenario())


async def take_all(queue: aio_pika.abc.AbstractQueue) -> list[str]:
    """The message ids in ``queue``, every message taken (a confirmed one is there)."""
    taken = []
    while (got := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
        taken.append(str(got.message_id))
    return taken


async def eventually_sent(sender: Sender, sent: Delivery, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await sender.send(sent)
            return
        except DeliveryFailed:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


def run_leaving_the_rest(work: Awaitable[T]) -> T:
    """``run``, except that whatever is still running at the end dies with the loop:
    ``asyncio.run`` would wait for it, and a task that never ends would make the
    test hang instead of failing."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(work, TEST_TIMEOUT_S))
    finally:
        loop.close()


async def close_while_connecting(url: str, after_s: float) -> None:
    before = asyncio.all_tasks()
    brokers = Brokers({"mq": url}, connect_timeout_s=10.0)
    await brokers.start()
    await asyncio.sleep(after_s)
    began = time.monotonic()
    await brokers.close()
    assert time.monotonic() - began < 5.0  # it did not wait out the connect timeout
    left = asyncio.all_tasks() - before
    if left:  # a closed connection's own tasks may take a moment to end
        _done, running = await asyncio.wait(left, timeout=3.0)
        assert not running, f"still running {after_s:g} s after start, once closed: {running}"


@pytest.mark.parametrize(
    "how",
    ["unresponsive", "refused", pytest.param("answering", marks=pytest.mark.brokers("rabbitmq"))],
)
def test_amqp_close_while_connecting_stops_the_connecting(how: str) -> None:
    """A connection being made is closed too, and nothing of aio-pika's is left
    running: a task left (its reconnect loop, which swallows cancellation until its
    connection is closed) would keep the server's loop from ever ending."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel takes the connection, and nothing answers
        port = {"unresponsive": listener.getsockname()[1], "refused": free_port()}.get(how, 5672)
        # Half a second in, the first connection is under way (unresponsive) or being
        # tried again (refused). RabbitMQ connects within milliseconds: close at many
        # points of those.
        delays_s = [n * 0.002 for n in range(20)] if how == "answering" else [0.5]
        for after_s in delays_s:
            run_leaving_the_rest(
                close_while_connecting(f"amqp://guest:guest@127.0.0.1:{port}/", after_s)
            )


@pytest.mark.brokers("rabbitmq")
def test_amqp_close_between_handshake_and_hold_leaves_no_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aio-pika awaits an aiormq connection's readiness after its handshake, and a
    close landing there (one loop iteration wide, met once in a CI run) left the
    connection open with nothing holding it. The wait is made 50 ms long here so
    that every close lands in it; the sender's own sockets are shut at close."""
    ready = aiormq.connection.Connection.ready

    async def slow_ready(connection: aiormq.connection.Connection) -> None:
        await asyncio.sleep(0.05)
        await ready(connection)

    monkeypatch.setattr(aiormq.connection.Connection, "ready", slow_ready)
    # RabbitMQ answers the handshake within a few milliseconds of the start.
    for after_s in [0.010 + n * 0.004 for n in range(8)]:
        run_leaving_the_rest(close_while_connecting(AMQP_URL, after_s))


# -- NATS JetStream ------------------------------------------------------------------


@pytest.mark.brokers("nats")
def test_nats_publishes_to_jetstream_once_per_task() -> None:
    async def scenario() -> None:
        async with (
            jetstream_stream() as (js, stream, prefix),
            started(Brokers({"bus": NATS_URL})) as brokers,
        ):
            sender = brokers.sender("bus")
            await sender.send(delivery(nats_target(f"{prefix}.mail"), "hi", task_id="t-7"))
            # A second push of the same task (after a crash, say) is dropped.
            await sender.send(delivery(nats_target(f"{prefix}.mail"), "hi", task_id="t-7"))
            stored = await js.get_msg(stream, 1)
            assert stored.data == b"hi"
            assert stored.headers == {
                "Content-Type": "text/plain; charset=utf-8",
                "Delaywheel-Topic": "emails",
                "Delaywheel-Attempt": "1",
                "Delaywheel-Epoch": "0",
                "Nats-Msg-Id": "t-7",
            }
            assert (await js.stream_info(stream)).state.messages == 1

    run(scenario())


@pytest.mark.brokers("nats")
def test_nats_ids_differing_in_edge_spaces_are_not_duplicates() -> None:
    ids = ["t-8", " t-8", "t-8\r\n", "50%"]

    async def scenario() -> None:
        async with (
            jetstream_stream() as (js, stream, prefix),
            started(Brokers({"bus": NATS_URL})) as brokers,
        ):
            for task_id in ids:
                await brokers.sender("bus").send(
                    delivery(nats_target(f"{prefix}.x"), {"k": 1}, task_id=task_id)
                )
            assert (await js.stream_info(stream)).state.messages == len(ids)
            for seq, task_id in enumerate(ids, start=1):
                stored = await js.get_msg(stream, seq)
                assert stored.headers is not None
                assert unquote(stored.headers["Nats-Msg-Id"]) == task_id
                assert stored.headers["Content-Type"] == "application/json"

    run(scenario())


@pytest.mark.brokers("nats")
def test_nats_subject_without_a_stream_is_a_failed_attempt() -> None:
    async def scenario() -> None:
        async with started(Brokers({"bus": NATS_URL})) as brokers:
            subject = unique("nostream")
            with pytest.raises(
                DeliveryFailed, match=f"no JetStream stream takes subject '{subject}'"
            ):
                await brokers.sender("bus").send(delivery(nats_target(subject)))
            assert brokers.state()["bus"]["connected"] is True

    run(scenario())


# -- a connection that is cut and comes back ----------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:port to a broker; ``cut`` drops every connection and
    refuses new ones until ``resume``, as a broker restart or a network cut does."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def resume(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("amqp", marks=pytest.mark.brokers("rabbitmq")),
        pytest.param("nats", marks=pytest.mark.brokers("nats")),
    ],
)
def test_a_cut_connection_is_noticed_and_restored(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delaywheel.delivery.brokers")

    async def scenario() -> None:
        proxy = TcpProxy(5672 if kind == "amqp" else 4222)
        await proxy.resume()
        url = (
            f"amqp://guest:guest@127.0.0.1:{proxy.port}/"
            if kind == "amqp"
            else (f"nats://127.0.0.1:{proxy.port}")
        )
        async with AsyncExitStack() as stack:
            if kind == "amqp":
                queue = await stack.enter_async_context(rabbit_queue())
                target = {"type": "amqp", "broker": "b", "exchange": "", "routing_key": queue.name}
            else:
                _js, _stream, prefix = await stack.enter_async_context(jetstream_stream())
                target = {"type": "nats", "broker": "b", "subject": f"{prefix}.x"}
            brokers = await stack.enter_async_context(started(Brokers({"b": url})))
            sender = brokers.sender("b")
            await sender.send(delivery(target, task_id="before"))
            await proxy.cut()
            await eventually(lambda: not brokers.state()["b"]["connected"])
            with pytest.raises(DeliveryFailed, match="broker 'b'"):
                await sender.send(delivery(target, task_id="during"))
            assert brokers.state()["b"]["failing_since"] is not None
            await proxy.resume()
            await eventually(lambda: brokers.state()["b"]["connected"])
            await sender.send(delivery(target, task_id="after"))
            assert brokers.state()["b"]["failing_since"] is None
        await proxy.cut()

    run(scenario())
    assert "unreachable" in caplog.text
    assert "is back after" in caplog.text


def test_redis_user_that_may_only_push(redis_server: RedisServer, redis_url: str) -> None:
    user = unique("pusher")
    with redis_server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", user, "on", f">{PASSWORD}", "~*", "+lpush", "+xadd", "+select"
        )
    url = redis_url.replace("redis://", f"redis://{user}:{PASSWORD}@")
    targets = [
        {"type": "redis", "key": "jobs", "mode": "list", "broker": "r"},
        {"type": "redis", "key": "events", "mode": "stream", "broker": "r"},
    ]

    async def scenario() -> None:
        async with started(Brokers({"r": url})) as brokers:
            for target in targets:
                await brokers.sender("r").send(delivery(target))
            state = brokers.state()["r"]
            assert state["connected"] is True
            assert PASSWORD not in repr(state)

    try:
        run(scenario())
    finally:
        with redis_server.client() as admin:
            admin.execute_command("ACL", "DELUSER", user)
    with redis.Redis.from_url(redis_url) as client:
        assert client.llen("jobs") == 1
        assert client.xlen("events") == 1
